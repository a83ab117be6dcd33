"""The GPU kit's results as the GPU results table (markdown): every committed draw, newest
first, the device named, with the issue's targets beside the measured figures: met, not
met, or open.

    .venv/bin/python bench/gpu/table.py                 every draw in bench/gpu/results/
    .venv/bin/python bench/gpu/table.py DIR [DIR ...]   one draw's calls, not yet recorded

Each DIR holds what one device call brought back ($OUT: setup.json, speed.json,
compiled.json, accuracy.json, ray.json, peers.json, audit.json, call-<n>.json); a file in a
later DIR replaces the one of the same name before it (per variant where both hold
results). Figures measured on a CPU (the dry run) leave every target open: the targets are
the H100's, and each draw's column names the card that gave its figures (an H200 is lent
too).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu.results import RESULTS, VARIANTS, draws, merged, on_gpu  # noqa: E402

OPEN = "open"


def device(r: dict[str, Any]) -> str:
    setup = r.get("setup", {})
    if setup.get("gpu"):
        return (f"{setup['gpu']} (torch {setup['torch']}, CUDA {setup['cuda']}, "
                f"Python {setup['python']}, {setup['cpus']} CPUs)")
    name = r.get("speed", {}).get("device") or r.get("audit", {}).get("device") or "?"
    return f"{name} (Python {setup.get('python', '?')}, torch {setup.get('torch', '?')})"


def rates(r: dict[str, Any], variant: str) -> dict[str, float]:
    """Every measured mode's examples/s of a variant: fp32, bf16 (bench/train_speed.py) and
    the Worker's step compiled off, default, reduce-overhead."""
    out = {m: x["examples_per_s"] for m, x in
           r.get("speed", {}).get("results", {}).get(variant, {}).items()}
    for m, x in r.get("compiled", {}).get("results", {}).get(variant, {}).items():
        out[f"step {m}"] = x["examples_per_s"]
    return out


def fastest(r: dict[str, Any], variant: str) -> tuple[str, float] | None:
    got = rates(r, variant)
    return max(got.items(), key=lambda kv: kv[1]) if got else None


