"""The stages of the pipeline: the only place that reads and writes files for a stage.

The CLI, dvc.yaml and the Prefect flows all call these functions, so each stage has one
implementation. Heavy libraries are imported inside the stage that needs them, which keeps
``rcpipe --help`` instant.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rcpipe.config import VARIANTS, Config
from rcpipe.console import console
from rcpipe.errors import InputError


def write_json(path: Path, obj: Any) -> None:
    """Write atomically: a reader never sees half a file, even if the run is killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------ synth


def synth(cfg: Config) -> dict[str, Path]:
    """Write the synthetic train and dev files that data.train_file / data.dev_file name."""
    from rcpipe.data import synth as gen

    s = cfg.synth
    out = {}
    for split, uri, seed, articles in (
        ("train", cfg.data.train_file, s.seed, s.train_articles),
        ("dev", cfg.data.dev_file, s.seed + 1_000_003, s.dev_articles),
    ):
        if "://" in uri:
            raise InputError("params", f"data.{split}_file", "synth writes local files only")
        doc = gen.generate(seed, articles, s.paragraphs_per_article, s.questions_per_paragraph,
                           version=s.version, unanswerable_fraction=s.unanswerable_fraction,
                           title_prefix=f"synth-{split}")
        gen.write(doc, Path(uri))
        n = sum(len(p["qas"]) for a in doc["data"] for p in a["paragraphs"])
        console.print(f"synth: {split}: {n} questions (SQuAD v{s.version}) -> {uri}")
        out[split] = Path(uri)
    return out


# ---------------------------------------------------------------------------------- prepare


def prepare(cfg: Config) -> dict[str, Any]:
    """SQuAD JSON -> Parquet splits, vocab.json, word_emb.npy (with vectors), report.json."""
    import numpy as np
    import pyarrow.parquet as pq

    from rcpipe.data import features as F
    from rcpipe.data.squad import fetch, load_squad
    from rcpipe.data.tokenize import tokenize
    from rcpipe.data.vocab import build_vocab, case_forms, embedding_matrix, read_vectors

    d = cfg.data
    t0 = time.perf_counter()
    train = load_squad(d.train_file, d.cache_dir)
    dev = load_squad(d.dev_file, d.cache_dir)
    overlap = {q.qid for q in train.questions} & {q.qid for q in dev.questions}
    if overlap:  # legitimate when measuring on a split of one file; worth a warning
        console.print(f"[yellow]warning: {len(overlap)} dev question ids are also in the "
                      f"training file[/yellow]")
    texts = (train.contexts + [q.question for q in train.questions]
             + dev.contexts + [q.question for q in dev.questions])
    toks = tokenize(texts, workers=d.workers)
    a, b, c = len(train.contexts), len(train.contexts) + len(train.questions), \
        len(train.contexts) + len(train.questions) + len(dev.contexts)
    train_ctx, train_q, dev_ctx, dev_q = toks[:a], toks[a:b], toks[b:c], toks[c:]

    kept, dropped = F.label_train(train, train_ctx, train_q, cfg.data)
    dev_rows = F.label_dev(dev, dev_ctx, cfg.data)
    word_counts, char_counts = F.count_words(train, train_ctx, train_q)

    extra: set[str] = set()
    emb = None
    hits = 0
    if d.word_vectors:
        console.print(f"prepare: reading word vectors {d.word_vectors}")
        dev_words, _ = F.count_words(dev, dev_ctx, dev_q)
        candidates = set(word_counts) | set(dev_words)
        wanted = {f for w in candidates for f in case_forms(w)}
        vectors = read_vectors(fetch(d.word_vectors, d.cache_dir), wanted, d.word_dim,
                               d.word_vectors)
        extra = {w for w in candidates if any(f in vectors for f in case_forms(w))}
    words = build_vocab(word_counts, d.min_word_count, extra)
    chars = build_vocab(char_counts, d.min_char_count)
    if d.word_vectors:
        emb, hits = embedding_matrix(words, vectors, d.word_dim)

    indexer = F.Indexer(words, chars, d.limits.char)
    tables = {
        "train": F.build_table(train, train_ctx, train_q, kept, indexer),
        "dev": F.build_table(dev, dev_ctx, dev_q, dev_rows, indexer),
    }
    d.out_dir.mkdir(parents=True, exist_ok=True)
    for split, table in tables.items():
        pq.write_table(table, d.out_dir / f"{split}.parquet", compression="zstd")
    write_json(d.out_dir / "vocab.json", {"words": words.items, "chars": chars.items})
    if emb is not None:
        np.save(d.out_dir / "word_emb.npy", emb)
    report = {
        "train": {"questions": len(train.questions), "kept": len(kept),
                  "dropped": dict(sorted(dropped.items()))},
        "dev": {"questions": len(dev.questions), "kept": len(dev_rows), "dropped": {}},
    }
    seconds = time.perf_counter() - t0
    write_json(d.out_dir / "report.json", report)
    write_json(d.out_dir / "meta.json", {
        "train_file": d.train_file, "dev_file": d.dev_file,
        "version": {"train": train.version, "dev": dev.version},
        "words": len(words), "chars": len(chars), "char_limit": d.limits.char,
        "word_vectors": d.word_vectors, "word_dim": d.word_dim, "vectors_found": hits,
        "seconds": round(seconds, 2),
    })
    tr = report["train"]
    console.print(
        f"prepare: train {tr['kept']}/{tr['questions']} kept "
        f"({sum(dropped.values())} dropped: {dict(dropped) or 'none'}), "
        f"dev {len(dev_rows)}/{len(dev.questions)}; vocab {len(words)} words, {len(chars)} "
        f"chars; {seconds:.1f}s -> {d.out_dir}"
    )
    return report


