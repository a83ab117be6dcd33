"""Each file name of a contract is spelled by its owner only: the prepared directory's by
data/prepared.py, a run's outputs by layout.py, a package's by trained/package_dir.py, an
exported graph's by trained/onnx.py. Everything else names them through the owner."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OWNERS = ("data/prepared.py", "layout.py", "trained/package_dir.py", "trained/onnx.py")
# what a name of a file looks like (a stem and one of the contracts' suffixes)
FILE_NAME = re.compile(r"^[\w-]+(\.[\w-]+)*\.(json|parquet|npy|pt|html|onnx|safetensors|md)$")
# the names issue 34 found spelled in many modules: each must have an owner
NAMED = ("train.parquet", "dev.parquet", "heldout.parquet", "heldout.json", "vocab.json",
         "meta.json", "word_emb.npy", "report.json", "summary.json", "metrics.json")


def _constant_names(node: ast.AST) -> set[str]:
    """The file names an owner's assignment gives its UPPER_CASE names."""
    if isinstance(node, ast.Assign):
        targets, value = node.targets, node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        targets, value = [node.target], node.value
    else:
        return set()
    names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if not names or not all(n.isupper() for n in names):
        return set()
    return {c.value for c in ast.walk(value) if isinstance(c, ast.Constant)
            and isinstance(c.value, str) and FILE_NAME.match(c.value)}


def owned() -> dict[str, set[str]]:
    """name -> the owners that define it (a name may belong to two contracts: meta.json is
    the prepared directory's and a checkpoint's)."""
    found: dict[str, set[str]] = {}
    for owner in OWNERS:
        tree = ast.parse((ROOT / "rcpipe" / owner).read_text())
        bodies = [tree.body, *(c.body for c in tree.body if isinstance(c, ast.ClassDef))]
        for statement in (s for body in bodies for s in body):
            for name in _constant_names(statement):
                found.setdefault(name, set()).add(owner)
    return found


def _prose(tree: ast.AST) -> set[int]:
    """ids of the string statements (docstrings and the like): words for people."""
    return {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}


def violations(files: dict[str, str], owners: dict[str, set[str]],
               elsewhere: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
    """String constants outside their owner equal to an owned name or holding one as a
    path part, for files given as {path under rcpipe/: source}; ``elsewhere``: (file, name)
    pairs where the name means another file than the contract's."""
    found = []
    for rel, source in files.items():
        tree = ast.parse(source)
        prose = _prose(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or \
                    id(node) in prose:
                continue
            parts = set(re.split(r"[/\\]", node.value))
            for name in sorted(parts & set(owners)):
                if rel not in owners[name] and (rel, name) not in elsewhere:
                    found.append(f"rcpipe/{rel}:{node.lineno}: {node.value!r} spells {name}, "
                                 f"a name of {' and '.join(sorted(owners[name]))}")
    return found


def test_every_name_found_spelled_about_has_an_owner() -> None:
    owners = owned()
    assert set(NAMED) <= set(owners), sorted(set(NAMED) - set(owners))
    assert owners["train.parquet"] == {"data/prepared.py"}
    assert owners["summary.json"] == {"layout.py"}
    assert owners["vocab.json"] == {"data/prepared.py", "trained/package_dir.py"}


# names that mean another file than the contract's where these modules spell them:
# docs_reference keeps the repository's front page (its command table), not a package's card
ELSEWHERE = frozenset({("docs_reference.py", "README.md")})


def test_only_the_owners_spell_their_names() -> None:
    files = {str(p.relative_to(ROOT / "rcpipe")): p.read_text()
             for p in sorted((ROOT / "rcpipe").rglob("*.py"))}
    assert violations(files, owned(), ELSEWHERE) == []


@pytest.mark.parametrize(("source", "count"), [
    ('p = out / "vocab.json"\n', 1),
    ('p = f"{out}/models/{v}/summary.json"\n', 1),  # a path part of an f-string
    ("p = Path('data/prepared/train.parquet')\n", 1),
    ('def f():\n    """Reads vocab.json and meta.json."""\n', 0),  # a docstring: prose
    ('raise InputError(p, "", "no vocab.json here")\n', 0),  # a sentence, not a path
    ('p = out / Prepared.VOCAB\n', 0),
])
def test_the_check_finds_a_name_spelled_outside_its_owner(source: str, count: int) -> None:
    owners = owned()
    assert len(violations({"stages/x.py": source}, owners)) == count
    assert violations({"data/prepared.py": 'p = out / "vocab.json"\n'}, owners) == []
