"""The GPU kit's results as the GPU results table (markdown): every committed draw, newest
first, the device named, with the issue's targets beside the measured figures: met, not
met, or open.

    .venv/bin/python bench/gpu/table.py                 every draw in bench/gpu/results/
    .venv/bin/python bench/gpu/table.py DIR [DIR ...]   one draw's calls, not yet recorded

Each DIR holds what one device call brought back ($OUT); a file in a later DIR replaces the
one of the same name before it (per variant where both hold results). Figures measured on a
CPU (the dry run) leave every target open: the targets are the H100's, and each draw's
column names the card that gave its figures (an H200 is lent too).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.results import RESULTS, VARIANTS, draws, merged, on_gpu  # noqa: E402

Measured = tuple[str, float] | None  # a target's figure as shown, and its value


def device(r: dict[str, Any]) -> str:
    setup = r.get("setup", {})
    if setup.get("gpu"):
        return (f"{setup['gpu']} (torch {setup['torch']}, CUDA {setup['cuda']}, "
                f"Python {setup['python']}, {setup['cpus']} CPUs)")
    name = r.get("speed", {}).get("device") or r.get("audit", {}).get("device") or "?"
    return f"{name} (Python {setup.get('python', '?')}, torch {setup.get('torch', '?')})"


def results(r: dict[str, Any], step: str, variant: str) -> dict[str, Any]:
    return r.get(step, {}).get("results", {}).get(variant, {})


def rates(r: dict[str, Any], variant: str) -> dict[str, float]:
    """Every measured mode's examples/s of a variant: fp32, bf16 (bench/train_speed.py) and
    the Worker's step compiled off, default, reduce-overhead."""
    return {m: x["examples_per_s"] for m, x in results(r, "speed", variant).items()} | {
        f"step {m}": x["examples_per_s"] for m, x in results(r, "compiled", variant).items()}


def fastest(r: dict[str, Any], variant: str) -> tuple[str, float] | None:
    got = rates(r, variant)
    return max(got.items(), key=lambda kv: kv[1]) if got else None


