"""Issue 43: a reader never sees a set half moved into place. A writer killed after its
commit point (the journal's rename) but before its last move leaves new files beside old
ones until the same command runs again; `rcpipe train` and `evaluate` read such a
data/prepared and ended in IndexError tracebacks, a package had new weights beside the old
config.json. Each reader now finishes the moves first (outputs.settle), with one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rcpipe import stages
from rcpipe.config import load_config
from rcpipe.outputs import OutputSet
from tests.conftest import TINY_MODEL, Prepared, SynthData, write_params
from tests.faults.test_abuse import _package


class Killed(BaseException):
    """The writer's end, one move into its set (as kill -9 would leave it)."""


def commit_killed(monkeypatch: pytest.MonkeyPatch, files: OutputSet, at: int) -> None:
    """``files`` committed with the writer killed at its ``at``-th rename (os.replace): the
    journal's rename is the first, the commit point."""
    real, calls = os.replace, [0]

    def replace(src: Any, dst: Any) -> None:
        calls[0] += 1
        if calls[0] == at:
            raise Killed
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Killed):
        files.commit()
    monkeypatch.setattr(os, "replace", real)


def _files(folder: Path) -> list[Path]:
    """Every file under ``folder`` (a prepared set's split folders' parts too), relative."""
    return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())


def _half_moved(monkeypatch: pytest.MonkeyPatch, name: str, folder: Path, new: Path) -> None:
    """``new``'s files committed as ``folder``'s set ``name``, then the writer killed after
    its first move: the journal and one new file in place, the others still staged."""
    files = OutputSet(name, [folder])
    for f in _files(new):
        files.copy(folder / f, new / f)
    for f in _files(folder):
        if not (new / f).exists():
            files.remove(folder / f)
    commit_killed(monkeypatch, files, at=3)  # 1: the journal (the commit point), 2: a move
    assert files.journal.is_file()
    differ = [f for f in _files(new) if not (folder / f).is_file()
              or (folder / f).read_bytes() != (new / f).read_bytes()]
    assert differ, "the set is not half moved"


def _same(folder: Path, new: Path) -> bool:
    return _files(folder) == _files(new) \
        and all((folder / f).read_bytes() == (new / f).read_bytes() for f in _files(new))


@pytest.mark.trains  # one step of train_local in a subprocess: a training run
def test_train_reads_a_half_moved_prepared_set_whole(
        prepared: Prepared, synth_v2: SynthData, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the old set: synth_v1 prepared; the new one: synth_v2 (another vocabulary)
    shutil.copytree(prepared.out_dir, tmp_path / "data" / "prepared")
    new_cfg = load_config(write_params(tmp_path / "v2.yaml", data={
        "train_file": str(synth_v2.train), "dev_file": str(synth_v2.dev),
        "out_dir": str(tmp_path / "v2"), "cache_dir": str(tmp_path / "cache")}))
    stages.prepare(new_cfg)
    folder = tmp_path / "data" / "prepared"
    _half_moved(monkeypatch, "prepare", folder, tmp_path / "v2")
    write_params(tmp_path / "params.yaml", data={
        "train_file": str(synth_v2.train), "dev_file": str(synth_v2.dev),
        "out_dir": "data/prepared", "cache_dir": "cache"},
        train={"max_steps": 1, "batch_size": 8, "num_workers": 1},
        models={"bidaf": TINY_MODEL})
    run = subprocess.run([sys.executable, "-m", "rcpipe.train.local", "bidaf"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_COLOR": "1", "TERM": "dumb"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    said = [line for line in run.stderr.splitlines() if "finished moving" in line]
    assert len(said) == 1 and "data/prepared: finished moving" in said[0], run.stderr[-2000:]
    assert _same(folder, tmp_path / "v2")
    assert not list(folder.parent.glob(".prepared.*"))  # journal and staging gone
    assert json.loads(run.stdout.splitlines()[-1])["steps"] == 1


def test_a_half_moved_package_is_read_whole(
        prepared: Prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from rcpipe import cli

    monkeypatch.chdir(tmp_path)
    params = write_params(tmp_path / "params.yaml", data={
        "train_file": str(prepared.data.train), "dev_file": str(prepared.data.dev),
        "out_dir": str(prepared.out_dir), "cache_dir": "cache"}, models={"bidaf": TINY_MODEL})
    cfg = load_config(params)
    _package(cfg, tmp_path / "pkg")  # the old package
    wider = load_config(params, ["models.bidaf.hidden=12"])
    _package(wider, tmp_path / "new")  # the new one: other weights, another config.json
    _half_moved(monkeypatch, "package", tmp_path / "pkg", tmp_path / "new")
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(["predict", "--model", "pkg", "--question", "who?", "--context", "a b c"])
    out = capsys.readouterr()
    assert info.value.code in (0, None), out.err
    assert json.loads(out.out)["model"] == "pkg"
    assert _same(tmp_path / "pkg", tmp_path / "new")


def test_version_finishes_a_half_moved_evaluate_set_before_it_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 57: `rcpipe version` after a killed `rcpipe evaluate` committed the new
    predictions with the old metrics into dvc.lock. It finishes the set's moves before
    `dvc commit` (here the commit then fails, nothing being trained: the set is whole
    already, and said so)."""
    from rcpipe import cli

    monkeypatch.chdir(tmp_path)
    for cmd in (["init", "--no-scm", "-q"],
                ["remote", "add", "-d", "storage", str(tmp_path / "store")]):
        subprocess.run([sys.executable, "-m", "dvc", *cmd], check=True, capture_output=True)
    repo = Path(cli.__file__).parents[1]
    (tmp_path / "dvc.yaml").write_text((repo / "dvc.yaml").read_text())
    shutil.copy(repo / "params.demo.yaml", tmp_path / "params.yaml")  # the synthetic data
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["synth"])
    old, new = tmp_path / "metrics", tmp_path / "new"
    for folder, f1 in ((old, 10.0), (new, 20.0)):
        folder.mkdir()
        (folder / "bidaf.json").write_text(json.dumps({"f1": f1}))
        (folder / "bidaf.by_type.json").write_text(json.dumps({"what": {"f1": f1}}))
    _half_moved(monkeypatch, "evaluate", old, new)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["version", "--variant", "bidaf"])
    err = capsys.readouterr().err
    assert "metrics: finished moving" in err and _same(old, new), err
    assert not list(tmp_path.glob(".metrics.*"))  # journal and staging gone
    assert not (tmp_path / "dvc.lock").exists()
