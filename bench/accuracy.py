"""Benchmark: accuracy on real SQuAD for a training-time budget, every variant and the ensemble.

Trains each variant on the article split of the SQuAD dev sets (`../shared/data/squad-split/`:
train-v1.1.json / test-v1.1.json and the v2.0 pair; any SQuAD files may be given instead)
for ``--minutes`` each, in one plain process per variant (python -m rcpipe.train.local, the
Worker that Ray Train runs), scoring on the test articles every ``--eval-every`` steps.
The test articles tune nothing: checkpoints are ranked, and v2.0's no-answer threshold
chosen, on the held-out slice `rcpipe prepare` takes out of the training articles
(data.heldout), and the test F1 reported is at that threshold. Then the ensembles of the
variants' best models by each of `rcpipe ensemble`'s methods, each with its gain over the
seed's best variant. Writes bench/out/accuracy.json and accuracy.png (test F1 against
training minutes). Quote results as "article split of SQuAD dev", never as SQuAD dev scores.

    .venv/bin/python bench/accuracy.py --preset cpu --minutes 3 --versions 1.1 2.0
    .venv/bin/python bench/accuracy.py --preset paper --minutes 15 --lanes 5   # one GPU

Presets: ``paper`` is params.yaml (the papers' sizes; for a GPU); ``cpu`` a smaller, named
comparison for a 2-core machine: params.demo.yaml's widths, one torch thread per variant, two
variants at a time. ``--tuned DIR`` lays `rcpipe tune`'s ``DIR/<variant>.yaml`` over the
preset: its search ranked trials on the held-out slice, so the test articles choose nothing.
A short run's F1 moves by points with the seed: ``--seeds N`` trains every variant N times
(``train.seed``, + 1, ...; ``--first-seed`` for fresh ones) and gives each figure as mean
[min, max]; bench/paired.py says whether two runs differ beyond chance, question by question.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import OUT, ROOT, SPLIT, parser, set_args, write

PRESETS = {"paper": ROOT / "params.yaml", "cpu": ROOT / "params.demo.yaml"}
VARIANTS = ["bidaf", "bidaf_selfattn", "rnet", "rnet_mult", "qanet"]


def prepare(params: Path, train: Path, test: Path, out: Path, sets: list[str]) -> None:
    """rcpipe prepare of the split (the test file as the dev set), once per version (again
    over data prepared before the held-out slice existed)."""
    meta = out / "meta.json"
    if meta.is_file() and "heldout" in json.loads(meta.read_text()):
        return
    subprocess.run([sys.executable, "-m", "rcpipe", "prepare", "--params", str(params),
                    *set_args([f"data.train_file={train}", f"data.dev_file={test}",
                               f"data.out_dir={out}", "data.word_vectors=null",
                               f"data.cache_dir={out.parent / 'cache'}", *sets])], check=True)


def train(variant: str, params: Path, prepared: Path, train_file: Path, test: Path,
          run_dir: Path, seed: int, minutes: float, eval_every: int, device: str = "cpu",
          threads: int = 1, sets: Sequence[str] = (), layers: Sequence[str] = ()
          ) -> dict[str, Any]:
    """One variant for ``minutes`` in its own process (``layers``: params files laid over
    ``params``); its summary (with the curve)."""
    sets = [f"train.seed={seed}", f"data.train_file={train_file}", f"data.dev_file={test}",
            f"data.out_dir={prepared}", f"data.cache_dir={prepared.parent / 'cache'}",
            "data.word_vectors=null", "train.num_workers=1", "train.epochs=1000",
            # the budget is minutes: params.demo.yaml's fixed steps a variant must not cap it
            f"models.{variant}.max_steps=0", f"train.max_minutes={minutes}",
            f"models.{variant}.max_minutes={minutes}", f"train.eval_every={eval_every}",
            f"train.device={device}", f"train.threads={threads}", *sets]
    log = run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        done = subprocess.run([sys.executable, "-m", "rcpipe.train.local", variant,
                               "--params", str(params), *layers, "--run-dir", str(run_dir),
                               *set_args(sets)], stdout=subprocess.PIPE, stderr=f, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": str(threads or os.cpu_count())})
    if done.returncode != 0:
        raise RuntimeError(f"{variant}: training failed, see {log}")
    print(f"  {variant} (seed {seed}): {done.stdout.strip()}", flush=True)
    return json.loads((run_dir / "summary.json").read_text())


def tuned_layer(tuned: Path | None, variant: str) -> list[str]:
    """``--params DIR/<variant>.yaml`` where `rcpipe tune` wrote one under ``--tuned DIR``."""
    layer = tuned / f"{variant}.yaml" if tuned else None
    return ["--params", str(layer)] if layer and layer.is_file() else []


def best_evaluations(variants: list[str], runs: Path, params: Path, prepared: Path,
                     test: Path, token_probs: bool = False) -> tuple[dict[str, Any], Any, Any]:
    """({variant: (its Evaluation on the test articles, on the held-out slice or None)},
    the test Split, the held-out Split or None): each variant's best model
    (runs/<variant>/model.pt) answering at its no-answer threshold chosen on the held-out
    slice, as `rcpipe evaluate` does (the test articles tune nothing); ``token_probs``: the
    n-best entries hold the start/end distributions too, as evaluate keeps them."""
    import torch

    from rcpipe.config import load_config
    from rcpipe.data.dataset import SquadDataset
    from rcpipe.data.prepared import Prepared
    from rcpipe.data.squad import read_json
    from rcpipe.inference.reading import Split, heldout_split, heldout_then_dev
    from rcpipe.trained.model_file import model_from_payload

    cfg = load_config(params, [f"data.out_dir={prepared}"])
    # whole contexts, a long one read as data.window's windows, as `rcpipe evaluate` reads
    files = Prepared(prepared)
    dev = Split(SquadDataset.from_parquet(files.dev), read_json(test, str(test)))
    found = files.heldout()
    heldout = heldout_split(found, None) if found else None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    evaluations = {}
    for v in variants:
        saved = torch.load(runs / v / "model.pt", map_location="cpu", weights_only=True)
        model, _ = model_from_payload(saved, v, files.vocab_digest())
        evaluations[v] = heldout_then_dev(model.to(device), dev, heldout,
                                          found.source if found else None, device,
                                          cfg.eval.max_answer_len, window=cfg.data.window,
                                          token_probs=token_probs)
    return evaluations, dev, heldout


def voted(evaluations: dict[str, Any]) -> dict[str, str]:
    """best_evaluations' variants' majority vote on the test articles: question -> text."""
    from rcpipe.inference.ensemble import majority_vote, predictions_from

    return predictions_from(majority_vote([ev.nbest for ev, _ in evaluations.values()]))


def ensemble(variants: list[str], runs: Path, params: Path, prepared: Path, test: Path,
             rounds: int = 10) -> dict[str, Any]:
    """Every variant's best model combined by each of `rcpipe ensemble`'s methods (the
    product's functions: the vote, the mean of their distributions, the mean weighted on the
    held-out slice), scored on the test articles: the vote's official result with every
    method's under "methods" (selected's weights beside it)."""
    from rcpipe.config import load_config
    from rcpipe.inference import distributions
    from rcpipe.inference.ensemble import averaged
    from rcpipe.scoring import metrics

    max_len = load_config(params, [f"data.out_dir={prepared}"]).eval.max_answer_len
    evaluations, dev, held = best_evaluations(variants, runs, params, prepared, test, True)
    members = {v: {"dev": distributions.split_off(ev.nbest)}
               | ({"heldout": distributions.split_off(h.nbest)} if h else {})
               for v, (ev, h) in evaluations.items()}
    result = metrics.score(dev.doc, voted(evaluations))
    methods = {"vote": {"f1": result["f1"], "em": metrics.headline(result)[0]}}
    # each member's own test F1 (a variant of several runs: their mean's)
    result["members"] = {v: metrics.headline(ev.result)[1] for v, (ev, _) in evaluations.items()}
    # (the held-out slice is long enough to choose on only where prepare held one out)
    for method, (_, r, extra) in averaged(members, dev, held, max_len, rounds).items():
        methods[method] = {"f1": r["f1"], "em": metrics.headline(r)[0]} | extra
    return result | {"methods": methods}


def abstain_all(test: Path) -> float | None:
    """F1 of answering nothing on a v2.0 file: its share of unanswerable questions."""
    doc = json.loads(test.read_text())
    if doc.get("version") != "v2.0":
        return None
    qas = [qa for a in doc["data"] for p in a["paragraphs"] for qa in p["qas"]]
    return 100.0 * sum(1 for qa in qas if qa.get("is_impossible")) / len(qas)


def one_seed(seed: int, params: Path, prepared: Path, train_file: Path, test: Path,
             runs: Path, args: Any) -> dict[str, Any]:
    """Every variant trained with ``train.seed=seed`` for the minutes, then the ensemble:
    {wall_minutes, variants: {v: scores and curve}, ensemble}."""
    import torch

    from rcpipe.config import load_config
    from rcpipe.trained.model_file import read_payload, side_by_side

    # a variant of models.<v>.seeds runs trains each (train.seed + k) as `rcpipe train` does
    n = {v: load_config(params, args.sets).models.of(v).seeds for v in args.variants}
    dirs = {v: [runs / v / "seeds" / str(seed + k) for k in range(n[v])] if n[v] > 1
            else [runs / v] for v in args.variants}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.lanes) as pool:
        futures = {v: [pool.submit(train, v, params, prepared, train_file, test, d, seed + k,
                                   args.minutes, args.eval_every, args.device, args.threads,
                                   [*args.sets, f"models.{v}.seeds=1"],
                                   tuned_layer(args.tuned, v)) for k, d in enumerate(dirs[v])]
                   for v in args.variants}
        summaries = {v: [f.result() for f in fs] for v, fs in futures.items()}
    r: dict[str, Any] = {"wall_minutes": (time.perf_counter() - t0) / 60, "variants": {}}
    for v, ss in summaries.items():
        if len(ss) > 1:  # the model of several runs: their weights side by side, as train's
            torch.save(side_by_side([read_payload(d / "model.pt") for d in dirs[v]]),
                       runs / v / "model.pt")
        # test scores of the checkpoint ranked best on the held-out slice, v2.0 at the
        # threshold chosen there (the summary's "dev" is the test file here); of several
        # runs the best single run's (the bar their mean has to clear), each run's beside
        s = max(ss, key=lambda s: s["best_dev_f1"])
        r["variants"][v] = {"best_test_f1": s["best_dev_f1"], "best_test_em": s["best_dev_em"],
                            "best_heldout_f1": s.get("best_heldout_f1"),
                            **{k: s[k] for k in ("best_step", "steps", "epochs",
                                                 "examples_per_s", "history")}} | (
            {"seeds_test_f1": [one["best_dev_f1"] for one in ss]} if len(ss) > 1 else {})
    if len(args.variants) > 1:
        r["ensemble"] = ensemble(args.variants, runs, params, prepared, test)
        for v in (v for v in args.variants if n[v] > 1):  # the mean of the runs, one model
            r["variants"][v]["seed_mean_test_f1"] = r["ensemble"]["members"][v]
    return r


def spread(values: list[float]) -> dict[str, float]:
    """A figure over seeds: its mean, lowest and highest."""
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def over_seeds(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The seeds' runs summed up: each variant's (and the ensemble's) test F1 and EM, held-out
    F1 and steps as mean, min and max over the seeds."""
    first, runs = next(iter(runs.values())), list(runs.values())
    out: dict[str, Any] = {"variants": {
        v: {key: spread([r["variants"][v][key] for r in runs])
            for key in ("best_test_f1", "best_test_em", "best_heldout_f1", "steps")
            if first["variants"][v].get(key) is not None}
        for v in first["variants"]}}
    if "ensemble" in first:
        em = "exact_match" if "exact_match" in first["ensemble"] else "exact"
        out["ensemble"] = {key: spread([r["ensemble"][key] for r in runs]) for key in ("f1", em)}
        # each ensemble method's test F1, and its gain over the seed's best single variant
        # (ranked by test F1 after the fact: the bar a method has to clear, not a choice)
        out["methods"] = {m: {
            "f1": spread([r["ensemble"]["methods"][m]["f1"] for r in runs]),
            "over_best_member": spread([
                r["ensemble"]["methods"][m]["f1"]
                - max(v["best_test_f1"] for v in r["variants"].values()) for r in runs])}
            for m in first["ensemble"].get("methods", {})}
    # a variant of several runs (models.<v>.seeds): their mean, against the best single run
    out["seed_means"] = {v: {
        "f1": spread([r["variants"][v]["seed_mean_test_f1"] for r in runs]),
        "over_best_member": spread([r["variants"][v]["seed_mean_test_f1"] - max(
            x["best_test_f1"] for x in r["variants"].values()) for r in runs])}
        for v in first["variants"] if "seed_mean_test_f1" in first["variants"][v]}
    return out


