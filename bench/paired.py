"""Benchmark companion: two bench/accuracy.py runs (say default and tuned) question by question.

A test F1 over ~2,000 questions moves by about a point from chance alone, so "tuned beats
default by 0.4" says nothing until the spread is known. For each variant both runs trained
(``--tag A`` and ``--tag B``, same preset, split and out folder), both best models answer the
test articles again, as the bench scored them, and rcpipe.scoring.compare gives B's F1 minus
A's with a 95% interval from a bootstrap over the test paragraphs; the ensembles' too. Runs of
several seeds are paired seed by seed (the seed pairs' range is the spread the bootstrap does
not see; the verdict is ``gain`` or ``loss`` only when the interval leaves out 0 and every
seed pair agrees). Nothing is chosen here. Writes ``OUT/accuracy-paired-A-B.json``.

    .venv/bin/python bench/paired.py --preset cpu --versions 1.1 --out OUT s3default s3tuned
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accuracy import PRESETS, best_evaluations, voted
from common import OUT, SPLIT, parser, write


def seed_runs(a: Path, b: Path) -> list[tuple[Path, Path]]:
    """The two runs' folders seed by seed: ``seed-<S>/`` both have, else the runs whole."""
    seeds = sorted(d.name for d in a.glob("seed-*") if (b / d.name).is_dir())
    return [(a / s, b / s) for s in seeds] or [(a, b)]


def compare(a: Path, b: Path, params: Path, prepared: Path, test: Path) -> dict[str, Any]:
    """{variant (and "ensemble"): the paired difference B - A} for the variants both ran."""
    from rcpipe.scoring.compare import seeded_difference

    pairs = seed_runs(a, b)
    variants = sorted(v.parent.name for v in pairs[0][0].glob("*/model.pt")
                      if all((x / v.parent.name / "model.pt").is_file()
                             for pair in pairs for x in pair))
    if not variants:
        raise SystemExit(f"error: {a} and {b}: no variant trained in both")
    sides: dict[str, tuple[list[dict[str, str]], list[dict[str, str]]]] = {
        name: ([], []) for name in [*variants, *(["ensemble"] if len(variants) > 1 else [])]}
    for run_a, run_b in pairs:
        for side, run in enumerate((run_a, run_b)):
            evaluations, dev, _ = best_evaluations(variants, run, params, prepared, test)
            for v in variants:
                sides[v][side].append(evaluations[v][0].predictions)
            if "ensemble" in sides:
                sides["ensemble"][side].append(voted(evaluations))
    found = {name: seeded_difference(dev.doc, pa, pb) for name, (pa, pb) in sides.items()}
    return {name: {"seeds": [p[0].name for p in pairs] if len(pairs) > 1 else [],
                   **d.record(),
                   "line": d.line() if len(pairs) > 1 else d.mean.line()}
            for name, d in found.items()}


def main() -> None:
    ap = parser(__doc__, OUT, sets=False)
    ap.add_argument("a", help="the first run's --tag (the baseline, e.g. the default)")
    ap.add_argument("b", help="the second run's --tag (e.g. tuned)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="paper")
    ap.add_argument("--versions", nargs="*", default=["1.1", "2.0"])
    ap.add_argument("--split", type=Path, default=SPLIT)
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
    write(args.out / f"accuracy-paired-{args.a}-{args.b}.json", result)


if __name__ == "__main__":
    main()
