"""Issue 56: every JSON rcpipe reads goes through one depth- and size-capped reader
(`reads.read_json`, or `reads.parse_json` for bytes already held within a cap). An
export.json nested 100,000 deep made `rcpipe predict --runtime onnx` exit 1 with a
RecursionError traceback (trained/onnx.py read it with json.loads); it is one line now."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.faults.test_abuse import DEEP, assert_one_line, here, rcpipe, run_dir

__all__ = ["here", "run_dir"]  # the abuse cases' run directory: an untrained bidaf model file

ROOT = Path(__file__).resolve().parents[2]
# reads.py is the reader; flows/stack.py imports nothing of rcpipe (architecture.md), its
# stack.json is the one it writes itself
OWN = {"rcpipe/reads.py", "flows/stack.py"}


def test_a_deep_export_record_is_one_line(here: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    folder = here / "models" / "bidaf"
    (folder / "model.onnx").write_bytes(b"not a graph")
    (folder / "export.json").write_text(DEEP)
    try:
        code, err = rcpipe(capsys, "predict", "--model", "bidaf", "--runtime", "onnx",
                           "--question", "who?", "--context", "a b c")
        assert_one_line(code, err, "error: models/bidaf/export.json: nested 100000 deep, "
                        "over the bound of 64 (limits.depth)")
    finally:
        (folder / "model.onnx").unlink()
        (folder / "export.json").unlink()


def _json_calls(path: Path) -> list[str]:
    """Where ``path`` calls json.load or json.loads (however json was imported)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
                else ""
            if name in ("load", "loads") and isinstance(f, ast.Attribute) and \
                    isinstance(f.value, ast.Name) and f.value.id == "json":
                found.append(f"{path.name}:{node.lineno}")
        if isinstance(node, ast.ImportFrom) and node.module == "json" and \
                {a.name for a in node.names} & {"load", "loads"}:
            found.append(f"{path.name}:{node.lineno} (from json import)")
    return found


def test_no_json_is_parsed_but_by_the_capped_reader() -> None:
    files = [p for top in ("rcpipe", "flows") for p in sorted((ROOT / top).rglob("*.py"))
             if str(p.relative_to(ROOT)) not in OWN]
    assert len(files) > 100
    found = [f"{p.parent.relative_to(ROOT)}/{where}" for p in files for where in _json_calls(p)]
    assert not found, f"json parsed outside reads (read_json / parse_json): {found}"


def test_the_check_finds_a_raw_json_read(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    bad.write_text("import json\nx = json.loads('[]')\nfrom json import load\n")
    assert sorted(_json_calls(bad)) == ["probe.py:2", "probe.py:3 (from json import)"]
