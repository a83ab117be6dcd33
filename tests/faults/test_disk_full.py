"""Issue 43: a full disk during prepare, evaluate or package is one line naming the path,
exit code 1, and nothing lost (the old set stands, nothing staged is left); it was an
`OSError: [Errno 28]` traceback. On a real tmpfs a few KB larger than the old set where
this process may mount one (root), and by ENOSPC injected where the disk would say it
(pyarrow's writer, a file's fsync), everywhere."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rcpipe import cli
from tests.conftest import Prepared, write_params
from tests.faults.test_abuse import here as here  # noqa: F401 - the fixtures, shared
from tests.faults.test_abuse import rcpipe
from tests.faults.test_abuse import run_dir as run_dir  # noqa: F401

FULL = "no space left on device; nothing of the new set was moved into place (the previous " \
       "one stands)"


def _sums(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


def _left(folder: Path) -> list[str]:
    """What a writer left beside ``folder``: staged files, a journal."""
    return [p.name for p in folder.parent.iterdir()
            if p.name.startswith(f".{folder.name}.") and not p.name.endswith(".lock")]


@pytest.fixture
def small_disk(tmp_path: Path, prepared: Prepared) -> Iterator[Path]:
    """A tmpfs holding a copy of the prepared set and 16 KB more."""
    mount = tmp_path / "disk"
    mount.mkdir()
    size = sum(p.stat().st_size for p in prepared.out_dir.rglob("*")) + 64 * 1024
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
            capture_output=True).returncode != 0:
        pytest.skip("this process may not mount a tmpfs (the injected cases stand for it)")
    try:
        shutil.copytree(prepared.out_dir, mount / "prepared")
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _prepare_again(root: Path, prepared: Prepared, out: Path,
                   capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    write_params(root / "params.yaml", data={
        "train_file": str(prepared.data.train), "dev_file": str(prepared.data.dev),
        "out_dir": str(out), "cache_dir": str(root / "cache"), "workers": 1})
    os.chdir(root)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:  # other limits: another set, every file new
        cli.main(["prepare", "--set", "data.limits.para=350"])
    return info.value.code, capsys.readouterr().err  # type: ignore[return-value]


def test_prepare_on_a_full_tmpfs_is_one_line_and_the_old_set_stands(
        small_disk: Path, prepared: Prepared, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = small_disk / "prepared"
    old = _sums(out)
    code, err = _prepare_again(tmp_path, prepared, out, capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and errors == [f"error: {out.relative_to(tmp_path)}: {FULL}"], err
    assert code == 1
    assert _sums(out) == old and _left(out) == []


def test_prepare_told_enospc_by_its_parquet_writer_is_one_line(
        prepared: Prepared, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "prepared"
    shutil.copytree(prepared.out_dir, out)
    old = _sums(out)

    def full(*args: Any, **kwargs: Any) -> None:  # pyarrow's words; its OSError has no errno
        raise OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(pq, "ParquetWriter", full)
    code, err = _prepare_again(tmp_path, prepared, out, capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and errors == [f"error: {out.relative_to(tmp_path)}: {FULL}"], err
    assert code == 1
    assert _sums(out) == old and _left(out) == []


@pytest.mark.parametrize("args", [["evaluate", "bidaf"], ["package", "bidaf", "--out", "pk"]],
                         ids=["evaluate", "package"])
def test_a_set_whose_fsync_finds_the_disk_full_is_one_line_and_the_old_set_stands(
        here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        args: list[str]) -> None:  # noqa: F811
    if args[0] == "package" and not (here / "metrics" / "bidaf.json").is_file():
        assert rcpipe(capsys, "evaluate", "bidaf")[0] in (0, None)
    code, err = rcpipe(capsys, *args)  # the old set
    assert code in (0, None), err
    written = here / ("predictions" if args[0] == "evaluate" else "pk")
    old = _sums(written)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    code, err = rcpipe(capsys, *args, *(["--force"] if args[0] == "evaluate" else []))
    monkeypatch.undo()
    assert "Traceback" not in err
    assert re.fullmatch(rf"error: \S+: {re.escape(FULL)}\n", err), err
    assert code == 1
    assert _sums(written) == old and _left(written) == []