def num(x: float | None, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def skipped(*steps: dict[str, Any]) -> list[str]:
    why = {k: v for s in steps for k, v in s.get("skipped", {}).items()}
    return ["", "Not measured: " + "; ".join(f"`{k}` ({v})" for k, v in why.items()) + "."] \
        if why else []


def speed_table(r: dict[str, Any]) -> list[str]:
    speed, comp = r.get("speed", {}), r.get("compiled", {})
    params = r.get("setup", {}).get("params", "params.yaml")
    lines = [f"Training examples/s at `{params}` sizes, batch {speed.get('batch', 32)}: "
             "bench/train_speed.py in fp32 (TF32 on CUDA) and bf16, and the Worker's step "
             f"(`TrainStep`, {comp.get('backend', 'inductor')}) with `train.compile` off, "
             "default and reduce-overhead on `train.buckets`' batches; the audit's counts "
             "(`bench/train_speed.py --audit`).", "",
             "| variant | fp32 | bf16 | step off | compile default | reduce-overhead | "
             "fp32 ms/step | peak MiB | GPU busy (fp32) | graphs / breaks | kernels per step |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        s, c = results(r, "speed", v), results(r, "compiled", v)
        a = r.get("audit", {}).get("results", {}).get(v)
        if not (s or c or a):
            continue
        fp32, busy = s.get("fp32", {}), s.get("fp32", {}).get("gpu_busy")
        lines.append(" | ".join([
            f"| `{v}`", num(fp32.get("examples_per_s"), ",.1f"),
            num(s.get("bf16", {}).get("examples_per_s"), ",.1f"),
            *(num(c.get(m, {}).get("examples_per_s"), ",.1f")
              for m in ("off", "default", "reduce-overhead")),
            num(fp32.get("step_ms"), ",.1f"), num(fp32.get("peak_mib")),
            "-" if busy is None else f"{100 * busy:.0f}%",
            f"{a['graphs']} / {a['graph_breaks']}" if a else "-",
            num(a and a["kernels_per_step"])]) + " |")
    # torch's count of the graphs cudagraph trees ran uncaptured (a mutated input, say)
    uncaptured = [f"`{v}` {n}" for v in VARIANTS
                  if (n := results(r, "compiled", v).get("reduce-overhead", {})
                      .get("cudagraph_skips"))]
    if uncaptured:
        lines += ["", "Graphs reduce-overhead left uncaptured (torch's `cudagraph_skips`): "
                  + ", ".join(uncaptured) + "."]
    return lines + skipped(speed, comp)


def accuracy_table(r: dict[str, Any]) -> list[str]:
    acc = r.get("accuracy")
    if not acc:
        return ["Accuracy: open (no accuracy.json)."]
    budget = f"{acc['minutes']:g} min" if acc["minutes"] else f"{acc['steps']} steps"
    versions = acc["versions"]
    lines = [f"Accuracy on the article split of SQuAD dev (test articles; {budget} a variant, "
             "every variant trained at once on the one device; checkpoints ranked and the "
             "v2.0 no-answer threshold chosen on the held-out 5% of the training articles):",
             "", "| variant | " + " | ".join(f"v{v} test F1 / EM | steps" for v in versions)
             + " |", "|---|" + "---|---|" * len(versions)]
    for v in [*VARIANTS, "ensemble"]:
        cells = []
        for ver in versions.values():
            x = ver.get("ensemble") if v == "ensemble" else ver["variants"].get(v)
            if x is None:
                cells += ["-", "-"]
                continue
            em = x.get("test_em", x.get("exact_match", x.get("exact")))
            cells += [f"{x.get('test_f1', x.get('f1')):.2f} / {em:.2f}",
                      str(x.get("steps", "-"))]
        if any(c != "-" for c in cells):
            lines.append(f"| {v if v == 'ensemble' else f'`{v}`'} | " + " | ".join(cells) + " |")
    return lines + [f"\nv{name}: answering nothing scores {ver['abstain_all_f1']:.2f} F1."
                    for name, ver in versions.items() if ver.get("abstain_all_f1") is not None]


def ray_line(r: dict[str, Any]) -> str:
    x = r.get("ray")
    if not x:
        return "Ray Train job: open (no ray.json)."
    if x.get("status") != "done":
        seen = (f"killed {x['killed_after_s']:.0f} s in with checkpoints "
                f"{x['checkpoints_at_kill']}, resumed run stopped with "
                f"{x.get('checkpoints_after')}") if "killed_after_s" in x else x.get("why", "")
        return f"Ray Train job: {x.get('status')} ({seen})."
    return (f"Ray Train job (`rcpipe train {x['variant']}`, {x['world_size']} worker, "
            f"{x['backend'].upper()}, {x['device']}): killed with SIGKILL "
            f"{x['killed_after_s']:.0f} s in, run again, resumed from step "
            f"{x['resumed_from_step']} to {x['steps']} ({x['examples_per_s']:,.0f} ex/s).")


def peers_lines(r: dict[str, Any]) -> list[str]:
    """bench/peers.py's pairs on the device: rcpipe's seconds over the peer's (above 1:
    rcpipe slower)."""
    x = r.get("peers")
    if not x:
        return ["Beside the peers: open (no peers.json)."]
    lines = ["Beside the peers (bench/peers.py, equal sizes, the same real-text batch; "
             "rcpipe's time over the peer's, median / min; above 1: rcpipe slower):", "",
             "| rcpipe | peer | train | inference |", "|---|---|---|---|"]
    for model, p in x.get("results", {}).items():
        lines.append(f"| `{model}` | {p['peer']} | " + " | ".join(
            f"{p['steps'][k]['ratio_median']:.2f}x / {p['steps'][k]['ratio_min']:.2f}x"
            for k in ("train", "inference")) + " |")
    return lines + skipped(x)


def peer_accuracy_lines(r: dict[str, Any]) -> list[str]:
    """bench/peer_accuracy.py on the device (call 3): rcpipe's test F1 minus the peer's."""
    x = r.get("peer_accuracy")
    if not x:
        return ["How well each learns beside the peers: open (no peer_accuracy.json)."]
    lines = [f"How well each learns beside the peers (bench/peer_accuracy.py, each side by its "
             f"own recipe, one seed, {x['minutes']:g} min a side, all at once): rcpipe's test "
             "F1 minus the peer's:", "",
             "| pair | steps, rcpipe / peer | at equal minutes | at equal steps |",
             "|---|---|---|---|"]
    for model, p in x.get("results", {}).items():
        steps = next(iter(p["runs"].values()))["steps"]
        lines.append(f"| `{model}` beside {p['peer']} | {steps['rcpipe']:,} / "
                     f"{steps['peer']:,} | " + " | ".join(
                         p["compared"][k]["line"] for k in ("minutes", "steps")) + " |")
    return lines + skipped(x)


def targets(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, measured, met / not met / open) for each of the issue's targets."""
    gpu = on_gpu(r)

    def row(name: str, got: Measured, met: bool | None = None, least: float = 0) -> tuple:
        met = (got[1] >= least if met is None else met) if got and gpu else None
        return name, got[0] if got else "-", "open" if met is None else "met" if met else "not met"

    def rate(v: str) -> Measured:
        f = fastest(r, v)
        return (f"{f[1]:,.0f} ex/s ({f[0]})", f[1]) if f else None

    def ratio(a: str, b: str) -> Measured:
        fa, fb = fastest(r, a), fastest(r, b)
        return (f"{fa[1] / fb[1]:.2f}x ({fa[0]} / {fb[0]})", fa[1] / fb[1]) if fa and fb else None

    q, busy = rates(r, "qanet"), results(r, "speed", "qanet").get("fp32", {}).get("gpu_busy")
    acc = r.get("accuracy", {})
    in_time = bool(acc) and 0 < acc.get("minutes", 0) <= 15

    def best(version: str) -> tuple[str, dict[str, Any]] | None:
        found = acc.get("versions", {}).get(version, {}).get("variants")
        return max(found.items(), key=lambda kv: kv[1]["test_f1"]) if found else None

    v1, v2 = best("1.1"), best("2.0")
    ens = acc.get("versions", {}).get("1.1", {}).get("ensemble")
    nothing = acc.get("versions", {}).get("2.0", {}).get("abstain_all_f1")
    budget = (f"{acc['minutes']:g} min" if acc.get("minutes") else f"{acc.get('steps')} steps")
    return [
        row("QANet >= 2,000 training examples/s", rate("qanet"), least=2000),
        row("QANet >= 4x R-Net additive (each at its fastest)", ratio("qanet", "rnet"), least=4),
        row("R-Net multiplicative >= 4.5x additive", ratio("rnet_mult", "rnet"), least=4.5),
        row("bf16 >= 1.3x fp32 for QANet", (f"{q['bf16'] / q['fp32']:.2f}x", q["bf16"] / q["fp32"])
            if "bf16" in q and "fp32" in q else None, least=1.3),
        row("GPU busy >= 70% of a QANet step (fp32)",
            None if busy is None else (f"{100 * busy:.0f}%", busy), least=0.70),
        row("v1.1 best single >= 45 F1 (<= 15 min a variant)",
            v1 and (f"{v1[1]['test_f1']:.2f} (`{v1[0]}`, {budget})", v1[1]["test_f1"]),
            v1 and v1[1]["test_f1"] >= 45 and in_time),
        row("v1.1 ensemble >= 50 F1", ens and (f"{ens['f1']:.2f}", ens["f1"]),
            ens and ens["f1"] >= 50 and in_time),
        row("v2.0: a variant above answering nothing (held-out threshold)",
            v2 and (f"{v2[1]['test_f1']:.2f} (`{v2[0]}`) against {nothing:.2f}", 0),
            v2 and v2[1]["test_f1"] > nothing)]


def render(r: dict[str, Any]) -> str:
    lines = [f"GPU kit results on {device(r)}:", "", *speed_table(r), "", *accuracy_table(r),
             "", ray_line(r), "", *peers_lines(r), "", *peer_accuracy_lines(r), "",
             "| target (H100, params.yaml sizes, batch 32) | measured | |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {s} |" for t, m, s in targets(r)]
    if not on_gpu(r):
        lines += ["", "Measured without a GPU: every target stays open."]
    return "\n".join(lines) + "\n"


def every_draw(found: list[dict[str, Any]]) -> str:
    """The targets against every draw (newest first), then each draw's own tables."""
    if not found:
        return ("No GPU draw recorded yet (bench/gpu/results/ is empty): every target "
                "stays open.\n")
    cards = [d["figures"].get("setup", {}).get("gpu") or d["device"] for d in found]
    lines = ["| target (H100, params.yaml sizes, batch 32) | "
             + " | ".join(f"{d['date']} `{d['commit']}`, {c}" for d, c in zip(found, cards,
                                                                                strict=True))
             + " |", "|---|" + "---|" * len(found)]
    per_draw = [targets(d["figures"]) for d in found]
    for i, (name, _, _) in enumerate(per_draw[0]):
        lines.append(f"| {name} | " + " | ".join(f"{t[i][1]} ({t[i][2]})" for t in per_draw)
                     + " |")
    for d in found:
        lines += ["", f"### {d['date']}: {d['device']} (commit `{d['commit']}`)", "",
                  render(d["figures"]).rstrip()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", type=Path, help="one draw's $OUT folders, in order")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    print(render(merged(args.dirs)) if args.dirs else every_draw(draws(args.results)), end="")


if __name__ == "__main__":
    main()
