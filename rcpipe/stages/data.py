"""Data stages: synthetic SQuAD and preparation into Parquet."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from rcpipe.config import Config
from rcpipe.errors import InputError
from rcpipe.stages.io import write_json

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------ synth


def synth(cfg: Config) -> dict[str, Path]:
    """Write the synthetic train and dev files that data.train_file / data.dev_file name."""
    from rcpipe.data import synth as gen

    s = cfg.synth
    out = {}
    splits = (
        ("train", cfg.data.train_file, s.seed, s.train_articles),
        ("dev", cfg.data.dev_file, s.seed + 1_000_003, s.dev_articles),
    )
    for split, uri, _, _ in splits:  # both checked before either file is written
        if "://" in uri:
            raise InputError("params", f"data.{split}_file", "synth writes local files only")
    for split, uri, seed, articles in splits:
        doc = gen.generate(seed, articles, s.paragraphs_per_article, s.questions_per_paragraph,
                           version=s.version, unanswerable_fraction=s.unanswerable_fraction,
                           title_prefix=f"synth-{split}",
                           facts_per_paragraph=s.facts_per_paragraph)
        gen.write(doc, Path(uri))
        n = sum(len(p["qas"]) for a in doc["data"] for p in a["paragraphs"])
        log.info(f"synth: {split}: {n} questions (SQuAD v{s.version}) -> {uri}")
        out[split] = Path(uri)
    return out


# ---------------------------------------------------------------------------------- prepare


def fingerprint(cfg: Config) -> str:
    """What prepare's output depends on: the data params and the input files' identity.

    Local inputs count by size and modification time, remote ones by URI (the cache holds
    one version per URI), so an unchanged input is recognised without reading it.
    """
    inputs = []
    for uri in (cfg.data.train_file, cfg.data.dev_file, cfg.data.word_vectors):
        path = Path(uri) if uri and "://" not in uri else None
        if path is not None and path.is_file():
            stat = path.stat()
            inputs.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns])
        else:
            inputs.append(uri)
    # without vectors data.missing_vectors changes nothing: data prepared before it existed
    # stays current
    unused = set() if cfg.data.word_vectors else {"missing_vectors"}
    data = cfg.data.model_dump(mode="json", exclude={"workers", "cache_dir", *unused})
    blob = json.dumps({"data": data, "inputs": inputs}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def prepared_is_current(cfg: Config) -> bool:
    """Whether data.out_dir holds prepare's output for exactly these params and inputs."""
    meta = cfg.data.out_dir / "meta.json"
    try:
        return json.loads(meta.read_text()).get("fingerprint") == fingerprint(cfg) and \
            (cfg.data.out_dir / "report.json").is_file()
    except (OSError, ValueError):
        return False


def prepare(cfg: Config) -> dict[str, Any]:
    """SQuAD JSON -> Parquet splits, vocab.json, word_emb.npy (with vectors), report.json."""
    from rcpipe.data import features as F
    from rcpipe.data.tokenize import tokenize

    d = cfg.data
    t0 = time.perf_counter()
    phases: dict[str, float] = {}  # seconds per phase, kept in meta.json

    def done(phase: str) -> None:
        phases[phase] = round(time.perf_counter() - t0 - sum(phases.values()), 3)

    train, dev = _read_splits(cfg)
    texts = (train.contexts + [q.question for q in train.questions]
             + dev.contexts + [q.question for q in dev.questions])
    done("read")
    log.info(f"prepare: tokenizing {len(train.questions)} train and {len(dev.questions)} dev "
             f"questions ({len(train.contexts) + len(dev.contexts)} passages) on "
             f"{d.workers} process(es)")
    toks = tokenize(texts, workers=d.workers)
    done("tokenize")
    a, b, c = len(train.contexts), len(train.contexts) + len(train.questions), \
        len(train.contexts) + len(train.questions) + len(dev.contexts)
    train_ctx, train_q, dev_ctx, dev_q = toks[:a], toks[a:b], toks[b:c], toks[c:]

    kept, dropped = F.label_train(train, train_ctx, train_q, cfg.data)
    dev_rows = F.label_dev(dev, dev_ctx, cfg.data)
    words, chars, emb, hits, trained = _vocabularies(cfg, (train, train_ctx, train_q),
                                                     (dev, dev_ctx, dev_q))
    done("label_and_vocab")
    indexer = F.Indexer(words, chars, d.limits.char)
    tables = {
        "train": F.build_table(train, train_ctx, train_q, kept, indexer),
        "dev": F.build_table(dev, dev_ctx, dev_q, dev_rows, indexer),
    }
    done("features")
    _write_prepared(d.out_dir, tables, words, chars, emb)
    report = {
        "train": {"questions": len(train.questions), "kept": len(kept),
                  "dropped": dict(sorted(dropped.items()))},
        "dev": {"questions": len(dev.questions), "kept": len(dev_rows), "dropped": {}},
    }
    write_json(d.out_dir / "report.json", report)
    done("write")
    seconds = time.perf_counter() - t0
    write_json(d.out_dir / "meta.json", {
        "train_file": d.train_file, "dev_file": d.dev_file,
        "version": {"train": train.version, "dev": dev.version}, "words": len(words),
        "chars": len(chars), "char_limit": d.limits.char, "word_vectors": d.word_vectors,
        "word_dim": d.word_dim, "vectors_found": hits,
        # with vectors: what training words they lack became, and how many of those have
        # a trainable row (ids 2 .. 1 + trained_words; eval.trained.prepared_inputs reads it)
        "missing_vectors": d.missing_vectors if d.word_vectors else None,
        "trained_words": trained, "seconds": round(seconds, 2),
        "phases": phases, "fingerprint": fingerprint(cfg)})
    tr, dv = report["train"], report["dev"]
    log.info(
        f"prepare: train {tr['kept']}/{tr['questions']} kept "
        f"({sum(dropped.values())} dropped: {dict(dropped) or 'none'}), "
        f"dev {dv['kept']}/{dv['questions']}; vocab {len(words)} words, {len(chars)} "
        f"chars; {seconds:.1f}s -> {d.out_dir}"
    )
    return report


