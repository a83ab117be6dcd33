"""A trained model (trained/model_file.py) is used without training code: `rcpipe evaluate`,
predict, explain, the service and the inference bench import nothing of rcpipe.train."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rcpipe.pipeline.code import closure

ROOT = Path(__file__).resolve().parents[2]
USERS = ("rcpipe/trained/model_file.py", "rcpipe/stages/evaluate.py", "rcpipe/stages/predict.py",
         "rcpipe/stages/serving.py", "rcpipe/trained/reader.py", "rcpipe/champion/app.py",
         "rcpipe/stages/explain.py", "rcpipe/trained/package_dir.py", "rcpipe/stages/package.py",
         "rcpipe/trained/onnx.py", "rcpipe/stages/export.py",
         *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "rcpipe/serve").glob("*.py"))))


@pytest.mark.parametrize("path", USERS)
def test_no_import_anywhere_in_a_models_user_reaches_training_code(path: str) -> None:
    """Every import, those inside functions too, followed through rcpipe."""
    assert sorted(f for f in closure(path) if f.startswith("rcpipe/train/")) == []


@pytest.mark.parametrize("module", [
    "rcpipe.trained.model_file", "rcpipe.stages.evaluate", "rcpipe.stages.predict",
    "rcpipe.stages.explain", "rcpipe.stages.package", "rcpipe.trained.onnx",
    "rcpipe.stages.export", "rcpipe.serve", "bench/serve.py"])
def test_a_fresh_interpreter_importing_a_models_user_imports_no_training_code(
        module: str) -> None:
    """At run time too: the rcpipe.stages package's own import (of stages/train.py) keeps
    rcpipe.train out until a training stage runs. A bench script is imported as it runs,
    its folder first on the path."""
    path, _, script = module.rpartition("/")
    name = script.removesuffix(".py")
    code = (f"import importlib, json, sys; sys.path.insert(0, {path!r}); "
            f"importlib.import_module({name!r}); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[:2] == "
            "['rcpipe', 'train'])))")  # rcpipe.train and its modules, not rcpipe.trained
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == []


def test_the_params_threshold_wins_over_the_saved_one(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from rcpipe import layout
    from rcpipe.config import load_config
    from rcpipe.trained.model_file import na_threshold, threshold_for
    from tests.conftest import write_params

    monkeypatch.chdir(tmp_path)
    chosen = load_config(write_params(tmp_path / "a.yaml"))
    fixed = load_config(write_params(tmp_path / "b.yaml", eval={"na_threshold": 0.25}))
    assert threshold_for(chosen, 0.5) == 0.5 and threshold_for(chosen, None) is None
    assert threshold_for(fixed, 0.5) == threshold_for(fixed, None) == 0.25
    assert na_threshold(chosen, "bidaf") is None  # nothing saved: the model's own rule
    layout.write_json(layout.na_threshold_file("bidaf"), {"na_threshold": 0.5})
    assert (na_threshold(chosen, "bidaf"), na_threshold(fixed, "bidaf")) == (0.5, 0.25)
