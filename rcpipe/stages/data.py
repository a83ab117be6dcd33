"""Data stages: synthetic SQuAD and preparation into Parquet."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcpipe.config import Config
from rcpipe.data.prepared import Prepared
from rcpipe.errors import InputError
from rcpipe.fingerprints import Fingerprint, of_stage
from rcpipe.locks import hold
from rcpipe.outputs import OutputSet, output_set

log = logging.getLogger(__name__)

# report.json's train "windows": questions whose context was over data.limits.para, the
# rows their windows gave (of which no_answer: v2.0's windows without the answer) and the
# windows left out (part of the answer; v1.1: none of it)
WINDOW_COUNTS = ("questions", "rows", "no_answer", "left_out")

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


def prepared_changes(cfg: Config) -> str | None:
    """What differs between data.out_dir's prepared data and what preparing cfg's would make
    (its key, its row's `fingerprints.of_stage`, kept in meta.json), in one phrase; None: it is
    current."""
    out = Prepared.of(cfg)
    try:
        meta = out.meta()  # within cfg.limits, as every reader of it
    except (OSError, InputError):  # none, or not JSON: prepared anew
        return "nothing prepared"
    kept = meta.get("fingerprint") if isinstance(meta, dict) else None
    if not isinstance(kept, dict) or not out.report.is_file():
        return "nothing prepared with a key"
    return of_stage(cfg, "prepare").changes(Fingerprint.from_dict(kept))


def prepare(cfg: Config, wait: bool = False) -> dict[str, Any]:
    """SQuAD JSON -> Parquet splits, vocab.json, word_emb.npy (with vectors), report.json:
    one run at a time per data.out_dir (``wait``: for the one running), its files in place
    together or not at all."""
    out = cfg.data.out_dir
    with hold(out, f"{out} is being prepared", wait), output_set("prepare", [out]) as files:
        return _prepare(cfg, files)


def _prepare(cfg: Config, files: OutputSet) -> dict[str, Any]:
    from rcpipe.data import features as F
    from rcpipe.data.tokenize import tokenize

    d = cfg.data
    t0 = time.perf_counter()
    phases: dict[str, float] = {}  # seconds per phase, kept in meta.json

    def done(phase: str) -> None:
        phases[phase] = round(time.perf_counter() - t0 - sum(phases.values()), 3)

    train, dev, held = _read_splits(cfg)
    splits = {"train": train, "dev": dev, "heldout": held.file}
    texts = [t for sq in splits.values()
             for t in (*sq.contexts, *(q.question for q in sq.questions))]
    done("read")
    log.info(f"prepare: tokenizing {len(train.questions)} train, {len(dev.questions)} dev "
             f"and {len(held.file.questions)} held-out questions "
             f"({len(texts) - sum(len(sq.questions) for sq in splits.values())} passages) "
             f"on {d.workers} process(es)")
    toks = tokenize(texts, workers=d.workers)
    done("tokenize")
    split_toks = {}
    for name, sq in splits.items():  # (contexts, questions) of each split, in order
        n, m = len(sq.contexts), len(sq.questions)
        split_toks[name], toks = (toks[:n], toks[n:n + m]), toks[n + m:]
    (train_ctx, train_q), (dev_ctx, dev_q), (held_ctx, held_q) = split_toks.values()

    kept, dropped, windows = F.label_train(train, train_ctx, train_q, cfg.data)
    if not kept:  # nothing to train on is the user's to know now, not a model of nothing later
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(dropped.items()))
        raise InputError(d.train_file, "", f"no usable training question ({len(train.questions)}"
                         f" read{': ' + why if why else ''}); nothing was written")
    dev_rows = F.label_dev(dev, dev_ctx, cfg.data)
    held_rows = F.label_dev(held.file, held_ctx, cfg.data)  # like dev: every question
    words, chars, emb, hits, trained = _vocabularies(cfg, (train, train_ctx, train_q),
                                                     (dev, dev_ctx, dev_q),
                                                     (held.file, held_ctx, held_q))
    done("label_and_vocab")
    indexer = F.Indexer(words, chars, d.limits.char)
    tables = {
        "train": F.build_table(train, train_ctx, train_q, kept, indexer),
        "dev": F.build_table(dev, dev_ctx, dev_q, dev_rows, indexer),
    }
    if held.source is not None:
        tables["heldout"] = F.build_table(held.file, held_ctx, held_q, held_rows, indexer)
    done("features")
    out = Prepared(d.out_dir)
    splits_written = _write_prepared(files, out, tables, words, chars, emb, d.shards)
    if held.source is not None:  # heldout.json beside heldout.parquet, or neither
        files.write_json(out.heldout_doc, held.doc)
    report = _report(train, dev, held, kept, dropped, windows, len(dev_rows))
    files.write_json(out.report, report)
    done("write")
    seconds = time.perf_counter() - t0
    files.write_json(out.meta_file, {
        "train_file": d.train_file, "dev_file": d.dev_file,
        "version": {"train": train.version, "dev": dev.version}, "words": len(words),
        "chars": len(chars), "char_limit": d.limits.char, "word_vectors": d.word_vectors,
        "word_dim": d.word_dim, "vectors_found": hits,
        # with vectors: what training words they lack became, and how many of those have
        # a trainable row (ids 2 .. 1 + trained_words; trained/model_file.py's prepared_inputs)
        "missing_vectors": d.missing_vectors if d.word_vectors else None,
        "trained_words": trained, "heldout": held.record(),
        "seconds": round(seconds, 2),
        "phases": phases, "fingerprint": of_stage(cfg, "prepare").as_dict(),
        "layout": Prepared.LAYOUT, "splits": splits_written})
    # every file prepare writes is one set (rcpipe/outputs.py): an earlier run's file this one
    # did not write (no vectors: word_emb.npy; nothing held out: heldout/*; fewer parts; an
    # older layout's train.parquet) goes at the commit
    for path in out.files():
        files.remove(path)
    for split in Prepared.SPLITS:  # a split not written this time: its folder goes whole
        if split not in splits_written:
            files.remove(out.split(split))
    tr, dv = report["train"], report["dev"]
    read_as = f", {windows['questions']} read as {windows['rows']} windows" \
        if windows["questions"] else ""
    log.info(
        f"prepare: train {tr['kept']}/{tr['questions']} kept{read_as} "
        f"({sum(dropped.values())} dropped: {dict(dropped) or 'none'}), "
        f"dev {dv['kept']}/{dv['questions']}; {held.described()}; vocab {len(words)} "
        f"words, {len(chars)} chars; {seconds:.1f}s -> {d.out_dir}"
    )
    return report


def _report(train: Any, dev: Any, held: Any, kept: list[Any], dropped: dict[str, int],
            windows: dict[str, int], dev_kept: int) -> dict[str, Any]:
    """report.json: each split's questions read, kept and dropped (with why), so
    ``questions == kept + sum(dropped)`` holds for every split."""
    report = {
        # kept counts questions; rows the Parquet's rows (a long context: a row a window)
        "train": {"questions": len(train.questions), "kept": len({r.index for r in kept}),
                  "dropped": dict(sorted(dropped.items())), "rows": len(kept),
                  "windows": {k: windows[k] for k in WINDOW_COUNTS}},
        "dev": {"questions": len(dev.questions), "kept": dev_kept, "dropped": {}},
    }
    if held.source is not None:  # like dev, never dropped; meta.json says where from
        n = len(held.file.questions)
        report["heldout"] = {"questions": n, "kept": n, "dropped": {}}
    return report


_MISSING = {"unk": "out of vocabulary, the trainable OOV vector stands for them",
            "train": "a trainable row each", "fixed": "a frozen random row each"}


def _vocabularies(cfg: Config, train: tuple, *others: tuple) -> tuple:  # (file, ctx, qs)
    """(words, chars, word vectors or None, words found in them, words trained alone): the
    training split's words and chars, plus any dev or held-out word the pretrained vectors
    know (it gets its vector); a training word they lack as data.missing_vectors says."""
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
        candidates = set(word_counts).union(*(F.count_words(*o)[0] for o in others))
        wanted = {f for w in candidates for f in case_forms(w)}
        vectors = read_vectors(fetch(d.word_vectors, d.cache_dir, limits=cfg.limits), wanted,
                               d.word_dim, d.word_vectors, cfg.limits.vectors_bytes())
        vectored = {w for w in candidates if any(f in vectors for f in case_forms(w))}
    words, trained = build_word_vocab(word_counts, d.min_word_count, vectored,
                                      d.missing_vectors)
    chars = build_vocab(char_counts, d.min_char_count)
    if vectored is None:
        return words, chars, None, 0, 0
    lacking = sum(1 for w in word_counts if w not in vectored)
    log.info(f"prepare: {lacking} of {len(word_counts)} training words have no vector: "
             f"{_MISSING[d.missing_vectors]} (data.missing_vectors={d.missing_vectors})")
    # a trained word's row here is its trainable row's start (embeddings.WordEmbedding)
    emb, hits = embedding_matrix(words, vectors, d.word_dim)
    return words, chars, emb, hits, trained


def _write_prepared(files: OutputSet, out: Prepared, tables: dict[str, Any], words: Any,
                    chars: Any, emb: Any, shards: Any) -> dict[str, Any]:
    """The splits as folders of Parquet parts (data/shards.py), vocab.json and (with
    pretrained vectors) word_emb.npy; each split's manifest entry, for meta.json."""
    import hashlib

    import numpy as np

    from rcpipe.data.shards import SplitWriter

    vocab = files.json_bytes({"words": words.items, "chars": chars.items})
    files.write(out.vocab_file, vocab)
    digest = hashlib.sha256(vocab).hexdigest()  # Prepared.vocab_digest of the file
    written = {}
    for split, table in tables.items():
        folder = out.split(split)
        with SplitWriter(lambda name, f=folder: files.path(f / name), shards.file_rows,
                         shards.group_rows, digest) as writer:
            writer.write(table)
            written[split] = writer.close()
    if emb is not None:
        np.save(files.path(out.word_emb), emb)
    return written


@dataclass(frozen=True)
class HeldOut:
    """The questions the no-answer threshold is chosen and checkpoints are ranked on."""

    file: Any  # SquadFile (no questions when nothing is held out)
    doc: dict[str, Any]  # its SQuAD JSON, written as heldout.json for the official scorer
    source: str | None  # "heldout" (a slice of train), "file:<path>" or None
    articles: int

    def record(self) -> dict[str, Any] | None:
        """meta.json's "heldout": where the held-out questions came from, how many."""
        if self.source is None:
            return None
        return {"source": self.source, "articles": self.articles,
                "questions": len(self.file.questions)}

    def described(self) -> str:
        if self.source is None:
            return "nothing held out"
        where = "of train" if self.source == "heldout" else self.source
        return f"held out {self.articles} articles, {len(self.file.questions)} questions " \
               f"({where})"


def _read_splits(cfg: Config) -> tuple[Any, Any, HeldOut]:
    """The training, dev and held-out SquadFiles, validated (the held-out articles are
    taken out of training); question ids shared with dev are warned of."""
    from rcpipe.data.heldout import split_articles
    from rcpipe.data.squad import fetch, load_squad, parse_squad, read_json

    d, h = cfg.data, cfg.data.heldout
    train_doc = read_json(fetch(d.train_file, d.cache_dir, limits=cfg.limits), d.train_file,
                          cfg.limits)
    train = parse_squad(train_doc, d.train_file)  # located errors in the whole file
    dev = load_squad(d.dev_file, d.cache_dir, limits=cfg.limits)
    if h.file:
        held_doc = read_json(fetch(h.file, d.cache_dir, limits=cfg.limits), h.file, cfg.limits)
        held = HeldOut(parse_squad(held_doc, h.file), held_doc, f"file:{h.file}",
                       len(held_doc["data"]))
    else:
        try:
            train_doc, held_doc = split_articles(train_doc, h.fraction, h.seed)
        except ValueError as e:
            raise InputError(cfg.source, "data.heldout.fraction", f"{e} ({d.train_file}); "
                             "set data.heldout.fraction=0 (then eval.na_threshold) or name "
                             "data.heldout.file") from None
        train = parse_squad(train_doc, d.train_file)
        held = HeldOut(parse_squad(held_doc, d.train_file), held_doc,
                       "heldout" if held_doc["data"] else None, len(held_doc["data"]))
    if held.source is not None and not held.file.questions:
        raise InputError(h.file or d.train_file, "", "the held-out articles have no "
                         "questions (data.heldout)")
    for name, other in (("dev", dev), ("held-out", held.file)):
        overlap = {q.qid for q in train.questions} & {q.qid for q in other.questions}
        if overlap:  # legitimate when measuring on a split of one file; worth a warning
            log.warning(f"{len(overlap)} {name} question ids are also in the training file")
    return train, dev, held