def num(x: float | None, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def speed_table(r: dict[str, Any]) -> list[str]:
    speed, comp, audit = (r.get(k, {}) for k in ("speed", "compiled", "audit"))
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
        s = speed.get("results", {}).get(v, {})
        c = comp.get("results", {}).get(v, {})
        a = audit.get("results", {}).get(v)
        if not (s or c or a):
            continue
        fp32 = s.get("fp32", {})
        busy = fp32.get("gpu_busy")
        lines.append(" | ".join([
            f"| `{v}`", num(fp32.get("examples_per_s"), ",.1f"),
            num(s.get("bf16", {}).get("examples_per_s"), ",.1f"),
            *(num(c.get(m, {}).get("examples_per_s"), ",.1f")
              for m in ("off", "default", "reduce-overhead")),
            num(fp32.get("step_ms"), ",.1f"), num(fp32.get("peak_mib")),
            "-" if busy is None else f"{100 * busy:.0f}%",
            f"{a['graphs']} / {a['graph_breaks']}" if a else "-",
            num(a and a["kernels_per_step"])]) + " |")
    skipped = {**speed.get("skipped", {}), **comp.get("skipped", {})}
    if skipped:
        lines += ["", "Not measured: " + "; ".join(f"`{v}` ({why})"
                                                   for v, why in skipped.items()) + "."]
    return lines


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
    for name, ver in versions.items():
        if ver.get("abstain_all_f1") is not None:
            lines.append(f"\nv{name}: answering nothing scores {ver['abstain_all_f1']:.2f} F1.")
    return lines


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
        st = p["steps"]
        lines.append(f"| `{model}` | {p['peer']} | "
                     + " | ".join(f"{st[k]['ratio_median']:.2f}x / {st[k]['ratio_min']:.2f}x"
                                  for k in ("train", "inference")) + " |")
    if x.get("skipped"):
        lines += ["", "Not measured: " + "; ".join(f"`{k}` ({why})"
                                                    for k, why in x["skipped"].items()) + "."]
    return lines


def card(d: dict[str, Any]) -> str:
    """The GPU a draw ran on, as torch named it (the device tool's words otherwise)."""
    return d["figures"].get("setup", {}).get("gpu") or d["device"]


def verdict(ok: bool | None) -> str:
    return OPEN if ok is None else "met" if ok else "not met"


def targets(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, measured, met / not met / open) for each of the issue's targets."""
    gpu = on_gpu(r)
    rows: list[tuple[str, str, str]] = []

    def speed_row(name: str, measure: Callable[[], tuple[str, float] | None],
                  least: float) -> None:
        got = measure()
        rows.append((name, got[0] if got else "-",
                     verdict(got[1] >= least if got and gpu else None)))

    def rate(v: str) -> tuple[str, float] | None:
        f = fastest(r, v)
        return (f"{f[1]:,.0f} ex/s ({f[0]})", f[1]) if f else None

    def ratio(a: str, b: str) -> tuple[str, float] | None:
        fa, fb = fastest(r, a), fastest(r, b)
        return (f"{fa[1] / fb[1]:.2f}x ({fa[0]} / {fb[0]})", fa[1] / fb[1]) \
            if fa and fb else None

    def bf16_gain() -> tuple[str, float] | None:
        q = rates(r, "qanet")
        return (f"{q['bf16'] / q['fp32']:.2f}x", q["bf16"] / q["fp32"]) \
            if "bf16" in q and "fp32" in q else None

    def busy() -> tuple[str, float] | None:
        b = r.get("speed", {}).get("results", {}).get("qanet", {}).get("fp32", {})
        return (f"{100 * b['gpu_busy']:.0f}%", b["gpu_busy"]) if "gpu_busy" in b else None

    speed_row("QANet >= 2,000 training examples/s", lambda: rate("qanet"), 2000)
    speed_row("QANet >= 4x R-Net additive (each at its fastest)",
              lambda: ratio("qanet", "rnet"), 4)
    speed_row("R-Net multiplicative >= 4.5x additive", lambda: ratio("rnet_mult", "rnet"), 4.5)
    speed_row("bf16 >= 1.3x fp32 for QANet", bf16_gain, 1.3)
    speed_row("GPU busy >= 70% of a QANet step (fp32)", busy, 0.70)
    acc = r.get("accuracy", {})
    v1 = acc.get("versions", {}).get("1.1")
    in_time = bool(acc) and 0 < acc.get("minutes", 0) <= 15
    if v1 and v1["variants"]:
        best_v, best = max(v1["variants"].items(), key=lambda kv: kv[1]["test_f1"])
        rows.append(("v1.1 best single >= 45 F1 (<= 15 min a variant)",
                     f"{best['test_f1']:.2f} (`{best_v}`, "
                     + (f"{acc['minutes']:g} min)" if acc["minutes"] else f"{acc['steps']} steps)"),
                     verdict(best["test_f1"] >= 45 and in_time if gpu else None)))
    else:
        rows.append(("v1.1 best single >= 45 F1 (<= 15 min a variant)", "-", OPEN))
    ens = (v1 or {}).get("ensemble")
    rows.append(("v1.1 ensemble >= 50 F1", f"{ens['f1']:.2f}" if ens else "-",
                 verdict(ens["f1"] >= 50 and in_time if ens and gpu else None)))
    v2 = acc.get("versions", {}).get("2.0")
    if v2 and v2["variants"]:
        best_v, best = max(v2["variants"].items(), key=lambda kv: kv[1]["test_f1"])
        rows.append(("v2.0: a variant above answering nothing (held-out threshold)",
                     f"{best['test_f1']:.2f} (`{best_v}`) against {v2['abstain_all_f1']:.2f}",
                     verdict(best["test_f1"] > v2["abstain_all_f1"] if gpu else None)))
    else:
        rows.append(("v2.0: a variant above answering nothing (held-out threshold)", "-", OPEN))
    return rows


def render(r: dict[str, Any]) -> str:
    lines = [f"GPU kit results on {device(r)}:", "", *speed_table(r), "", *accuracy_table(r),
             "", ray_line(r), "", *peers_lines(r), "",
             "| target (H100, params.yaml sizes, batch 32) | measured | |",
             "|---|---|---|"]
    lines += [f"| {t} | {m} | {s} |" for t, m, s in targets(r)]
    if not on_gpu(r):
        lines += ["", "Measured without a GPU: every target stays open."]
    return "\n".join(lines) + "\n"


def every_draw(found: list[dict[str, Any]]) -> str:
    """The targets against every draw (newest first), then each draw's own tables."""
    if not found:
        return ("No GPU draw recorded yet (bench/gpu/results/ is empty): every target "
                "stays open.\n")
    lines = ["| target (H100, params.yaml sizes, batch 32) | "
             + " | ".join(f"{d['date']} `{d['commit']}`, {card(d)}" for d in found) + " |",
             "|---|" + "---|" * len(found)]
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
    ap.add_argument("dirs", nargs="*", type=Path,
                    help="one draw's $OUT folders, in order (default: every recorded draw)")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    print(render(merged(args.dirs)) if args.dirs else every_draw(draws(args.results)), end="")


if __name__ == "__main__":
    main()
