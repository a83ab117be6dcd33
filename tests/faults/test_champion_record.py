"""Issue 72: the champion record's last gaps, as an outside audit found them. A forged
git_commit handed to `git checkout` as an option; a night name or package URL through
``..`` on a directory remote; an S3 read of the record cut short; a reason the reader can
no longer read back; newlines forging lines of the listing; a write applied but its answer
lost, told as lost; an earlier night's malformed version.json. Each on a directory remote
or the loopback S3 (moto), through a TCP relay (tests/relay.py) where the network's
behaviour matters."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rcpipe import cli
from rcpipe.config import ReadLimits
from rcpipe.errors import InputError
from rcpipe.release import nights, record
from rcpipe.release.remote import Remote
from rcpipe.stages import registry
from tests.relay import Relay
from tests.release.test_record import champion, workspace
from tests.stages.test_registry import version_night

LIMITS = ReadLimits()


def rcpipe(root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
           *args: str) -> tuple[int, str, str]:
    """`rcpipe <args>` in ``root``, in this process: (exit code, stdout, stderr)."""
    monkeypatch.chdir(root)
    capsys.readouterr()
    try:
        cli.main(list(args))
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("commit", ["-f", "--orphan=x", "abc1234\n-f", "HEAD", "a" * 65])
def test_a_forged_git_commit_is_refused_never_printed_for_git_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        commit: str) -> None:
    where = workspace(tmp_path / "work")
    where.write(json.dumps({**champion("n1"), "git_commit": commit}).encode(), record.HEAD)
    code, out, err = rcpipe(tmp_path / "work", monkeypatch, capsys, "champion", "--ref")
    assert code == 2 and out == "" and err.count("\n") == 1, (out, err)
    assert "champion.json: git_commit: " in err and "is not a git commit id" in err


def test_a_commit_id_is_the_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    where = workspace(tmp_path / "work")
    where.write(json.dumps({**champion("n1"), "git_commit": "0123abcd" * 5}).encode(),
                record.HEAD)
    assert rcpipe(tmp_path / "work", monkeypatch, capsys, "champion", "--ref")[:2] == \
        (0, "0123abcd" * 5 + "\n")


def test_a_night_name_or_package_leading_out_of_a_directory_remote_is_refused(
        tmp_path: Path) -> None:
    """`champion set 'n1/../n2'` and a night whose package URL climbs out of the remote:
    refused in one line; a config.json outside the remote, pinned as the night says, is
    never read (a directory remote confines as S3's keys do)."""
    where = workspace(tmp_path / "work")
    for run in ("n1", "n2"):
        version_night(where, run)
    with pytest.raises(InputError, match="refused: a name that leads out"):
        registry.set_champion(tmp_path / "work", None, "n1/../n2", None, "x", "ann", LIMITS)
    outside = tmp_path / "outside" / "bidaf"
    outside.mkdir(parents=True)
    (outside / "config.json").write_text("{}")
    night = json.loads(Path(where.path, "rcpipe/versions/n1/version.json").read_text())
    night["packages"]["bidaf"] = f"{where.url}/rcpipe/../../outside/bidaf"
    night["packages_sha256"]["bidaf"] = registry.sha256(b"{}")
    where.write(json.dumps(night).encode(), "versions", "n3", "version.json")
    with pytest.raises(InputError) as e:
        registry.set_champion(tmp_path / "work", None, "n3", None, "x", "ann", LIMITS)
    assert "refused: a name that leads out" in e.value.line() and "\n" not in e.value.line()
    with pytest.raises(InputError, match="leads out"):  # nor downloaded (the champion app)
        where.download(night["packages"]["bidaf"], tmp_path / "cache", LIMITS)
    assert record.read(where, LIMITS).entry is None and not (tmp_path / "cache").exists()


def test_a_reason_over_its_cap_or_with_control_characters_is_refused_before_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A ~360 KB reason was written, and the record over its read cap for ever after; a
    newline forged a line of the listing. Both refused in one line, nothing written."""
    where = workspace(tmp_path / "work")
    version_night(where, "n1")
    work = tmp_path / "work"
    assert rcpipe(work, monkeypatch, capsys, "champion", "set", "n1", "--reason", "ok")[0] == 0
    before = Path(where.path, "rcpipe", record.HEAD).read_bytes()
    for args, says in (
            (["--reason", "x" * 360_000], "error: --reason: 360000 characters: over 2000"),
            (["--reason", "x\n* #99  promotion night FORGED"], "error: --reason: character 1: "
                                                               "'\\n' is a control character"),
            (["--reason", "ok", "--by", "ann\rnote: forged"], "error: --by: character 3: "
                                                              "'\\r' is a control character")):
        code, _, err = rcpipe(work, monkeypatch, capsys, "champion", "set", "n1", *args)
        assert code == 2 and err.startswith(says) and err.count("\n") == 1, err
    assert Path(where.path, "rcpipe", record.HEAD).read_bytes() == before
    with pytest.raises(InputError, match="over limits.record_kb"):  # the entry as a whole
        record.append(where, record.read(where, LIMITS), champion("n2"), "set", "x", "ann",
                      ReadLimits(record_kb=0.2))
    assert Path(where.path, "rcpipe", record.HEAD).read_bytes() == before
    assert rcpipe(work, monkeypatch, capsys, "champion")[0] == 0  # readable, as before


def test_an_entry_written_with_newlines_is_listed_escaped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An entry from before the refusal (or written by hand) cannot forge a line: each of
    its fields is shown on its own line, a control character escaped."""
    where = workspace(tmp_path / "work")
    forged = {**champion("n1"), "seq": 1,
              "change": {"kind": "set", "by": "ann\nnote: forged", "at": "t",
                         "reason": "x\n* #99  promotion night FORGED\x1b[2J"}}
    where.write(json.dumps(forged).encode(), record.HEAD)
    where.write(json.dumps(forged).encode(), record.HISTORY, "00000001.json")
    code, out, _ = rcpipe(tmp_path / "work", monkeypatch, capsys, "champion")
    assert code == 0 and out.splitlines() == [
        "* #1  set       night n1  bidaf  t  by ann\\nnote: forged",
        "      x\\n* #99  promotion night FORGED\\x1b[2J"], out


class Lossy(Relay):
    """A relay in front of the loopback S3 that behaves as a real network may: the
    server's answers arrive in 1 KB pieces (one read of a body gets part of it), and once
    ``lose_put`` is set the answer to the next PUT of champion.json is lost (the
    connection ended after the server applied it): botocore sends the PUT again."""

    def __init__(self, target: int) -> None:
        self.lose_put, self.lost = False, 0
        super().__init__(target)

    def up(self, data: bytes, server: socket.socket, conn: dict[str, Any]) -> bool:
        first = data.split(b"\r\n", 1)[0]
        if self.lose_put and first.startswith(b"PUT ") and b"champion.json" in first:
            self.lose_put, conn["lose"] = False, True
        return super().up(data, server, conn)

    def down(self, data: bytes, client: socket.socket, conn: dict[str, Any]) -> bool:
        if conn.get("lose"):
            while data.startswith(b"HTTP/1.1 100 "):  # "send the body": passed on
                interim, _, data = data.partition(b"\r\n\r\n")
                client.sendall(interim + b"\r\n\r\n")
            if data:  # the PUT's answer: the server applied it; it never arrives
                self.lost += 1
                return False
            return True
        for i in range(0, len(data), 1024):
            client.sendall(data[i:i + 1024])
            time.sleep(0.0005)
        return True


@pytest.fixture
def relayed(s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[tuple[Remote, Lossy]]:
    """A DVC workspace (tmp_path/work) whose remote is the loopback S3 through Lossy."""
    for listed in s3.list_objects_v2(Bucket="rcpipe-test", Prefix="relay/").get("Contents",
                                                                                 []):
        s3.delete_object(Bucket="rcpipe-test", Key=listed["Key"])
    relay = Lossy(int(s3.meta.endpoint_url.rsplit(":", 1)[1]))
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
    yield workspace(tmp_path / "work", "s3://rcpipe-test/relay"), relay
    relay.close()


@pytest.mark.integration  # the s3 fixture: moto's server
def test_a_record_of_100_kb_is_read_whole_every_time(relayed: tuple[Remote, Lossy],
                                                      s3: Any) -> None:
    """A 70-100 KB record (under the 256 KB cap) arrived cut ("Unterminated string",
    "Invalid \\uXXXX escape"): one read of the body returned what had arrived."""
    where, _ = relayed
    entry = {**champion("n1"), "seq": 1, "notes": ["\u00e9t\u00e9 \u2603 " * 9] * 400}
    data = json.dumps(entry, indent=1).encode()
    assert 70_000 < len(data) < LIMITS.record_bytes()
    s3.put_object(Bucket="rcpipe-test", Key="relay/rcpipe/champion.json", Body=data)
    for _ in range(10):
        assert record.read(where, LIMITS).entry == entry


@pytest.mark.integration
def test_a_write_applied_whose_answer_was_lost_is_reported_made(
        relayed: tuple[Remote, Lossy], tmp_path: Path) -> None:
    """The PUT applied, its answer lost, sent again by botocore: the second finds the
    record changed by its own write. Reported as made (it ended "the record changed while
    this set was made (#1 -> #2)", #2 its own)."""
    where, relay = relayed
    for run in ("n1", "n2"):
        version_night(where, run)
    registry.set_champion(tmp_path / "work", None, "n1", None, "first", "ann", LIMITS)
    relay.lose_put = True
    entry = registry.set_champion(tmp_path / "work", None, "n2", None, "second", "ann", LIMITS)
    assert relay.lost == 1 and entry["seq"] == 2
    assert [(e["seq"], e["score"]["run"]) for e in record.history(where, LIMITS)] == \
        [(1, "n1"), (2, "n2")]


@pytest.mark.parametrize(("night", "place"), [
    ({"run": "n0", "scores": {"bidaf": {"f1": "n/a", "em": 1.0}}}, "scores.bidaf.f1"),
    ({"scores": {"bidaf": {"f1": 1.0, "em": 1.0}}}, "run"),
    ({"run": "n0", "scores": [1, 2]}, "scores"),
    ({"run": "n0", "scores": {}, "cost": {"bidaf": {"wall_s": "x"}}}, "cost.bidaf.wall_s"),
    ([1], ""),
])
def test_an_earlier_nights_malformed_record_is_left_out_in_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, night: Any, place: str) -> None:
    """An earlier night's version.json with f1 "n/a", no run, scores a list: a traceback
    after commit and push, this night's record never written. Now left out, one line
    naming its file and the place; the other nights kept."""
    where = workspace(tmp_path / "work")
    version_night(where, "n1")
    where.write(json.dumps(night).encode(), "versions", "n0", "version.json")
    with caplog.at_level(logging.WARNING, logger="rcpipe.release.nights"):
        kept = nights.earlier(where, "n9")
    assert [r["run"] for r in kept] == ["n1"]
    said = [r.getMessage() for r in caplog.records]
    url = f"{where.url}/rcpipe/versions/n0/version.json"
    assert len(said) == 1 and said[0].startswith(f"nights: left out: {url}: {place}"), said
    with pytest.raises(InputError) as e:  # `champion set` of it: the same line, refused
        registry.entry_of_night(where, "n0", "bidaf", LIMITS)
    assert "n0/version.json" in e.value.line() and "\n" not in e.value.line()


def test_version_reads_the_earlier_nights_before_it_commits_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The bad night is said before `dvc commit` (here the commit then fails, nothing being
    trained): nothing is committed or pushed before the nights are read."""
    import shutil
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    store = tmp_path / "store"
    for cmd in (["init", "--no-scm", "-q"], ["remote", "add", "-d", "storage", str(store)]):
        subprocess.run([sys.executable, "-m", "dvc", *cmd], check=True, capture_output=True)
    repo = Path(cli.__file__).parents[1]
    (tmp_path / "dvc.yaml").write_text((repo / "dvc.yaml").read_text())
    shutil.copy(repo / "params.demo.yaml", tmp_path / "params.yaml")
    (store / "rcpipe/versions/n0").mkdir(parents=True)
    (store / "rcpipe/versions/n0/version.json").write_text(
        json.dumps({"run": "n0", "scores": {"bidaf": {"f1": "n/a", "em": 1}}}))
    assert rcpipe(tmp_path, monkeypatch, capsys, "synth")[0] == 0
    code, _, err = rcpipe(tmp_path, monkeypatch, capsys, "version", "--variant", "bidaf")
    lines = err.splitlines()
    left = [i for i, ln in enumerate(lines) if "nights: left out: " in ln]
    assert code == 2 and len(left) == 1, err
    assert lines[left[0]].endswith(f"{store}/rcpipe/versions/n0/version.json: "
                                   "scores.bidaf.f1: Input should be a valid number"), err
    assert lines[-1].startswith("error: ") and left[0] < len(lines) - 1
    assert not (tmp_path / "dvc.lock").exists() and sorted(
        p.name for p in (store / "rcpipe/versions").iterdir()) == ["n0"]
