"""Benchmark companion: two bench/accuracy.py runs (default and tuned) question by question.

A test F1 over ~2,000 questions moves by about a point from chance alone, so "tuned beats
default by 0.4" says nothing until the spread is known. For each variant both runs trained
(``--tag A`` and ``--tag B`` of bench/accuracy.py, same preset, split and out folder), both
best models answer the test articles again (each at its no-answer threshold chosen on the
held-out slice, as the bench scored them), and rcpipe.eval.compare gives B's F1 minus A's
with a 95% interval from a bootstrap over the test paragraphs; the ensembles of each run too.
Nothing is chosen here: it only reads the two runs. Writes
``OUT/accuracy-paired-A-B.json`` and prints a line per variant.

    .venv/bin/python bench/paired.py --preset cpu --versions 1.1 --out OUT s3default s3tuned
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from accuracy import PRESETS, ROOT, SPLIT, best_answers, voted


def compare(a: Path, b: Path, params: Path, prepared: Path, test: Path) -> dict[str, Any]:
    """{variant (and "ensemble"): the paired difference B - A} for the variants both ran."""
    from dataclasses import asdict

    from rcpipe.eval.compare import paired_difference

    variants = sorted(v.parent.name for v in a.glob("*/model.pt")
                      if (b / v.parent.name / "model.pt").is_file())
    if not variants:
        raise SystemExit(f"error: {a} and {b}: no variant trained in both")
    answers_a, doc = best_answers(variants, a, params, prepared, test)
    answers_b, _ = best_answers(variants, b, params, prepared, test)
    pairs = {v: (answers_a[v].predictions, answers_b[v].predictions) for v in variants}
    if len(variants) > 1:
        pairs["ensemble"] = (voted(answers_a), voted(answers_b))
    found = {name: paired_difference(doc, pa, pb) for name, (pa, pb) in pairs.items()}
    return {name: asdict(d) | {"line": d.line()} for name, d in found.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="the first run's --tag (the baseline, e.g. the default)")
    ap.add_argument("b", help="the second run's --tag (e.g. tuned)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="paper")
    ap.add_argument("--versions", nargs="*", default=["1.1", "2.0"])
    ap.add_argument("--split", type=Path, default=SPLIT)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = ap.parse_args()
    work = args.out / "accuracy" / args.preset
    result: dict[str, Any] = {"a": args.a, "b": args.b, "preset": args.preset,
                              "interval": "95%, bootstrap over test paragraphs (2000 draws)",
                              "versions": {}}
    for version in args.versions:
        runs = work / f"v{version}"
        found = compare(runs / args.a, runs / args.b, PRESETS[args.preset],
                        runs / "prepared", args.split / f"test-v{version}.json")
        result["versions"][version] = found
        for name, d in found.items():
            print(f"v{version} {name:<15} {args.a} -> {args.b}: {d['line']}", flush=True)
    path = args.out / f"accuracy-paired-{args.a}-{args.b}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
