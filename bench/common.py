"""What the benches share: the repository's paths, the options most of them take and the JSON
result each writes under bench/out/.

A bench runs as ``python bench/NAME.py``, its folder first on sys.path, so it imports this as
``common``; one the tests import as ``bench.NAME`` puts its folder there first.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
SPLIT = ROOT.parent / "shared" / "data" / "squad-split"  # the article split (bench/accuracy.py)


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


def write(path: Path, result: Any) -> Path:
    """The result as indented JSON at ``path`` (its folder made), said on stdout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"-> {path}")
    return path