def spread_line(s: dict[str, float]) -> str:
    return f"{s['mean']:6.2f}" + (f" [{s['min']:.2f}, {s['max']:.2f}]"
                                  if s["max"] > s["min"] else "")


def panels(count: int, width: float, height: float) -> tuple[Any, list[Any]]:
    """A figure of ``count`` panels side by side (matplotlib's Agg canvas: no pyplot, no
    display, nothing to close)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * count, height), layout="constrained")
    return fig, list(fig.subplots(1, count, squeeze=False)[0])


def plot(result: dict[str, Any], path: Path) -> None:
    versions = list(result["versions"])
    fig, axes = panels(len(versions), 6, 4.2)
    for ax, version in zip(axes, versions, strict=True):
        r = result["versions"][version]
        for i, (v, s) in enumerate(r["variants"].items()):
            for j, run in enumerate(r["runs"].values()):  # a line per seed, a colour a variant
                h = run["variants"][v]["history"]
                ax.plot([p["minutes"] for p in h], [p["f1"] for p in h], marker=".",
                        color=f"C{i}", alpha=1.0 if j == 0 else 0.5,
                        label=f"{v} (best {spread_line(s['best_test_f1']).strip()})"
                        if j == 0 else None)
        # each ensemble method's seeds at the end of the curves, a marker a method
        methods = r.get("methods") or ({"vote": {"f1": r["ensemble"]["f1"]}}
                                       if "ensemble" in r else {})
        for (m, x), marker in zip(methods.items(), "*DP", strict=False):
            f1s = [run["ensemble"].get("methods", {}).get(m, run["ensemble"])["f1"]
                   for run in r["runs"].values()]
            ax.scatter([result["minutes"]] * len(f1s), f1s, marker=marker, s=110,
                       color="black", facecolors="none" if m != "vote" else "black",
                       zorder=5, label=f"ensemble, {m} {spread_line(x['f1']).strip()}")
        if r.get("abstain_all_f1") is not None:
            ax.axhline(r["abstain_all_f1"], color="grey", linestyle=":",
                       label=f"answer nothing {r['abstain_all_f1']:.1f}")
        ax.set(title=f"SQuAD v{version}, article split of dev ({result['preset']} preset)",
               xlabel="training minutes", ylabel="test F1")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['device']}: {result['minutes']} min per variant")
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = parser(__doc__, OUT)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="paper")
    ap.add_argument("--minutes", type=float, default=15.0, help="training minutes per variant")
    ap.add_argument("--versions", nargs="*", default=["1.1", "2.0"])
    ap.add_argument("--split", type=Path, default=SPLIT, help="train-v<V>.json, test-v<V>.json")
    ap.add_argument("--variants", nargs="*", default=VARIANTS)
    ap.add_argument("--lanes", type=int, default=0, help="variants at once (0: preset's)")
    ap.add_argument("--threads", type=int, default=0, help="a variant's (0: cpu 1, else torch's)")
    ap.add_argument("--eval-every", type=int, default=0, help="steps (0: cpu 50, else 200)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--tag", default="", help="a name for this run's outputs (ablations)")
    ap.add_argument("--tuned", type=Path, help="`rcpipe tune`'s <variant>.yaml layers' folder")
    ap.add_argument("--seeds", type=int, default=1, help="seeds a variant: mean [min, max]")
    ap.add_argument("--first-seed", type=int, help="the first seed (default: the preset's)")
    ap.add_argument("--seed-step", type=int, default=1, help="between seeds (models.<v>.seeds "
                    "N: N, so no two seeds' runs share a train.seed)")
    args = ap.parse_args()
    import torch

    from rcpipe.config import load_config

    cpu, params = args.preset == "cpu", PRESETS[args.preset]
    args.tag = args.tag or ("tuned" if args.tuned else "")
    args.lanes = args.lanes or (2 if cpu else 1)
    args.threads = args.threads or (1 if cpu else 0)
    args.eval_every = args.eval_every or (50 if cpu else 200)
    base = load_config(params, args.sets).train.seed if args.first_seed is None \
        else args.first_seed
    seeds = list(range(base, base + args.seeds * args.seed_step, args.seed_step))
    if args.threads:  # the ensemble runs here: beside another bench, torch's default would spin
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name() if torch.cuda.is_available() and args.device != "cpu" \
        else f"{os.cpu_count()}-core CPU, {args.threads} thread(s) a variant"
    result: dict[str, Any] = {"preset": args.preset, "minutes": args.minutes, "device": name,
                              "seeds": seeds, "lanes": args.lanes, "sets": args.sets,
                              "versions": {},
                              "tuned": {v: str(args.tuned / f"{v}.yaml") for v in args.variants
                                        if tuned_layer(args.tuned, v)}}
    for version in args.versions:
        train_file = args.split / f"train-v{version}.json"
        test = args.split / f"test-v{version}.json"
        work = args.out / "accuracy" / args.preset / f"v{version}"
        prepare(params, train_file, test, work / "prepared", [])
        held = json.loads((work / "prepared" / "meta.json").read_text()).get("heldout")
        r: dict[str, Any] = {
            "abstain_all_f1": abstain_all(test), "seeds": seeds,
            # what the test articles are not used for: the held-out slice of the training
            # articles ranks checkpoints and (v2.0) chooses the no-answer threshold
            "tuned_on": f"held-out slice of {train_file.name}: {held['articles']} articles, "
                        f"{held['questions']} questions (data.heldout)" if held else
                        "the test articles (nothing held out: data.heldout.fraction 0)",
            "runs": {}}
        print(f"v{version}: {len(args.variants)} variants x {len(seeds)} seed(s), "
              f"{args.minutes} min each, {args.lanes} at a time on {name}", flush=True)
        for seed in seeds:
            # the variants train under <tag>/ (runs/ untagged), each seed of several its own
            runs = work / (args.tag or "runs") / (f"seed-{seed}" if len(seeds) > 1 else "")
            r["runs"][str(seed)] = one_seed(seed, params, work / "prepared", train_file, test,
                                            runs, args)
        r |= over_seeds(r["runs"])
        result["versions"][version] = r
        print(f"  v{version}: checkpoints and no-answer thresholds tuned on {r['tuned_on']}")
        for v, s in r["variants"].items():
            print(f"  v{version} {v:<15} test F1 {spread_line(s['best_test_f1'])}")
        if "ensemble" in r:
            print(f"  v{version} {'ensemble':<15} test F1 {spread_line(r['ensemble']['f1'])}")
        for v, x in r.get("seed_means", {}).items():
            print(f"  v{version} {v + ', seeds':<15} test F1 {spread_line(x['f1'])}, over the "
                  f"best single run {spread_line(x['over_best_member'])}")
        for m, x in r.get("methods", {}).items():
            print(f"  v{version} {'  ' + m:<15} test F1 {spread_line(x['f1'])}, over the "
                  f"best variant {spread_line(x['over_best_member'])}")
    stem = f"accuracy{'-' + args.tag if args.tag else ''}"
    write(args.out / f"{stem}.json", result)
    plot(result, args.out / f"{stem}.png")
    print(f"-> {args.out / f'{stem}.png'}")


if __name__ == "__main__":
    main()
