"""A prepared split on disk: a folder of Parquet part files, each in row groups.

    <data.out_dir>/train/part-00000.parquet   at most data.shards.file_rows rows a file,
                        part-00001.parquet   each in row groups of data.shards.group_rows

Files *and* row groups, each for its own reason. A file is what one writer makes (a prepare
task on a cluster writes its own; no process ever holds or copies a whole split) and what
DVC and S3 move; a row group is what a reader holds: the unit a training stream permutes,
hands to a rank and reads (data/stream.py), the smallest read that Parquet's footer can
address without reading the rest of the file.

meta.json's ``"splits"`` is the manifest: each split's files and the rows of each row group
(so a rank plans its epoch from the manifest alone, before it reads a row), and the sha256
of the vocab.json the ids index. Each part file carries that digest in its own footer, so
a part copied in from another preparation, one cut short or one missing a row group is one
located line (``error: <part>: row group 3: ...``), never a model trained on the wrong ids.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rcpipe.data.schema import SCHEMA
from rcpipe.errors import InputError

PART = "part-{:05d}.parquet"
VOCAB_KEY = b"rcpipe.vocab"  # a part's footer: sha256 of the vocab.json its ids index
AGAIN = "run `rcpipe prepare` again"


@dataclass(frozen=True)
class Part:
    """One part file as the manifest records it: its name and each row group's rows."""

    name: str
    groups: tuple[int, ...]

    @property
    def rows(self) -> int:
        return sum(self.groups)


@dataclass(frozen=True)
class Unit:
    """A row group of a split: the ``group``-th of part ``part``, ``rows`` rows, the first
    of which is row ``first`` of the split (parts and groups in order)."""

    part: int
    group: int
    rows: int
    first: int


