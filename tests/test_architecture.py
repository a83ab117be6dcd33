"""The floors of docs/architecture.md: which rcpipe package may import which."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BASE = {"config", "errors", "console", "logs", "layout", "fingerprints", "variants", "outputs",
        "locks", "reads", "safe_open", "retry"}
# package -> the rcpipe packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "config": {"errors", "variants", "reads"},
    "variants": set(),
    "errors": set(),
    "reads": {"errors"},  # a user's file read within its caps, JSON and YAML depth bounded
    "console": set(),
    "logs": {"console"},  # rich's handler writes on the console the bars use
    "safe_open": {"errors", "reads"},  # writing beside outputs: no link followed, no wait
    "layout": {"safe_open", "variants"},  # variants: the student's name beside theirs
    # what a run's and a stage's outputs were made from
    "fingerprints": {"config", "errors", "layout", "reads", "pipeline"},  # pipeline: a stage's code
    "outputs": {"safe_open", "errors", "reads"},  # a stage's files as one set, its journal read
    "locks": {"errors", "reads", "safe_open"},  # one run at a time per output; the holder's line
    "retry": set(),  # the one retry policy: tries, backoff, a deadline
    # models: the Batch type only; outputs: a half-moved prepared set finished before a read
    "data": {"config", "errors", "console", "models", "reads", "outputs", "retry"},
    "models": {"config", "variants"},
    "scoring": set(),  # official scoring and the paired comparison: pure, no torch
    "inference": {"config", "errors", "data", "models", "layout", "scoring"},
    # inference: a Reader over trained models (reader.py), as every answering command loads one
    "trained": {"config", "errors", "reads", "data", "models", "layout", "outputs", "inference"},
    "render": {"data", "models", "scoring", "inference", "layout"},
    "train": BASE | {"data", "models", "scoring", "inference", "trained"},
    "cluster": BASE | {"data", "models", "train", "trained"},  # the Ray layer over train
    # config: the guard alone (python -m) reads the params; reads: what counts as blank
    "serve": {"errors", "config", "reads"},
    # releasing a run: the rules (pure), the remote's records, the champion, the gate, the
    # nights page (render)
    "release": BASE | {"data", "scoring", "inference", "trained", "render"},
    # the champion app: the remote's champion, on the answer service's deployments
    "champion": BASE | {"data", "models", "inference", "trained", "release", "serve"},
    "pipeline": {"config", "layout", "variants"},  # the stage table; dvc.yaml made from it
    "stages": BASE | {"data", "models", "scoring", "inference", "trained", "render",
                       "train", "cluster", "serve", "release"},
    "cli": BASE | {"stages", "serve"},
    # docs/reference/ made from the commands and the params
    # (and the guide's tables made from the variants and their families' attention views)
    "docs_reference": {"cli", "config", "variants", "models"},
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
    ("data/x.py", "from rcpipe.models.embeddings import OOV"),  # only Batch from models
    ("train/x.py", "import flows.train_all"),  # nothing in rcpipe imports flows
    ("config/load.py", "from rcpipe.stages import train"),
    ("variants.py", "from rcpipe.models import bidaf"),  # the registry names families only
])
def test_the_check_finds_an_import_that_breaks_the_floors(rel: str, line: str) -> None:
    assert len(violations({rel: line + "\n"})) == 1


# flows/ and bench/ sit above rcpipe. Flows call stages only: a flow is Prefect tasks around
# rcpipe.stages, given what a stage is called with (config, variants), where its outputs lie
# (layout) and the logs (logs, console, errors); reads, the one capped JSON reader, for the
# files the stages wrote; the stage table (pipeline), whose order
# train-all walks; scoring for metrics.headline alone, the pure
# (EM, F1) of a metrics file a stage wrote, which the scores table shows as `rcpipe report`
# does (a stage passing it on would be an alias). Bench measures anything of rcpipe and may
# run the flows. Neither imports tests/ (tests import them), and flows never import bench.
FLOWS = {"stages", "config", "layout", "logs", "console", "variants", "errors", "scoring",
         "pipeline", "reads"}
KNOWN_ABOVE = {("flows", "scoring"): {"rcpipe.scoring.metrics.headline"}}


def violations_above(files: dict[str, str]) -> list[str]:
    """Imports that break the rules of flows/ and bench/, for files given as {path under the
    repository: source}."""
    found = []
    for rel, source in files.items():
        top = Path(rel).parts[0]
        for module, name in _imports_of_source(source):
            parts = module.split(".")
            if parts[0] == "tests" or (top, parts[0]) == ("flows", "bench"):
                found.append(f"{rel} imports {module}: {top} may not import {parts[0]}")
                continue
            if top != "flows" or parts[0] != "rcpipe":
                continue  # bench: anything of rcpipe and flows, and its own scripts
            target = parts[1] if len(parts) > 1 else name
            if target == "__version__":
                continue
            if target not in FLOWS:
                found.append(f"{rel} imports {module}: flows call stages, not {target}")
            elif (top, target) in KNOWN_ABOVE and f"{module}.{name}" not in \
                    KNOWN_ABOVE[(top, target)]:
                found.append(f"{rel} imports {module}.{name}: only "
                             f"{sorted(KNOWN_ABOVE[(top, target)])} from {target}")
    return found


def _sources_above() -> dict[str, str]:
    # bench/out/ holds the outputs of bench runs (copies of earlier trees among them): not code
    return {str(p.relative_to(ROOT)): p.read_text()
            for top in ("flows", "bench") for p in sorted((ROOT / top).rglob("*.py"))
            if (ROOT / "bench" / "out") not in p.parents}


def test_flows_call_stages_and_nothing_above_rcpipe_imports_tests() -> None:
    files = _sources_above()
    assert any(f.startswith("flows/") for f in files) and any(f.startswith("bench/") for f in files)
    assert violations_above(files) == []


@pytest.mark.parametrize(("rel", "line"), [
    ("flows/x.py", "from rcpipe.cluster.job_runs import check_run_name"),  # through a stage
    ("flows/x.py", "from rcpipe.models import build_model"),  # flows build no model
    ("flows/x.py", "from rcpipe.scoring.compare import paired_difference"),  # headline only
    ("flows/x.py", "import rcpipe.train.local"),
    ("flows/x.py", "from bench.accuracy import PRESETS"),  # a flow runs without the bench
    ("flows/x.py", "from tests.dvc_project import project"),
    ("bench/x.py", "from tests.models.rnet_reference import OpLog"),  # a test helper
    ("bench/gpu/x.py", "import tests.conftest"),
])
def test_the_check_finds_an_import_above_rcpipe_that_breaks_the_rules(rel: str, line: str
                                                                      ) -> None:
    assert len(violations_above({rel: line + "\n"})) == 1


@pytest.mark.parametrize(("rel", "line"), [
    ("flows/x.py", "from rcpipe import layout, stages"),
    ("flows/x.py", "from rcpipe.scoring.metrics import headline"),
    ("flows/x.py", "from flows.logs import rcpipe_logs_to_prefect"),
    ("bench/x.py", "from rcpipe.models.rnet import CharGRU"),  # bench: anything of rcpipe
    ("bench/x.py", "from flows.train_all import train_all"),
    ("bench/x.py", "from accuracy import PRESETS"),  # a bench script beside it
])
def test_what_flows_and_bench_may_import_passes(rel: str, line: str) -> None:
    assert violations_above({rel: line + "\n"}) == []


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def cycles(files: dict[str, str]) -> list[list[str]]:
    """The circles of imports among modules given as {dotted name: source}: every import
    counts, inside a function or under TYPE_CHECKING too (each still says the one module
    needs the other)."""
    edges: dict[str, set[str]] = {m: set() for m in files}
    for module, source in files.items():
        for target, name in _imports_of_source(source):
            full = f"{target}.{name}"
            edges[module].add(full if full in files else target)
    found, index, low, stack, on = [], {}, {}, [], set()

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v] & set(files):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1 or v in edges[v]:
                found.append(sorted(component))

    for v in sorted(files):
        if v not in index:
            visit(v)
    return found


def test_no_imports_run_in_a_circle() -> None:
    files = {_module_name(p): p.read_text() for p in sorted((ROOT / "rcpipe").rglob("*.py"))}
    assert cycles(files) == []


def test_the_check_finds_a_circle() -> None:
    assert cycles({"a.gate": "from a.version import Remote\n",
                   "a.version": "def f():\n    from a import gate\n",
                   "a": "", "a.remote": ""}) == [["a.gate", "a.version"]]
    assert cycles({"a.gate": "from a.remote import Remote\n",
                   "a.version": "from a.gate import Gate\nfrom a.remote import Remote\n",
                   "a.remote": ""}) == []


def test_the_map_is_linked_from_the_readme() -> None:
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
    assert "../shared" not in (ROOT / "README.md").read_text()
