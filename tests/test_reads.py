"""rcpipe/reads.py: a user's file read only when regular and within its cap, its checksum
checked as it streams, JSON and YAML nesting counted before parsing."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import pytest

from rcpipe import reads
from rcpipe.errors import InputError


def _refused(call: object, *args: object, **kwargs: object) -> InputError:
    with pytest.raises(InputError) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    assert "\n" not in info.value.line()
    return info.value


def test_a_regular_file_within_its_cap_is_read(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"12345")
    assert reads.read_bytes(tmp_path / "f", 5, "limits.x") == b"12345"
    err = _refused(reads.read_bytes, tmp_path / "f", 4, "limits.x")
    assert err.what == "5 bytes, over the cap of 4 bytes (limits.x)"


@pytest.mark.parametrize(("make", "kind"), [
    (lambda p: os.mkfifo(p), "a FIFO"),
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: p.symlink_to("/dev/zero"), "a character device"),
])
def test_what_is_not_a_regular_file_is_refused_unread(tmp_path: Path, make: object,
                                                     kind: str) -> None:
    make(tmp_path / "x")  # type: ignore[operator]
    err = _refused(reads.read_bytes, tmp_path / "x", 10, "limits.x")  # a FIFO: no wait
    assert err.what == f"refused: {kind}, not a regular file"


def test_a_link_out_of_its_directory_is_refused_and_one_inside_is_read(tmp_path: Path
                                                                     ) -> None:
    (tmp_path / "outside").write_text("x")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "real").write_text("y")
    (tmp_path / "pkg" / "in").symlink_to("real")
    (tmp_path / "pkg" / "out").symlink_to(tmp_path / "outside")
    assert reads.read_bytes(tmp_path / "pkg" / "in", 9, "k", inside=tmp_path / "pkg") == b"y"
    err = _refused(reads.read_bytes, tmp_path / "pkg" / "out", 9, "k", inside=tmp_path / "pkg")
    assert err.what.startswith("refused: a link out of")


def test_a_checksum_is_checked_before_the_file_is_held(tmp_path: Path) -> None:
    data = os.urandom(3 * reads.BLOCK + 7)
    (tmp_path / "w").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    assert reads.read_checked(tmp_path / "w", digest, len(data), "k") == data
    err = _refused(reads.read_checked, tmp_path / "w", "0" * 64, len(data), "k", hint="!")
    assert err.what == "refused: its sha256 is not the one recorded!"
    assert "over the cap" in _refused(reads.read_checked, tmp_path / "w", digest,
                                      len(data) - 1, "k").what


def test_a_gzip_is_held_to_its_cap_once_inflated() -> None:
    small = gzip.compress(b"a" * 100)
    assert reads.gunzip(small, 100, "k", "f") == b"a" * 100
    err = _refused(reads.gunzip, gzip.compress(b"a" * 10_000), 100, "k", "f")
    assert err.what == "over 100 bytes inflated, over the cap of 100 bytes (k)"
    assert "ends early" in _refused(reads.gunzip, small[:-12], 1000, "k", "f").what


@pytest.mark.parametrize(("text", "depth"), [
    ('{"data": [{"qas": [{"answers": [{}]}]}]}', 7),
    ('["[[[[", "]\\"[[[", {"a": "{{{"}]', 2),  # brackets in strings, escaped quotes
    ("[" * 1000, 1000),  # unclosed: counted as far as it goes
    ("3", 0),
])
def test_json_depth_counts_brackets_outside_strings(text: str, depth: int) -> None:
    assert reads.json_depth(text) == depth


def test_json_nested_past_the_bound_is_one_line_not_a_recursion_error() -> None:
    deep = "[" * 50_000 + "]" * 50_000
    err = _refused(reads.parse_json, deep, "f.json", 64, "limits.depth")
    assert err.line() == "error: f.json: nested 50000 deep, over the bound of 64 (limits.depth)"
    assert reads.parse_json("[[1]]", "f", 2, "k") == [[1]]
    assert _refused(reads.parse_json, "[1,", "f", 9, "k").location == "line 1 column 4"


def test_yaml_depth_is_counted_on_events_without_recursion() -> None:
    assert reads.yaml_depth_over("a: " + "[" * 100_000 + "]" * 100_000, 64) == 65
    nested = "a:\n  b:\n    c: [1, {d: 2}]\n"  # the top mapping, b's, c's, the list, {d}
    assert reads.yaml_depth_over(nested, 5) is None
    assert reads.yaml_depth_over(nested, 4) == 5
    assert reads.yaml_depth_over("a: [", 3) is None  # a syntax error: the load says where