# ------------------------------------------------------------------------------------ score


def _read_mapping(path: Path, value: type | tuple[type, ...], what: str) -> dict[str, Any]:
    from rcpipe.data.squad import read_json

    if not path.is_file():
        raise InputError(path, "", "no such file")
    obj = read_json(path, str(path))
    if not isinstance(obj, dict):
        raise InputError(path, "", "expected a JSON object mapping question ids to answers")
    for k, v in obj.items():
        if not isinstance(v, value) or isinstance(v, bool):
            raise InputError(path, json.dumps([k]), f"expected {what}, got {type(v).__name__}")
    return obj


def load_dataset(uri: str, cache_dir: Path) -> dict[str, Any]:
    """The raw SQuAD JSON for scoring, validated by the same reader as prepare."""
    from rcpipe.data.squad import fetch, parse_squad, read_json

    doc = read_json(fetch(uri, cache_dir), uri)
    parse_squad(doc, uri)
    return doc


def score(dataset: str, predictions: Path, na_prob_file: Path | None = None,
          na_prob_thresh: float = 1.0, cache_dir: Path = Path("data/cache")) -> dict[str, Any]:
    """The official SQuAD script's numbers for a predictions file (v1.1/v2.0 by version)."""
    from rcpipe.eval import metrics

    doc = load_dataset(dataset, cache_dir)
    try:
        metrics.dataset_version(doc)
    except ValueError as e:
        raise InputError(dataset, "version", str(e)) from None
    preds = _read_mapping(predictions, str, "an answer string")
    na_probs = None
    if na_prob_file is not None:
        na_probs = _read_mapping(na_prob_file, (int, float), "a probability")
        missing = next((q for q in preds if q not in na_probs), None)
        if missing is not None:
            raise InputError(na_prob_file, json.dumps([missing]), "no probability for this id")
    try:
        return metrics.score(doc, preds, na_probs, na_prob_thresh)
    except ValueError as e:  # v2.0 predictions answering no question; a v1.1 question
        # without answers or a dataset without questions (the official scripts crash on those)
        culprit = predictions if "predictions" in str(e) else dataset
        raise InputError(culprit, "", str(e)) from None


# --------------------------------------------------------------------------------- ensemble


def ensemble(cfg: Config, inputs: list[Path] | None = None,
             out: Path = Path("predictions/ensemble.json")) -> dict[str, Any]:
    """Majority vote over the variants' nbest files; score it against data.dev_file."""
    from rcpipe.eval import ensemble as vote
    from rcpipe.eval import metrics

    if not inputs:
        inputs = [p for v in VARIANTS if (p := Path("predictions") / f"{v}.nbest.json").is_file()]
        if not inputs:
            raise InputError("predictions/", "", "no <variant>.nbest.json to ensemble; run "
                             "`rcpipe evaluate VARIANT` first or pass --inputs")
    nbests = [_read_nbest(p) for p in inputs]
    voted = vote.majority_vote(nbests)
    write_json(out, vote.predictions_from(voted))
    write_json(out.with_suffix(".nbest.json"), voted)
    doc = load_dataset(cfg.data.dev_file, cfg.data.cache_dir)
    preds = vote.predictions_from(voted)
    na = {q: v["na_prob"] for q, v in voted.items()} if metrics.dataset_version(doc) == "2.0" \
        else None
    try:
        result = metrics.score(doc, preds, na)
    except ValueError as e:  # e.g. v2.0 nbest files whose ids are not the dev file's
        raise InputError(cfg.data.dev_file, "", str(e)) from None
    name = out.name.removesuffix(".json")
    write_json(Path("metrics") / f"{name}.json", result)
    write_json(Path("metrics") / f"{name}.by_type.json", metrics.breakdown(doc, preds, na))
    console.print(f"ensemble of {len(inputs)} models -> {out}: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in result.items() if k in _HEADLINE))
    return result


_HEADLINE = ("exact_match", "exact", "f1")


def _read_nbest(path: Path) -> dict[str, dict[str, Any]]:
    obj = _read_mapping(path, dict, "an object {text, prob, na_prob}")
    for qid, v in obj.items():
        where = json.dumps([qid])
        if not isinstance(v.get("text"), str):
            raise InputError(path, where, "missing string 'text'")
        for key in ("prob", "na_prob"):  # majority_vote reads both: a missing one is an error
            if not isinstance(v.get(key), int | float) or isinstance(v.get(key), bool):
                raise InputError(path, f"{where}.{key}", "expected a number")
    return obj
