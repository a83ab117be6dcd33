"""rcpipe/fingerprints.py: what keys a training run and a stage's stamp, and the one line
that says what changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcpipe import fingerprints, layout
from rcpipe.config import Config, TrainConfig, load_config
from rcpipe.config.train import UNKEYED
from rcpipe.fingerprints import Fingerprint, Stamp
from tests.conftest import write_params

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _in_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key names its files relative to the run directory, as a run does."""
    monkeypatch.chdir(tmp_path)


def _cfg(tmp_path: Path, **sections):  # noqa: ANN003, ANN202
    out = tmp_path / "prepared"
    out.mkdir(exist_ok=True)
    for name in ("train.parquet", "vocab.json", "dev.parquet"):
        if not (out / name).exists():
            (out / name).write_bytes(name.encode())
    return load_config(write_params(tmp_path / "params.yaml", data={
        "train_file": "t.json", "dev_file": "d.json", "out_dir": str(out)} | sections.pop(
        "data", {}), **sections))


def _training(cfg: Config, variant: str = "bidaf") -> Fingerprint:
    """A training run's key: the train stage's row (rcpipe/stages/train.py's)."""
    return fingerprints.of_stage(cfg, "train", variant)


def test_same_inputs_same_key_and_what_changed_is_named(tmp_path: Path) -> None:
    base = _training(_cfg(tmp_path))
    assert _training(_cfg(tmp_path)) == base
    assert base.changes(base) is None
    assert base.changes(None) == "no finished run"

    (tmp_path / "prepared" / "train.parquet").write_bytes(b"more articles")
    new_data = _training(_cfg(tmp_path))
    assert new_data.digest != base.digest
    assert new_data.changes(base) == "data changed (prepared/train.parquet)"

    lr = _training(_cfg(tmp_path, models={"bidaf": {"optim": {"lr": 0.25}}},
                        train={"epochs": 3}))
    said = lr.changes(new_data)
    assert said is not None and said.startswith("settings changed (")
    assert "models.bidaf.optim.lr 0.5 -> 0.25" in said and "train.epochs 1 -> 3" in said

    older = Fingerprint.from_dict(base.as_dict() | {"rcpipe": "0.0.9"})
    assert f"rcpipe changed (0.0.9 -> {base.rcpipe})" in (base.changes(older) or "")


def test_where_and_how_fast_do_not_key_a_run_and_other_variants_do_not(tmp_path: Path) -> None:
    base = _training(_cfg(tmp_path))
    elsewhere = _cfg(tmp_path, train={"device": "cpu", "threads": 1, "keep_runs": 5,
                                      "storage_path": "s3://b/p", "max_failures": 0,
                                      "keep_checkpoints": 4, "cpus_per_worker": 1},
                     models={"qanet": {"hidden": 8}}, data={"workers": 1})
    assert _training(elsewhere) == base
    assert UNKEYED < set(TrainConfig.model_fields)  # each names a real key


def test_flipping_the_similaritys_start_retrains_that_variant_alone(tmp_path: Path) -> None:
    """The night after a user sets models.bidaf.similarity_init (a training field: model
    files do not hold it), bidaf trains again and says why; the other variants do not."""
    night1 = _cfg(tmp_path)
    night2 = _cfg(tmp_path, models={"bidaf": {"similarity_init": "symmetric"}})
    said = _training(night2).changes(_training(night1))
    assert said == "settings changed (models.bidaf.similarity_init attract -> symmetric)"
    for other in ("bidaf_selfattn", "qanet", "rnet"):
        assert _training(night2, other) == _training(night1, other)
    assert "similarity_init" not in night2.models.bidaf.architecture()


def test_a_run_is_keyed_on_the_prepared_folder_as_dvc_yaml_lists_it(tmp_path: Path) -> None:
    """Every prepared file, as `dvc repro` reruns train@<variant> when any changes: a new
    dev set trains again even where checkpoints are ranked on the held-out questions."""
    cfg = _cfg(tmp_path)
    (tmp_path / "prepared" / "heldout.parquet").write_bytes(b"held")
    base = _training(cfg)
    assert {"prepared/dev.parquet", "prepared/heldout.parquet"} <= set(base.files)
    (tmp_path / "prepared" / "dev.parquet").write_bytes(b"another dev set")
    assert _training(cfg).changes(base) == "data changed (prepared/dev.parquet)"


