"""The plots stage: F1 by question type as the row lists that `dvc plots` draws.

evaluate and ensemble write ``metrics/<model>.by_type.json`` as ``{type: {exact, f1,
total}}``, which `dvc metrics` reads but `dvc plots` cannot (it plots lists of records);
this stage writes the same numbers as ``plots/by_type/<model>.json`` rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rcpipe.config import VARIANTS
from rcpipe.errors import InputError
from rcpipe.stages.io import write_json

MODELS = (*VARIANTS, "ensemble")


def by_type_rows(by_type: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """``{type: {exact, f1, total}}`` -> ``[{type, exact, f1, total}]`` in the same order."""
    return [{"type": name, **scores} for name, scores in by_type.items()]


def plots(metrics_dir: Path = Path("metrics"), out_dir: Path = Path("plots/by_type")
          ) -> list[Path]:
    """One rows file per model whose by-type metrics exist; an error when none does."""
    written = []
    for model in MODELS:
        source = metrics_dir / f"{model}.by_type.json"
        if not source.is_file():
            continue
        try:
            rows = by_type_rows(json.loads(source.read_text()))
        except (ValueError, TypeError, AttributeError):
            raise InputError(source, "", "expected {type: {exact, f1, total}}") from None
        write_json(out_dir / f"{model}.json", rows)
        written.append(out_dir / f"{model}.json")
    if not written:
        raise InputError(metrics_dir, "", "no <model>.by_type.json; run `rcpipe evaluate` "
                                          "first")
    return written
