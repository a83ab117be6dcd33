"""rcpipe's messages are `logging` records (rcpipe/logs.py): plain lines on stderr where it
is no terminal (Ray job logs, Prefect, CI), rich's lines and the progress bars in one."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from rcpipe import cli
from rcpipe.console import console, progress
from rcpipe.logs import setup

PLAIN = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO rcpipe\.stages\.data: "
                   r"synth: train: \d+ questions \(SQuAD v1\.1\) -> ")


def test_a_stages_messages_are_log_records_and_plain_lines_off_a_terminal(
        workdir: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    assert not console.is_terminal  # pytest captures stderr
    with pytest.raises(SystemExit) as done:
        cli.main(["synth"])
    assert done.value.code == 0
    records = [r for r in caplog.records if r.name == "rcpipe.stages.data"]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO]
    assert records[0].getMessage().startswith("synth: train: ")
    out, err = capsys.readouterr()
    assert out == ""  # stdout is for results
    lines = err.splitlines()
    assert "\x1b" not in err and sum(1 for line in lines if PLAIN.match(line)) == 1, err
    assert progress().disable  # no bars in a log


def test_in_a_terminal_the_lines_are_richs_and_the_bars_show(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "_force_terminal", True)
    setup()
    logging.getLogger("rcpipe.stages.data").info("prepare: 3 questions")
    err = capsys.readouterr().err
    assert "prepare: 3 questions" in err and "INFO" in err
    assert "rcpipe.stages.data:" not in err  # not the plain format
    assert not progress().disable
