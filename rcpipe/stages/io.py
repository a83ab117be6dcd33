"""File helpers shared by the stages: atomic JSON writes, validated JSON mappings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rcpipe.config import ReadLimits
from rcpipe.data.squad import DEFAULT
from rcpipe.errors import InputError
from rcpipe.layout import write_json as write_json  # the stages' one JSON write


def read_mapping(path: Path, value: type | tuple[type, ...], what: str,
                 limits: ReadLimits = DEFAULT) -> dict[str, Any]:
    """A JSON object of question ids to values of type ``value`` (predictions, n-best or
    no-answer probabilities), read within ``limits``."""
    from rcpipe.data.squad import read_json

    obj = read_json(path, str(path), limits)
    if not isinstance(obj, dict):
        raise InputError(path, "", "expected a JSON object mapping question ids to answers")
    for k, v in obj.items():
        if not isinstance(v, value) or isinstance(v, bool):
            raise InputError(path, json.dumps([k]), f"expected {what}, got {type(v).__name__}")
    return obj