def test_a_stamp_is_current_only_with_its_outputs_and_the_same_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    made = tmp_path / "out.json"
    stamp = Stamp("stage", Fingerprint({"in.json": "1"}, {"k": 1}))
    assert not stamp.is_current([made])  # never kept
    made.write_text("x")
    stamp.keep()
    assert layout.stamp("stage").is_file() and stamp.is_current([made])
    assert not Stamp("stage", Fingerprint({"in.json": "1"}, {"k": 2})).is_current([made])
    assert not Stamp("stage", Fingerprint({"in.json": "2"}, {"k": 1})).is_current([made])
    made.unlink()
    assert not stamp.is_current([made])


def _stage_key(cfg: Config, name: str, variant: str = "") -> Fingerprint:
    return fingerprints.of_stage(cfg, name, variant, models=("bidaf", "qanet"))


@pytest.mark.parametrize("preset", ["params.yaml", "params.demo.yaml"])
def test_every_stages_key_is_its_rows_params_files_and_code(
        preset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key a stage skips by is its row of the table as dvc.yaml lists it: each params
    key (a section by each key in it), each file, the code; nothing restated by a stage."""
    from rcpipe.pipeline.stages import SOURCES, STAGES

    monkeypatch.chdir(tmp_path)
    cfg = load_config(ROOT / preset)
    for row in STAGES:
        variant = "bidaf" if row.per_variant else ""
        key = _stage_key(cfg, row.name, variant)
        keys = {k.replace("${item}", variant) for k in row.keys()}
        assert {k for k in key.settings if not any(
            k == p or k.startswith(f"{p}.") for p in keys)} == set(), row.name
        # a data source counts by its content (files), not by its name
        named = {*key.settings, *(k for k in key.files if k in SOURCES)}
        assert all(any(k == p or k.startswith(f"{p}.") for k in named) for p in keys)
        assert key.code == fingerprints.code_of(row.name)
    assert "models.bidaf.hidden" in _stage_key(cfg, "train", "bidaf").settings
    assert "predictions/qanet.dists.parquet" in _stage_key(cfg, "ensemble").files  # missing
    assert "tune/qanet.trials.json" in _stage_key(cfg, "report").files  # no stage's output


def test_a_folder_counts_by_its_files_and_the_cache_by_its_sources(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.json").write_text("{}")
    cache = tmp_path / "cache"
    cache.mkdir()
    cfg = _cfg(tmp_path, data={"cache_dir": str(cache)})
    base = _stage_key(cfg, "evaluate", "bidaf")
    assert base.files["data.dev_file"] == fingerprints.file_digest(tmp_path / "d.json")
    assert "prepared/dev.parquet" in base.files and "models/bidaf/model.pt" in base.files
    assert base.settings["data.out_dir"] == "prepared"  # a path as the run names it

    (cache / "glove.zip").write_bytes(b"another download")  # no source of evaluate's
    (tmp_path / "prepared" / ".dev.parquet.lock").write_text("")
    assert _stage_key(cfg, "evaluate", "bidaf") == base
    (tmp_path / "prepared" / "report.json").write_text("{}")  # DVC would run it again too
    assert "prepared/report.json" in _stage_key(cfg, "evaluate", "bidaf").changes(base)
    (tmp_path / "d.json").write_text('{"data": []}')
    assert "data.dev_file" in _stage_key(cfg, "evaluate", "bidaf").changes(base)


def test_a_stages_code_keys_it_as_dvc_yaml_lists_it(tmp_path: Path) -> None:
    """The code in a key is the closure dvc.yaml's code deps cover (rcpipe/pipeline/code.py),
    so a stage skips on its own exactly when DVC would not run it; an edit names its file."""
    from rcpipe.pipeline.code import closure
    from rcpipe.pipeline.stages import STAGES

    for s in STAGES:
        assert set(fingerprints.code_of(s.name)) == closure(s.entry)
    base = _training(_cfg(tmp_path))
    assert base.code == fingerprints.code_of("train")
    assert "rcpipe/train/loop.py" in base.code  # the step, not only the stage's module
    assert not any(f.startswith("rcpipe/pipeline/") for f in base.code)  # a row is no edit
    edited = Fingerprint.from_dict(base.as_dict() | {
        "code": dict(base.code) | {"rcpipe/train/loop.py": "0" * 64}})
    assert edited.digest != base.digest
    assert edited.changes(base) == "code changed (rcpipe/train/loop.py)"
    assert Fingerprint.from_dict(base.as_dict()) == base  # the record reads back whole


def test_a_training_run_says_why_it_trains_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training run's line (rcpipe/train/runs.py's ``why``, said by
    rcpipe/cluster/train_run.py): first, resumed, --force, or what changed since the
    model in place (a run of other settings on a real store: tests/cluster/
    test_storage_outage.py, which runs --force)."""
    from rcpipe.train.runs import Runs, run_name, why

    monkeypatch.chdir(tmp_path)
    twenty = _training(_cfg(tmp_path, train={"max_steps": 20}))
    eight = _training(_cfg(tmp_path, train={"max_steps": 8}))
    runs, name, here = Runs("bidaf"), run_name(eight), layout.model_dir("bidaf")
    assert why(here, eight, runs, name, False) == f"first run ({name})"
    assert why(here, eight, runs, name, True) == f"--force: training anew ({name})"
    layout.write_json(layout.summary_file("bidaf"),
                      {"finished": True, "fingerprint": twenty.as_dict()})
    assert why(here, eight, runs, name, False) == \
        f"settings changed (train.max_steps 20 -> 8); training anew ({name})"
    runs.started(name, eight)  # interrupted: the same inputs resume it
    assert why(here, eight, runs, name, False).startswith(f"resuming {name}, whose")


def test_a_large_files_digest_is_read_once_across_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """layout.DIGESTS remembers a large file's sha256 by path, size and modification time
    (word vectors: GB read at every prepare's key otherwise): kept after the first read,
    used while both hold, read again once either changes."""
    import hashlib
    import json
    import os

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fingerprints, "KEPT_BYTES", 10)  # "large" for this test
    monkeypatch.setattr(fingerprints, "_digests", {})  # a fresh process's memory
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("the 0.1 0.2\n")
    truth = hashlib.sha256(vectors.read_bytes()).hexdigest()
    assert fingerprints.file_digest(vectors) == truth
    memo = json.loads(layout.DIGESTS.read_text())
    stat = vectors.stat()
    assert memo == {str(vectors.resolve()): [stat.st_size, stat.st_mtime_ns, truth]}
    # another process: the memo's digest is used, the file not read (a planted one shows it)
    monkeypatch.setattr(fingerprints, "_digests", {})
    layout.DIGESTS.write_text(json.dumps({str(vectors.resolve()): [
        stat.st_size, stat.st_mtime_ns, "planted"]}))
    assert fingerprints.file_digest(vectors) == "planted"
    os.utime(vectors, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # touched: read again
    assert fingerprints.file_digest(vectors) == truth
    small = tmp_path / "small.json"  # under KEPT_BYTES: this process's memory alone
    small.write_text("{}")
    fingerprints.file_digest(small)
    assert str(small.resolve()) not in json.loads(layout.DIGESTS.read_text())
    layout.DIGESTS.write_text("not json")  # a broken memo: read again, then rewritten
    monkeypatch.setattr(fingerprints, "_digests", {})
    assert fingerprints.file_digest(vectors) == truth


def test_a_search_is_keyed_by_its_trials_training_and_its_own_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 74: tune's key was the whole config but ray_address: changing serve.replicas,
    another variant's model, limits.json_mb or train.keep_runs made bidaf's search start
    over and forget its trials. Its key is now the train row's for the variant (what its
    trials read) and its own settings: those go on; the variant's model, the training
    params and its space do not."""
    from rcpipe.stages.tune import _key

    monkeypatch.chdir(tmp_path)

    def key(*sets: str) -> str:
        return _key(load_config(ROOT / "params.demo.yaml", list(sets)), "bidaf").digest

    base = key()
    for unread in ("serve.replicas=3", "models.rnet.hidden=24", "limits.json_mb=7",
                   "train.keep_runs=5", "train.ray_address=ray://10.0.0.1:10001"):
        assert key(unread) == base, unread
    for read in ("models.bidaf.hidden=24", "train.epochs=3", "tune.trials=7",
                 "tune.bidaf.space={}"):
        assert key(read) != base, read
