"""What the benches share: the repository's paths, the options most of them take, the device
they name and the JSON result each writes under bench/out/."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
SHARED = ROOT.parent / "shared" / "data"
SPLIT = SHARED / "squad-split"  # the article split of SQuAD dev (bench/accuracy.py)
SQUAD = SHARED / "squad" / "dev-v1.1.json"


def parser(doc: str | None, out: Path | None = None, sets: bool = True
           ) -> argparse.ArgumentParser:
    """The bench's options, described by its docstring's first paragraph: with ``sets`` the
    repeatable ``--set KEY=VALUE`` (a params override, into ``args.sets``), with ``out``
    ``--out`` defaulting to it."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if sets:
        ap.add_argument("--set", dest="sets", action="append", default=[],
                        help="override a param (repeatable)")
    if out is not None:
        ap.add_argument("--out", type=Path, default=out)
    return ap


def set_args(sets: list[str]) -> list[str]:
    """``--set KEY=VALUE`` pairs for an rcpipe command line."""
    return [a for s in sets for a in ("--set", s)]


def cpu() -> str:
    """The CPU's name as the results pages give it (the machine's kind where it has none)."""
    return platform.processor() or platform.machine()


def device_name(device: Any) -> str:
    """A torch device as a result names it: the GPU's model, or the CPU with torch's threads."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu()} CPU, {torch.get_num_threads()} torch thread(s)"


def sync(device: Any) -> None:
    """Wait for the GPU's queue (a timing's ends); nothing on the CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def write(path: Path, result: Any) -> Path:
    """The result as indented JSON at ``path`` (its folder made), said on stdout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"-> {path}")
    return path