@dataclass(frozen=True)
class Shards:
    """A split's folder and manifest; every read checks the part against the manifest."""

    folder: Path
    parts: tuple[Part, ...]
    vocab: str
    _checked: set[int] = field(default_factory=set, compare=False, repr=False)
    # the part read last, opened: a buffer's row groups come part by part (one file open)
    _last: dict[int, pq.ParquetFile] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_manifest(cls, folder: Path, record: Any, where: Path) -> Shards:
        """The split in ``folder`` as meta.json (``where``) records it: {"vocab": sha256,
        "parts": [{"file": name, "groups": [rows, ...]}, ...]}."""
        try:
            parts = tuple(Part(_part_name(p["file"]), tuple(int(n) for n in p["groups"]))
                          for p in record["parts"])
            vocab = str(record["vocab"])
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(where, f"splits.{folder.name}", f"not a manifest of part files "
                             f"({type(e).__name__}: {e}); {AGAIN}") from None
        return cls(folder, parts, vocab)

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    def units(self) -> list[Unit]:
        """Every row group of the split, in order."""
        out, first = [], 0
        for i, part in enumerate(self.parts):
            for g, n in enumerate(part.groups):
                out.append(Unit(i, g, n, first))
                first += n
        return out

    def path(self, part: int) -> Path:
        return self.folder / self.parts[part].name

    def open(self, part: int) -> pq.ParquetFile:
        """Part ``part``'s file, checked (once) against the manifest: readable, this
        vocabulary's ids, every row group there with the rows recorded."""
        if part in self._last:
            return self._last[part]
        path = self.path(part)
        try:
            f = pq.ParquetFile(path)
        except FileNotFoundError:
            raise InputError(path, "", f"a part of the split is missing; {AGAIN}") from None
        except (OSError, pa.ArrowInvalid) as e:
            raise InputError(path, "", f"not a readable Parquet file ({e}); {AGAIN}") from None
        if part not in self._checked:
            self._check(part, f)
            self._checked.add(part)
        self._last.clear()
        self._last[part] = f
        return f

    def _check(self, part: int, f: pq.ParquetFile) -> None:
        path, want = self.path(part), self.parts[part].groups
        vocab = (f.schema_arrow.metadata or {}).get(VOCAB_KEY, b"").decode(errors="replace")
        if vocab != self.vocab:
            raise InputError(path, "footer rcpipe.vocab", f"ids of another vocabulary "
                             f"({vocab[:12] or 'none'}, this folder's vocab.json is "
                             f"{self.vocab[:12]}); {AGAIN}")
        missing = [c.name for c in SCHEMA if c.name not in f.schema_arrow.names]
        if missing:
            raise InputError(path, "", f"missing columns {missing}; {AGAIN}")
        have = tuple(f.metadata.row_group(g).num_rows for g in range(f.num_row_groups))
        for g in range(max(len(want), len(have))):
            if g >= len(have) or g >= len(want) or have[g] != want[g]:
                said = f"{want[g]} rows" if g < len(want) else "nothing"
                found = f"{have[g]} rows" if g < len(have) else "missing"
                raise InputError(path, f"row group {g}", f"{found}; meta.json records "
                                 f"{said} ({len(want)} row groups); {AGAIN}")

    def check(self) -> None:
        """Every part against the manifest (its footer only): a driver finds a bad part in
        seconds, before any job starts."""
        for i in range(len(self.parts)):
            self.open(i)

    def read(self, unit: Unit, columns: Sequence[str] | None = None) -> pa.Table:
        """One row group (``columns`` of it, or all)."""
        f = self.open(unit.part)
        try:
            return f.read_row_group(unit.group, columns=columns)
        except (OSError, pa.ArrowInvalid) as e:
            raise InputError(self.path(unit.part), f"row group {unit.group}",
                             f"unreadable ({e}); {AGAIN}") from None

    def tables(self, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """The split's row groups in order, one at a time."""
        for unit in self.units():
            yield self.read(unit, columns)

    def chunks(self, rows: int) -> Iterator[pa.Table]:
        """The split in order, whole row groups of at least ``rows`` rows at a time (the
        last chunk: what is left): a split of at most ``rows`` rows is one chunk."""
        held: list[pa.Table] = []
        for table in self.tables():
            held.append(table)
            if sum(t.num_rows for t in held) >= rows:
                yield pa.concat_tables(held)
                held = []
        if held or not self.rows:
            yield pa.concat_tables(held) if held else SCHEMA.empty_table()

    def read_all(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The whole split as one table (dev, held-out: the sets a model is scored on)."""
        tables = list(self.tables(columns))
        schema = SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])
        return pa.concat_tables(tables) if tables else schema.empty_table()


def _part_name(name: Any) -> str:
    """A manifest's file name: a plain part name, nothing that leaves the folder."""
    if not isinstance(name, str) or "/" in name or not name.endswith(".parquet") \
            or name.startswith("."):
        raise ValueError(f"{str(name)[:80]!r} is not a part file's name")
    return name


class SplitWriter:
    """Writes a split's rows, as they come, into part files of at most ``file_rows`` rows
    in row groups of ``group_rows``; ``path(name)`` says where each file goes (prepare's
    output set stages it). Holds at most one row group's rows."""

    def __init__(self, path: Any, file_rows: int, group_rows: int, vocab: str) -> None:
        self._path, self.file_rows, self.group_rows = path, file_rows, group_rows
        self.vocab = vocab
        self.schema = SCHEMA.with_metadata({**(SCHEMA.metadata or {}),
                                            VOCAB_KEY: vocab.encode()})
        self.parts: list[Part] = []
        self._writer: pq.ParquetWriter | None = None
        self._groups: list[int] = []
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        if kind is not None and self._writer is not None:  # a full disk: no file left open
            try:
                self._writer.close()
            except OSError:
                pass
            self._writer = None

    def write(self, table: pa.Table) -> None:
        """Append rows (any number); full row groups are written out."""
        self._pending.append(table.cast(SCHEMA))
        self._pending_rows += table.num_rows
        while self._pending_rows >= self._group_limit():
            self._flush(self._group_limit())

    def _group_limit(self) -> int:
        """The next row group's rows: a full group, or what the current file has room for."""
        left = self.file_rows - sum(self._groups)
        return min(self.group_rows, left)

    def _flush(self, n: int) -> None:
        rows = pa.concat_tables(self._pending).combine_chunks()
        group, rest = rows.slice(0, n), rows.slice(n)
        self._pending, self._pending_rows = [rest], rest.num_rows
        if self._writer is None:
            name = PART.format(len(self.parts))
            self._writer = pq.ParquetWriter(self._path(name), self.schema, compression="zstd")
            self.parts.append(Part(name, ()))
        self._writer.write_table(group.replace_schema_metadata(self.schema.metadata),
                                 row_group_size=n)
        self._groups.append(n)
        if sum(self._groups) >= self.file_rows:
            self._close_file()

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self.parts[-1] = Part(self.parts[-1].name, tuple(self._groups))
            self._writer, self._groups = None, []

    def close(self) -> dict[str, Any]:
        """The last rows written; the split's manifest entry (meta.json's "splits")."""
        if self._pending_rows:
            self._flush(self._pending_rows)
        self._close_file()
        if not self.parts:  # an empty split is one empty file: readers find its schema
            name = PART.format(0)
            path = self._path(name)
            pq.write_table(self.schema.empty_table(), path, compression="zstd")
            meta = pq.ParquetFile(path).metadata  # pyarrow writes one group of 0 rows
            self.parts.append(Part(name, tuple(meta.row_group(g).num_rows
                                               for g in range(meta.num_row_groups))))
        return manifest(self.parts, self.vocab)


def manifest(parts: Sequence[Part], vocab: str) -> dict[str, Any]:
    return {"vocab": vocab, "rows": sum(p.rows for p in parts),
            "parts": [{"file": p.name, "groups": list(p.groups)} for p in parts]}
