"""Benchmark: `rcpipe prepare` against the classic single-process preprocessing.

The baseline does what the classic repositories' prepro scripts do (allenai/bi-att-flow's
squad/prepro.py, HKUST-KnowComp/R-Net's prepro.py): one process, nlp() once per context and
once per question, Python lists of words and characters, counters, span labels, and the
result dumped as JSON. rcpipe's path is stages.prepare with the same limits (nlp.pipe on
every core, Arrow columns, Parquet). Both run side by side in this one process, alternating,
each from a cold output directory; imports are done before the clock starts.

    .venv/bin/python bench/prepare.py [--train FILE] [--dev FILE] [--repeats N]

Defaults: ../shared/data/squad/dev-v1.1.json (10,570 questions) as train, the article
split's test-v1.1.json as dev. Writes bench/out/prepare.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import spacy

from rcpipe import stages
from rcpipe.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def baseline(train_file: Path, dev_file: Path, out_dir: Path) -> int:
    """The classic prepro: returns the number of questions processed."""
    nlp = spacy.blank("en")
    word_counter: Counter[str] = Counter()
    char_counter: Counter[str] = Counter()
    n = 0
    for split, path in (("train", train_file), ("dev", dev_file)):
        source = json.loads(path.read_text())
        examples = []
        for article in source["data"]:
            for para in article["paragraphs"]:
                context = para["context"]
                doc = nlp(context)
                tokens = [t.text for t in doc if not t.is_space]
                spans = [(t.idx, t.idx + len(t.text)) for t in doc if not t.is_space]
                chars = [list(t) for t in tokens]
                for t in tokens:
                    word_counter[t] += len(para["qas"])
                    for c in t:
                        char_counter[c] += len(para["qas"])
                for qa in para["qas"]:
                    q_tokens = [t.text for t in nlp(qa["question"]) if not t.is_space]
                    q_chars = [list(t) for t in q_tokens]
                    for t in q_tokens:
                        word_counter[t] += 1
                        for c in t:
                            char_counter[c] += 1
                    y1s, y2s = [], []
                    for ans in qa["answers"]:
                        start = ans["answer_start"]
                        end = start + len(ans["text"])
                        idx = [i for i, (s, e) in enumerate(spans) if not (end <= s or start >= e)]
                        if idx:
                            y1s.append(idx[0])
                            y2s.append(idx[-1])
                    examples.append({"context_tokens": tokens, "context_chars": chars,
                                     "ques_tokens": q_tokens, "ques_chars": q_chars,
                                     "y1s": y1s, "y2s": y2s, "id": qa["id"]})
                    n += 1
        words = {w: i for i, w in enumerate(["--NULL--", "--OOV--", *word_counter], start=0)}
        charv = {c: i for i, c in enumerate(["--NULL--", "--OOV--", *char_counter], start=0)}
        for ex in examples:
            ex["context_idxs"] = [words.get(w, 1) for w in ex["context_tokens"]]
            ex["ques_idxs"] = [words.get(w, 1) for w in ex["ques_tokens"]]
            ex["context_char_idxs"] = [[charv.get(c, 1) for c in cs[:16]]
                                       for cs in ex["context_chars"]]
            ex["ques_char_idxs"] = [[charv.get(c, 1) for c in cs[:16]] for cs in ex["ques_chars"]]
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{split}.json").write_text(json.dumps(examples))
        (out_dir / f"{split}_meta.json").write_text(json.dumps({"total": len(examples)}))
    (out_dir / "word_dictionary.json").write_text(json.dumps(words))
    (out_dir / "char_dictionary.json").write_text(json.dumps(charv))
    return n


def ours(train_file: Path, dev_file: Path, out_dir: Path, workers: int) -> int:
    cfg = load_config(ROOT / "params.yaml", [
        f"data.train_file={train_file}", f"data.dev_file={dev_file}",
        f"data.out_dir={out_dir}", "data.word_vectors=null", f"data.workers={workers}",
    ])
    report = stages.prepare(cfg)
    return report["train"]["questions"] + report["dev"]["questions"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=Path, default=SHARED / "squad" / "dev-v1.1.json")
    ap.add_argument("--dev", type=Path, default=SHARED / "squad-split" / "test-v1.1.json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[float]] = {"baseline": [], "rcpipe": []}
    questions = {}
    for r in range(args.repeats):
        for name in runs:  # alternate, so drift in machine load hits both alike
            out = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
            t0 = time.perf_counter()
            if name == "baseline":
                questions[name] = baseline(args.train, args.dev, out)
            else:
                questions[name] = ours(args.train, args.dev, out, args.workers)
            runs[name].append(time.perf_counter() - t0)
            shutil.rmtree(out)
            print(f"repeat {r + 1}: {name} {runs[name][-1]:.2f}s", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    result = {
        "train_file": str(args.train), "dev_file": str(args.dev), "questions": questions,
        "seconds": runs, "median_seconds": med, "speedup": med["baseline"] / med["rcpipe"],
        "workers": args.workers,
    }
    out_file = ROOT / "bench" / "out" / "prepare.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{'path':<10} {'median s':>9} {'questions':>10}")
    for k in runs:
        print(f"{k:<10} {med[k]:>9.2f} {questions[k]:>10}")
    print(f"speedup: {result['speedup']:.2f}x  -> {out_file}")


if __name__ == "__main__":
    main()
