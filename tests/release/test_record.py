"""The champion record (rcpipe/release/record.py): entries numbered and kept in the history,
changed only by compare-and-swap (a stale writer changes nothing), checked as read (fail
closed: no pin, wrong type, over limits.record_kb), on a directory remote and on S3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rcpipe.config import ReadLimits
from rcpipe.errors import InputError
from rcpipe.release import record
from rcpipe.release.remote import Remote

PIN = "a" * 64
LIMITS = ReadLimits()


def workspace(root: Path, url: str | None = None) -> Remote:
    """A DVC workspace at ``root`` (no git) whose default remote is ``url`` (default: a
    directory beside it): .dvc/config as `dvc init --no-scm` and `dvc remote add -d` write
    it, without a second each for their processes."""
    (root / ".dvc").mkdir(parents=True, exist_ok=True)
    (root / ".dvc" / "config").write_text(
        "[core]\n    no_scm = True\n    remote = storage\n"
        f"['remote \"storage\"']\n    url = {url or root.parent / 'remote'}\n")
    return Remote(root, None)


def champion(run: str, model: str = "bidaf") -> dict[str, Any]:
    return {"score": {"run": run, "model": model, "f1": 50.0},
            "package": f"remote/rcpipe/versions/{run}/packages/{model}",
            "package_sha256": PIN, "packages": {model: "x"}}


@pytest.fixture
def where(tmp_path: Path) -> Remote:
    return workspace(tmp_path / "work")


def swaps(where: Remote) -> None:
    """Two entries in turn; then a writer holding the first read changes nothing."""
    first = record.read(where, LIMITS)
    assert first.entry is None and first.seq == 0
    one = record.append(where, first, champion("n1"), "promotion", "first", "gate", LIMITS)
    assert one["seq"] == 1 and one["change"]["before"] is None
    seen = record.read(where, LIMITS)
    two = record.append(where, seen, champion("n2"), "promotion", "better", "gate", LIMITS)
    assert two["seq"] == 2 and two["change"]["before"] == {"seq": 1, "run": "n1",
                                                           "model": "bidaf"}
    with pytest.raises(record.Changed):  # seen is stale now: n3 loses, nothing written
        record.append(where, seen, champion("n3"), "promotion", "late", "gate", LIMITS)
    with pytest.raises(record.Changed):  # a writer that saw no record loses too
        record.append(where, first, champion("n3"), "promotion", "late", "gate", LIMITS)
    head = record.read(where, LIMITS)
    assert head.entry == two and head.names() == "#2 (night n2, bidaf)"
    assert [e["score"]["run"] for e in record.history(where, LIMITS)] == ["n1", "n2"]


def test_entries_are_numbered_kept_and_swapped_only_if_unchanged(where: Remote) -> None:
    swaps(where)


@pytest.mark.integration  # the s3 fixture: moto's server
def test_the_same_on_s3_by_conditional_writes(s3: Any, tmp_path: Path) -> None:
    for listed in s3.list_objects_v2(Bucket="rcpipe-test", Prefix="rec/").get("Contents", []):
        s3.delete_object(Bucket="rcpipe-test", Key=listed["Key"])
    swaps(workspace(tmp_path / "work", "s3://rcpipe-test/rec"))


def test_a_writer_that_died_after_its_swap_leaves_its_history_to_the_next(
        where: Remote) -> None:
    entry = {**champion("n1"), "seq": 4}  # a head whose writer died before its history
    where.write(json.dumps(entry).encode(), record.HEAD)
    # a head from before numbering: no seq, no history
    record.append(where, record.read(where, LIMITS), champion("n2"), "set", "by hand", "ann",
                  LIMITS)
    assert [e["seq"] for e in record.history(where, LIMITS)] == [4, 5]
    # champion.json deleted by hand: the numbering goes on after the history
    Path(where.path, "rcpipe", record.HEAD).unlink()
    again = record.append(where, record.read(where, LIMITS), champion("n3"), "promotion",
                          "", "gate", LIMITS)
    assert again["seq"] == 6 and again["change"]["before"] is None


def test_a_record_from_before_numbering_reads_as_entry_0(where: Remote) -> None:
    legacy = {k: v for k, v in champion("old").items()}
    where.write(json.dumps(legacy).encode(), record.HEAD)
    head = record.read(where, LIMITS)
    assert head.seq == 0
    new = record.append(where, head, champion("n1"), "promotion", "", "gate", LIMITS)
    assert new["seq"] == 1 and new["change"]["before"]["run"] == "old"
    assert [e["seq"] for e in record.history(where, LIMITS)] == [1]


@pytest.mark.parametrize(("found", "where_", "says"), [
    ([1, 2], "", "expected a JSON object, found list"),
    ({"score": {"run": "n1"}}, "score", "run and model"),
    ({**champion("n1"), "package_sha256": None}, "package_sha256", "missing"),
    ({**champion("n1"), "package_sha256": ""}, "package_sha256", "missing"),
    ({k: v for k, v in champion("n1").items() if k != "package_sha256"}, "package_sha256",
     "missing"),
    ({**champion("n1"), "package_sha256": "abc"}, "package_sha256", "not a sha256"),
    ({**champion("n1"), "package": ""}, "package", "missing"),
    ({**champion("n1"), "seq": "2"}, "seq", "whole number"),
    ({"score": {"run": "n1", "model": "ensemble"}, "packages": {"bidaf": "u", "qanet": "v"},
      "packages_sha256": {"bidaf": PIN}}, "packages_sha256.qanet", "missing"),
    ({"score": {"run": "n1", "model": "ensemble"}, "packages": {"bidaf": "u"},
      "packages_sha256": {"bidaf": PIN}, "ensemble": {"method": "nope"}}, "ensemble",
     "none of"),
])
def test_a_record_without_its_pin_or_of_the_wrong_shape_is_one_located_line(
        where: Remote, found: Any, where_: str, says: str) -> None:
    where.write(json.dumps(found).encode(), record.HEAD)
    with pytest.raises(InputError) as e:
        record.read(where, LIMITS)
    assert e.value.location == where_ and says in e.value.what, e.value.line()
    assert "champion.json" in e.value.line() and "\n" not in e.value.line()


def test_an_ensemble_pins_only_the_voters_it_weighs(where: Remote) -> None:
    entry = {"score": {"run": "n1", "model": "ensemble"},
             "packages": {"bidaf": "u", "qanet": "v"}, "packages_sha256": {"bidaf": PIN},
             "ensemble": {"method": "selected", "weights": {"bidaf": 1, "qanet": 0},
                          "na_threshold": None}}
    where.write(json.dumps(entry).encode(), record.HEAD)
    assert record.read(where, LIMITS).entry == entry


def test_an_ensemble_entry_built_without_its_combination_reads_as_the_vote() -> None:
    """entry_of with no combination writes no "ensemble" key (a promotion from before it,
    which the champion app serves by the vote), never one the check refuses."""
    def built(how: dict[str, Any] | None) -> dict[str, Any]:
        return record.entry_of({"run": "n1", "model": "ensemble"},
                               {"bidaf": "u", "qanet": "v"}, {"bidaf": PIN, "qanet": PIN},
                               ensemble=how, dvc_lock=None, git_commit=None, answers=None,
                               gate=None)
    legacy = built(None)
    assert "ensemble" not in legacy and record.check(legacy, "the entry") == legacy
    mean = {"method": "mean", "weights": {"bidaf": 1, "qanet": 1}, "na_threshold": None}
    assert record.check(built(mean), "the entry")["ensemble"] == mean


def test_a_record_over_its_cap_is_refused_as_it_arrives(where: Remote) -> None:
    where.write(b"{" + b" " * 300_000 + b"}", record.HEAD)
    with pytest.raises(InputError) as e:
        record.read(where, LIMITS)
    assert "limits.record_kb" in e.value.line()
    small = ReadLimits(record_kb=0.1)  # 102 bytes: a whole entry is over it
    where.write(json.dumps(champion("n1")).encode(), record.HEAD)
    with pytest.raises(InputError, match="limits.record_kb"):
        record.read(where, small)