_MISSING = {"unk": "out of vocabulary, the trainable OOV vector stands for them",
            "train": "a trainable row each", "fixed": "a frozen random row each"}


def _vocabularies(cfg: Config, train: tuple, dev: tuple) -> tuple:  # (file, contexts, qs)
    """(words, chars, word vectors or None, words found in them, words trained alone): the
    training split's words and chars, plus any dev word the pretrained vectors know (it
    gets its vector); a training word they lack as data.missing_vectors says."""
    from rcpipe.data import features as F
    from rcpipe.data.squad import fetch
    from rcpipe.data.vocab import (
        build_vocab,
        build_word_vocab,
        case_forms,
        embedding_matrix,
        read_vectors,
    )

    d = cfg.data
    word_counts, char_counts = F.count_words(*train)
    vectored: set[str] | None = None
    if d.word_vectors:
        log.info(f"prepare: reading word vectors {d.word_vectors}")
        dev_words, _ = F.count_words(*dev)
        candidates = set(word_counts) | set(dev_words)
        wanted = {f for w in candidates for f in case_forms(w)}
        vectors = read_vectors(fetch(d.word_vectors, d.cache_dir), wanted, d.word_dim,
                               d.word_vectors)
        vectored = {w for w in candidates if any(f in vectors for f in case_forms(w))}
    words, trained = build_word_vocab(word_counts, d.min_word_count, vectored,
                                      d.missing_vectors)
    chars = build_vocab(char_counts, d.min_char_count)
    if vectored is None:
        return words, chars, None, 0, 0
    lacking = sum(1 for w in word_counts if w not in vectored)
    log.info(f"prepare: {lacking} of {len(word_counts)} training words have no vector: "
             f"{_MISSING[d.missing_vectors]} (data.missing_vectors={d.missing_vectors})")
    # a trained word's row here is its trainable row's start (layers.WordEmbedding)
    emb, hits = embedding_matrix(words, vectors, d.word_dim)
    return words, chars, emb, hits, trained


def _write_prepared(out: Path, tables: dict[str, Any], words: Any, chars: Any,
                    emb: Any) -> None:
    """The splits as Parquet, vocab.json and (with pretrained vectors) word_emb.npy."""
    import numpy as np
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    for split, table in tables.items():
        pq.write_table(table, out / f"{split}.parquet", compression="zstd")
    write_json(out / "vocab.json", {"words": words.items, "chars": chars.items})
    if emb is not None:
        np.save(out / "word_emb.npy", emb)


def _read_splits(cfg: Config) -> tuple[Any, Any]:
    """The training and dev SquadFiles, validated; shared question ids are warned of."""
    from rcpipe.data.squad import load_squad

    train = load_squad(cfg.data.train_file, cfg.data.cache_dir)
    dev = load_squad(cfg.data.dev_file, cfg.data.cache_dir)
    overlap = {q.qid for q in train.questions} & {q.qid for q in dev.questions}
    if overlap:  # legitimate when measuring on a split of one file; worth a warning
        log.warning(f"{len(overlap)} dev question ids are also in the training file")
    return train, dev

