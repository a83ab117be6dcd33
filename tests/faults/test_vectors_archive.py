"""Issue 43: word vectors in an archive are read within caps on what they inflate to: a
zip of 3 MB holding a 3 GB line ended prepare in a MemoryError at 3.3 GB. A line past
LINE_BYTES is one located line; the whole text past limits.vectors_mb is one line too. The
cases run in this process with tracemalloc watching (a 200 MB line: the old reader held it
whole, twice)."""

from __future__ import annotations

import gzip
import os
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from rcpipe.data.vocab import LINE_BYTES, read_vectors
from rcpipe.errors import InputError

CHUNK = b"x" * (1 << 20)


def _zip(path: Path, megabytes: int) -> None:
    """One .txt member: a good line, then one line of ``megabytes`` MB (written in chunks:
    the test never holds it)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, \
            zf.open("glove.txt", "w", force_zip64=True) as f:
        f.write(b"the 0.1 0.2 0.3\n")
        for _ in range(megabytes):
            f.write(CHUNK)
        f.write(b" 1 2 3\n")


def _gz(path: Path, megabytes: int) -> None:
    with gzip.open(path, "wb") as f:
        f.write(b"the 0.1 0.2 0.3\n")
        for _ in range(megabytes):
            f.write(CHUNK)


def _peak(read: Callable[[], object]) -> tuple[InputError, int]:
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as e:
            read()
        return e.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(("make", "name"), [(_zip, "vectors.zip"), (_gz, "vectors.txt.gz")],
                         ids=["zip", "gz"])
def test_a_line_of_200_mb_is_refused_in_bounded_memory(
        tmp_path: Path, make: Callable[[Path, int], None], name: str) -> None:
    path = tmp_path / name
    make(path, 200)
    assert path.stat().st_size < 2_000_000  # a small archive
    err, peak = _peak(lambda: read_vectors(path, {"the"}, 3, name))
    assert err.line() == (f"error: {name}: line 2: over {LINE_BYTES:,} bytes: not a word "
                          "and its numbers")
    assert peak < 20_000_000, f"{peak:,} bytes held"


def test_an_archive_inflating_past_its_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "vectors.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("glove.txt", b"w 0.1 0.2 0.3\n" * 200_000)  # 2.8 MB
    err, _ = _peak(lambda: read_vectors(path, {"the"}, 3, "vectors.zip", cap=1_000_000))
    assert err.line() == ("error: vectors.zip: over 1.0 MB inflated, over the cap of 1.0 MB "
                          "(limits.vectors_mb)")


def test_a_vectors_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "v.txt")
    with pytest.raises(InputError) as e:
        read_vectors(tmp_path / "v.txt", {"the"}, 3, "v.txt")
    assert e.value.line() == "error: v.txt: refused: a FIFO, not a regular file"
