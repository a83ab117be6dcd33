"""The floors of docs/architecture.md: which rcpipe package may import which."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BASE = {"config", "errors", "console", "logs", "layout", "fingerprints", "variants", "outputs",
        "locks", "reads"}
# package -> the rcpipe packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "config": {"errors", "variants", "reads"},
    "variants": set(),
    "errors": set(),
    "reads": {"errors"},  # a user's file read within its caps, JSON and YAML depth bounded
    "console": set(),
    "logs": {"console"},  # rich's handler writes on the console the bars use
    "layout": set(),
    "fingerprints": {"config", "layout"},  # what a run's and a stage's outputs were made from
    "outputs": set(),  # a stage's files written as one set
    "locks": {"errors"},  # one run at a time per output; the holder's line
    "data": {"config", "errors", "console", "models", "reads"},  # models: the Batch type only
    "models": {"config", "variants"},
    "scoring": set(),  # official scoring and the paired comparison: pure, no torch
    "inference": {"config", "errors", "data", "models", "layout", "scoring"},
    "trained": {"config", "errors", "reads", "data", "models", "layout"},
    "render": {"data", "models", "scoring", "inference", "layout"},
    "train": BASE | {"data", "models", "scoring", "inference", "trained"},
    "cluster": BASE | {"data", "models", "train", "trained"},  # the Ray layer over train
    "serve": {"errors"},
    "version_rules": {"config", "scoring"},  # scoring: metrics.headline (pure)
    "stages": BASE | {"data", "models", "scoring", "inference", "trained", "render",
                       "train", "cluster", "serve", "version_rules"},
    "cli": BASE | {"stages", "serve"},
    "__main__": {"cli"},
}
# an allowed arrow that is only as wide as this: data builds the models' Batch
KNOWN = {("data", "models"): {"rcpipe.models.batch.Batch"}}


def package_of(path: Path) -> str:
    parts = path.relative_to(ROOT / "rcpipe").with_suffix("").parts
    return parts[0]


def violations(files: dict[str, str]) -> list[str]:
    """Imports that break the floors, for files given as {path under rcpipe/: source}."""
    found = []
    for rel, source in files.items():
        path = ROOT / "rcpipe" / rel
        path_pkg = package_of(path)
        for module, name in _imports_of_source(source):
            if module.split(".")[0] == "flows":
                found.append(f"rcpipe/{rel} imports {module}: nothing in rcpipe imports flows")
                continue
            if not module.startswith("rcpipe"):
                continue
            parts = module.split(".")
            target = parts[1] if len(parts) > 1 else name
            if target in (path_pkg, "__version__"):  # rcpipe.__version__: a constant
                continue
            if target not in ALLOWED.get(path_pkg, set()):
                found.append(f"rcpipe/{rel} imports {module}: {path_pkg} may not import "
                             f"{target}")
            elif (path_pkg, target) in KNOWN and f"{module}.{name}" not in \
                    KNOWN[(path_pkg, target)]:
                found.append(f"rcpipe/{rel} imports {module}.{name}: only "
                             f"{sorted(KNOWN[(path_pkg, target)])} from {target}")
    return found


def _imports_of_source(source: str) -> Iterator[tuple[str, str]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                yield node.module, a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, ""


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT / "rcpipe")): p.read_text()
            for p in sorted((ROOT / "rcpipe").rglob("*.py"))}


def test_every_package_is_on_the_map() -> None:
    packages = {package_of(ROOT / "rcpipe" / rel) for rel in _sources()} - {"__init__"}
    assert packages <= set(ALLOWED), sorted(packages - set(ALLOWED))


def test_no_import_runs_back_up_a_floor() -> None:
    assert violations(_sources()) == []


@pytest.mark.parametrize(("rel", "line"), [
    ("trained/x.py", "from rcpipe.train.loop import EMA"),  # a model's file needs no training
    ("scoring/x.py", "from rcpipe.render import plots"),  # scoring draws nothing
    ("train/x.py", "from rcpipe.cluster import train_job"),  # training is readable without Ray
    ("inference/x.py", "from rcpipe.trained import onnx"),  # reading takes any nn.Module
    ("data/x.py", "from rcpipe.models import build_model"),  # data builds batches only
    ("models/x.py", "from rcpipe.data.dataset import Batch"),  # models never import data
    ("data/x.py", "from rcpipe.models.layers import OOV"),  # only Batch from models
    ("train/x.py", "import flows.train_all"),  # nothing in rcpipe imports flows
    ("config.py", "from rcpipe.stages import train"),
    ("variants.py", "from rcpipe.models import bidaf"),  # the registry names families only
])
def test_the_check_finds_an_import_that_breaks_the_floors(rel: str, line: str) -> None:
    assert len(violations({rel: line + "\n"})) == 1


def test_the_map_is_linked_from_the_readme() -> None:
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
    assert "../shared" not in (ROOT / "README.md").read_text()
