"""What a stage's outputs were made from, as one key: work whose inputs did not change is
not done again, and work whose inputs changed is never skipped.

A key (`Fingerprint`) holds the files a stage reads (each file's sha256), the settings it
reads, its code (each file of its entry module's import closure, rcpipe/pipeline/code.py:
the code deps dvc.yaml lists for it) and rcpipe's version; one record format,
`Fingerprint.as_dict`, wherever it is kept. A stage's key is built from its row of the table
(rcpipe/pipeline/stages.py, `of_stage`), the row dvc.yaml is generated from: no stage module
lists its inputs again. Where each is kept: a training run's in summary.json and runs.json
(rcpipe.stages.train trains anew when it differs from the finished model's, resumes a run of
the same key, does nothing when the finished model has it); prepare's in its meta.json,
written in the same set as its outputs; evaluate's, ensemble's and report's as a stamp
(`Stamp`), written after their outputs, so a run killed before the end leaves the old stamp
and the next one redoes the work. `rcpipe tune`, no stage of the table, keys its search the
same way (rcpipe/stages/tune.py). Files count by content (word vectors run to GB: a large
file's digest is remembered in layout.DIGESTS by path, size and modification time, as DVC
remembers its hashes, so an unchanged input is recognised without reading it).

With the code in the key a stage skips exactly when DVC would not run it, so dvc.yaml
passes no --force (docs/architecture.md, "Three ways to skip finished work").

Settings that only say where or how fast to run are not part of any key (`UNKEYED`, the
keys dvc.yaml leaves out of the train stage's params too): a cluster run may set them
without training again.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcpipe import __version__, layout, reads
from rcpipe.config import Config
from rcpipe.config.section import flatten
from rcpipe.errors import InputError
from rcpipe.pipeline.code import ROOT, closure
from rcpipe.pipeline.stages import CACHE, SOURCES, VARIANT, stage

STAMP_BYTES = 10_000_000  # a stamp names each file read with its digest: KB, not MB
_digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> sha256: read once
# a file this large is remembered across processes too (layout.DIGESTS): word vectors run
# to GB, read in seconds each, and every prepare and every night asks for their key
KEPT_BYTES = 32 << 20
MEMO_BYTES = 1_000_000  # the memo: a line per large file


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, remembered while its size and modification time hold: in
    this process, and for a large file in layout.DIGESTS (as DVC's state remembers its
    hashes: a file rewritten with the same size and time keeps its old digest)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _digests:
        return _digests[key]
    kept = _memo() if stat.st_size >= KEPT_BYTES else {}
    said = kept.get(key[0])
    if isinstance(said, list) and said[:2] == [key[1], key[2]] and isinstance(said[2], str):
        _digests[key] = said[2]
        return said[2]
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    _digests[key] = h.hexdigest()
    if stat.st_size >= KEPT_BYTES:
        try:  # a memo: another process writing it at once loses a line, read again later
            layout.write_json(layout.DIGESTS, kept | {key[0]: [key[1], key[2], _digests[key]]})
        except OSError:
            pass  # a read-only workspace: read again next time
    return _digests[key]


def _memo() -> dict[str, Any]:
    """layout.DIGESTS: path -> [size, mtime_ns, sha256]; {} when absent or unreadable."""
    try:
        found = reads.parse_json(reads.read_bytes(layout.DIGESTS, MEMO_BYTES, "the digest "
                                                  "memo's cap"), layout.DIGESTS)
    except (OSError, InputError):
        return {}
    return found if isinstance(found, dict) else {}


def source_identity(uri: str) -> str:
    """A data source as a key: a local file by its digest, a URL by itself (the download
    cache holds one version per URL)."""
    path = Path(uri)
    return file_digest(path) if "://" not in uri and path.is_file() else uri


def code_of(name: str) -> dict[str, str]:
    """Stage ``name``'s code: each file of its entry module's import closure (the files
    dvc.yaml's code deps cover) -> sha256."""
    return code_from(stage(name).entry)


def code_from(entry: str) -> dict[str, str]:
    """Each file of ``entry``'s import closure (a path under the repository) -> sha256: a
    command's code where it is no stage of the table (`rcpipe tune`)."""
    return {f: file_digest(ROOT / f) for f in sorted(closure(entry))}


@dataclass(frozen=True)
class Fingerprint:
    """files: name -> sha256 (prepare's inputs: size and modification time); settings:
    dotted key -> value; code: the stage's files -> sha256 (`code_of`); rcpipe: the
    version."""

    files: Mapping[str, str]
    settings: Mapping[str, Any]
    code: Mapping[str, str] = field(default_factory=dict)
    rcpipe: str = __version__

    def as_dict(self) -> dict[str, Any]:
        return {"files": dict(self.files), "settings": dict(self.settings),
                "code": dict(self.code), "rcpipe": self.rcpipe}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Fingerprint:
        return cls(dict(d.get("files", {})), dict(d.get("settings", {})),
                   dict(d.get("code", {})), str(d.get("rcpipe", "")))

    @property
    def digest(self) -> str:
        blob = json.dumps(self.as_dict(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def changes(self, before: Fingerprint | None) -> str | None:
        """What differs from ``before``, in one phrase for people; None when nothing does."""
        if before is None:
            return "no finished run"
        said = []
        if files := _differing(before.files, self.files):
            said.append(f"data changed ({', '.join(files)})")
        if keys := _differing(before.settings, self.settings):
            shown = [f"{k} {before.settings.get(k, '(unset)')} -> "
                     f"{self.settings.get(k, '(unset)')}" for k in keys[:3]]
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            said.append(f"settings changed ({', '.join(shown)}{more})")
        if files := _differing(before.code, self.code):
            more = f" and {len(files) - 3} more" if len(files) > 3 else ""
            said.append(f"code changed ({', '.join(files[:3])}{more})")
        if before.rcpipe != self.rcpipe:
            said.append(f"rcpipe changed ({before.rcpipe or '?'} -> {self.rcpipe})")
        return "; ".join(said) or None


def _differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def of_stage(cfg: Config, name: str, variant: str = "", models: Sequence[str] = (),
             each: Sequence[Path] | None = None, args: Mapping[str, Any] | None = None
             ) -> Fingerprint:
    """Stage ``name``'s key from its row of the table (rcpipe/pipeline/stages.py), as
    dvc.yaml has it: the params keys the row lists with cfg's values, the files it lists
    (each of ``models``' files, then its deps, then what it reads that no stage makes) and
    its code. A folder counts by every file in it; the download cache by the sources its
    params name (`SOURCES`: a local file by content, a URL by itself). ``each``: the models'
    files when the user named them (``rcpipe ensemble --inputs``); ``args``: the command's
    own choices (where it writes)."""
    row = stage(name)
    tree = cfg.model_dump(mode="json")
    settings: dict[str, Any] = {}
    for key in row.keys():
        key = key.replace(VARIANT, variant)
        if key.startswith("models."):  # the variant's effective model: defaults included
            value: Any = cfg.model_of(key.split(".", 1)[1]).model_dump(mode="json")
        else:
            value = _at(tree, key)
        if isinstance(value, str) and Path(value).is_absolute():
            value = _here(Path(value))  # a path as a stamp names it: moved with the run
        settings |= flatten({key: value}) if isinstance(value, dict) and value else {key: value}
    # a source counts as its content, not by its name: a copied file prepares nothing again
    files = {key: source_identity(str(uri)) if uri else str(uri)
             for key, uri in settings.items() if key in SOURCES}
    settings = {k: v for k, v in settings.items() if k not in SOURCES}
    named = row.reads(models, variant) if each is None else [*map(str, each), *row.deps(variant)]
    for path in [*named, *row.unstaged()]:
        if path != CACHE:  # counted by its sources, above
            files |= _contents(Path(re.sub(r"\$\{([\w.]+)\}",
                                           lambda m: str(_at(tree, m.group(1))), path)))
    return Fingerprint(files, settings | flatten(dict(args or {})), code_of(name))


def _at(tree: Mapping[str, Any], key: str) -> Any:
    """The value at dotted ``key``; one the config lacks is the table's bug: a KeyError."""
    for part in key.split("."):
        tree = tree[part]
    return tree


def _contents(path: Path) -> dict[str, str]:
    """A file's digest, or a folder's every file's (names with a dot first left out: the
    locks and journals beside outputs), by the name a stamp gives it; "missing" when not
    there."""
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        return {_here(p): file_digest(p) for p in found}
    return {_here(path): file_digest(path) if path.is_file() else "missing"}


# ------------------------------------------------------------------------------------ stamps


def _here(path: Path) -> str:
    """A file's name in a stamp: relative to the run directory when inside it, so a run
    directory moved or copied whole keeps its stamps."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path.resolve())


@dataclass(frozen=True)
class Stamp:
    """A stage's key (`of_stage`), kept at layout.stamp(name) after its outputs are
    written."""

    name: str  # e.g. "evaluate-bidaf"
    fingerprint: Fingerprint

    def is_current(self, outputs: Iterable[Path]) -> bool:
        """Whether the kept stamp is this one and every output is in place."""
        if not all(p.is_file() for p in outputs):
            return False
        path = layout.stamp(self.name)
        if not path.exists() and not path.is_symlink():
            return False
        # a FIFO or device there would block the read: refused by reads, one line
        data = reads.read_bytes(path, STAMP_BYTES, "a stamp's cap")
        try:
            kept = reads.parse_json(data, path)
        except InputError:
            return False
        return isinstance(kept, dict) and kept.get("digest") == self.fingerprint.digest

    def keep(self) -> None:
        """Record the stamp: call after the outputs are written."""
        layout.write_json(layout.stamp(self.name),
                          {"digest": self.fingerprint.digest} | self.fingerprint.as_dict())
