"""How a training stage opens (cluster/opening.py): the pieces `rcpipe train` and `rcpipe tune`
share, each without Ray."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rcpipe.cluster import opening
from rcpipe.config import Config, load_config
from rcpipe.errors import InputError
from tests.conftest import TINY_MODEL, Prepared, SynthData


def test_no_prepared_data_is_one_line_before_anything_loads(
        make_config: Callable[..., Config], synth_v1: SynthData) -> None:
    cfg = make_config(synth_v1)
    with pytest.raises(InputError) as err:
        opening.model_inputs(cfg)
    assert err.value.file == str(cfg.data.out_dir) and "rcpipe prepare" in err.value.line()


def test_a_size_that_cannot_build_is_one_line_at_its_key(prepared: Prepared) -> None:
    cfg = load_config(prepared.cfg.source, [f"models.qanet.{k}={v}" for k, v in
                                            TINY_MODEL.items()])
    inputs = opening.model_inputs(cfg)
    opening.check_build(cfg, "qanet", inputs, "models.qanet", lambda: cfg.models.of("qanet"))
    bad = cfg.models.of("qanet").model_copy(update={"hidden": 9})  # 2 heads do not divide it
    with pytest.raises(InputError) as err:
        opening.check_build(cfg, "qanet", inputs, "tune.qanet.space.hidden", lambda: bad,
                            "9: ")
    assert err.value.location == "tune.qanet.space.hidden"
    assert err.value.line().startswith(f"error: {cfg.source}: tune.qanet.space.hidden: 9: ")


def test_the_jobs_data_is_absolute_for_workers_elsewhere(prepared: Prepared,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(prepared.out_dir.parent)
    cfg = load_config(prepared.cfg.source, [f"data.out_dir={prepared.out_dir.name}"])
    data = opening.job_data(cfg)
    assert Path(data["train_path"]).is_absolute() and Path(data["dev_path"]).is_absolute()
    assert Path(data["train_path"]).is_dir()


def test_forget_deletes_one_run_or_the_whole_storage(tmp_path: Path) -> None:
    for run in ("run-a", "run-b"):
        (tmp_path / "store" / run / "step-00000001").mkdir(parents=True)
    storage = (str(tmp_path / "store"), None)
    opening.forget(storage, "run-a")
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["run-b"]
    opening.forget(storage, "run-a")  # gone already: nothing to do
    opening.forget(storage)  # a search's --force: its run and its trials
    assert not (tmp_path / "store").exists()
    opening.forget(storage)


def test_a_ray_job_that_left_nothing_here_says_where_it_looked(
        make_config: Callable[..., Config], synth_v1: SynthData, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rcpipe.cluster import jobs_api

    submitted: list[dict[str, Any]] = []
    monkeypatch.setattr(jobs_api, "submit_train", lambda *a, **kw: submitted.append(kw))
    cfg = make_config(synth_v1)
    found = opening.as_ray_job(cfg, "bidaf", False, "r1", True, "tune", lambda: {"done": 1},
                               tmp_path / "x.json", "trials file")
    assert found == {"done": 1}
    assert submitted == [{"run": "r1", "detach": True, "command": "tune"}]
    with pytest.raises(InputError) as err:
        opening.as_ray_job(cfg, "bidaf", False, None, False, "train", lambda: None,
                           tmp_path / "x.json", "trials file")
    assert err.value.line() == (f"error: {tmp_path / 'x.json'}: the Ray job finished but this "
                                "directory has no trials file: it must be on the file system "
                                "the cluster's nodes share")
