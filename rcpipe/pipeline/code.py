"""The code a stage runs: the rcpipe files its entry module imports, transitively (imports
inside functions and under TYPE_CHECKING counted), read from the source, not by importing.

dvc.yaml lists them as each stage's code deps, so editing a module reruns exactly the
stages that run it.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# modules that only print, log or define the error type: not a reason to rerun anything;
# nor this package (the table, this reading of imports, dvc.yaml's making), which says when
# a stage runs, not what it writes: a row added must not rerun every stage whose key
# (rcpipe/fingerprints.py) reads the table
NOT_DEPS = frozenset({"rcpipe/console.py", "rcpipe/logs.py", "rcpipe/errors.py",
                      "rcpipe/__init__.py", "rcpipe/pipeline/__init__.py",
                      "rcpipe/pipeline/stages.py", "rcpipe/pipeline/code.py",
                      "rcpipe/pipeline/dvc_yaml.py"})


def module_file(name: str) -> str | None:
    """``rcpipe.a.b``'s file relative to the repo (a module or a package's __init__)."""
    path = ROOT / Path(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return str(candidate.relative_to(ROOT))
    return None


@cache
def imports(path: str) -> frozenset[str]:
    """The rcpipe files ``path`` imports anywhere in it (functions included)."""
    from rcpipe.variants import REGISTRY

    found: set[str | None] = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rcpipe"):
            subs = {module_file(f"{node.module}.{a.name}") for a in node.names} - {None}
            # `from rcpipe.data import features` imports the module, not the package's body
            if len(subs) < len(node.names):
                found.add(module_file(node.module or ""))
            found |= subs
        elif isinstance(node, ast.Import):
            found |= {module_file(a.name) for a in node.names if a.name.startswith("rcpipe")}
    if path == "rcpipe/models/__init__.py":  # builds each variant from the family it names
        found |= {module_file(v.family) for v in REGISTRY.values()}
    return frozenset(f for f in found if f)


def closure(entry: str) -> set[str]:
    """Every rcpipe file ``entry`` runs, less NOT_DEPS."""
    seen: set[str] = set()
    todo = [entry]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo += imports(current)
    return seen - NOT_DEPS


def code_deps(entry: str) -> list[str]:
    """``entry``'s closure as dvc.yaml lists it: a folder where every module under it is
    run, each file otherwise; sorted."""
    files = closure(entry)
    folders = sorted({str(Path(f).parent) for f in files} - {"rcpipe"}, key=len)
    whole: list[str] = []
    for folder in folders:
        if any(folder.startswith(w + "/") for w in whole):
            continue
        under = {str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*.py")} - NOT_DEPS
        if under <= files:
            whole.append(folder)
    rest = [f for f in files if not any(f.startswith(w + "/") for w in whole)]
    return sorted([*whole, *rest])
