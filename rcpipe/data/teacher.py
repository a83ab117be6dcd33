"""The teacher's targets for distillation (`rcpipe distill`): for each row of the prepared
training split, the ensemble's start and end distributions over [no-answer, token 0 ..
Lc-1] of that row's context (index 0 holds 0 on SQuAD v1.1), as the student reads them
beside the row.

    models/student/teacher/part-00000.parquet   the training split's part names, each cut
                          part-00001.parquet   into the same row groups as its part
                          teacher.json         the training split's manifest they are of,
                                               and the teacher (members, method, weights)

Cut as the training split is, row group for row group, so that a rank's stream reads a
row group's targets beside its rows (data/stream.py) and holds no more of them than of the
rows: no join, no index, whatever the split's size. A folder of another preparation (the
manifest differs) or a row group whose ids are not the rows' is one located line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rcpipe import reads
from rcpipe.data.shards import Shards, Unit, manifest
from rcpipe.errors import InputError

PROBS = pa.list_(pa.float32())  # (1 + Lc,) a distribution over [no-answer, tokens]
SCHEMA = pa.schema([pa.field("id", pa.string(), nullable=False),
                    pa.field("teacher_start", PROBS), pa.field("teacher_end", PROBS)])
COLUMNS = ("teacher_start", "teacher_end")  # what a training row gains (data/dataset.py)
RECORD = "teacher.json"
RECORD_BYTES = 1 << 20
AGAIN = "run `rcpipe distill` again"

# a row group's rows -> each row's (p_start, p_end), each (1 + Lc,) float32
Targets = Callable[[pa.Table], Iterator[tuple[np.ndarray, np.ndarray]]]


@dataclass(frozen=True)
class TeacherTargets:
    """A teacher's targets folder, checked against the training split it is read beside."""

    folder: Path
    train: Shards
    about: dict[str, Any]  # who the teacher is: teacher.json's "teacher"

    @classmethod
    def open(cls, folder: Path, train: Shards) -> TeacherTargets:
        """The folder's targets of ``train``; one line when it holds another split's."""
        record_file, record = folder / RECORD, read_record(folder)
        want = manifest(train.parts, train.vocab)
        if record.get("train") != want:
            raise InputError(record_file, "train", "the targets of another preparation of "
                             f"the training split than {train.folder}'s; {AGAIN}")
        return cls(folder, train, dict(record.get("teacher") or {}))

    def beside(self, unit: Unit, rows: pa.Table) -> pa.Table:
        """``rows`` (row group ``unit`` of the training split, whole) with their targets."""
        path = self.folder / self.train.parts[unit.part].name
        try:
            found = pq.ParquetFile(path).read_row_group(unit.group)
        except (OSError, pa.ArrowInvalid, IndexError) as e:
            raise InputError(path, f"row group {unit.group}", f"unreadable ({e}); {AGAIN}"
                             ) from None
        if found.column("id") != rows.column("id"):
            raise InputError(path, f"row group {unit.group}", "not the targets of the "
                             f"training rows it stands for; {AGAIN}")
        for name in COLUMNS:
            rows = rows.append_column(name, found.column(name))
        return rows


def read_record(folder: Path) -> dict[str, Any]:
    """The folder's teacher.json: {"train": the split's manifest, "teacher": who}; one
    located line when it is not there or not an object."""
    record_file = folder / RECORD
    if not record_file.is_file():
        raise InputError(record_file, "", f"no teacher's targets here; {AGAIN}")
    record = reads.parse_json(reads.read_bytes(record_file, RECORD_BYTES,
                                               "a teacher record's cap"), record_file)
    if not isinstance(record, dict):
        raise InputError(record_file, "", f"not a teacher record; {AGAIN}")
    return record


def write(folder: Path, train: Shards, targets: Targets, teacher: dict[str, Any],
          on_group: Callable[[int], None] = lambda rows: None) -> None:
    """``targets`` of every row group of ``train`` into ``folder`` (a fresh one: the caller
    moves it in whole), cut as ``train`` is, then teacher.json; ``on_group``: each row
    group's rows as it is written (progress)."""
    folder.mkdir(parents=True, exist_ok=True)
    units = train.units()
    for i, part in enumerate(train.parts):
        with pq.ParquetWriter(folder / part.name, SCHEMA, compression="zstd") as out:
            for unit in (u for u in units if u.part == i):
                rows = train.read(unit)
                p1, p2 = zip(*targets(rows), strict=True) if rows.num_rows else ((), ())
                out.write_table(pa.table({"id": rows.column("id"), "teacher_start": list(p1),
                                          "teacher_end": list(p2)}, schema=SCHEMA),
                                row_group_size=max(1, rows.num_rows))
                on_group(rows.num_rows)
    (folder / RECORD).write_text(json.dumps({"train": manifest(train.parts, train.vocab),
                                             "teacher": teacher}, indent=1) + "\n")
