"""`rcpipe train` through a cluster's Jobs API (rcpipe/train/jobs.py); a two-node cluster
that loses a node under a deployment's run is tests/integration/test_prefect_deployment.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rcpipe import stages
from rcpipe.config import load_config
from rcpipe.errors import InputError
from rcpipe.train.jobs import entrypoint, is_jobs_api, job_config, jobs_api_address
from tests import ray_nodes
from tests.conftest import SynthData

TINY = {"hidden": 8, "char_dim": 4, "char_hidden": 8, "layers": 1, "highway_layers": 1}


def test_a_dashboard_url_means_the_jobs_api() -> None:
    assert is_jobs_api("http://head:8265") and is_jobs_api("https://ray.example.org")
    assert not any(is_jobs_api(a) for a in (None, "auto", "127.0.0.1:6379"))


def test_ray_address_may_name_the_jobs_api_as_rays_own_cli_reads_it(
        make_config, synth_v1: SynthData, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    assert jobs_api_address(make_config(synth_v1)) == "http://head:8265"
    assert jobs_api_address(make_config(synth_v1, train={"ray_address": "auto"})) == \
        "http://head:8265"
    # a cluster named in the params wins; inside a job RAY_ADDRESS is the cluster's GCS
    assert jobs_api_address(make_config(synth_v1, train={"ray_address": "10.0.0.1:6379"})) \
        is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert jobs_api_address(make_config(synth_v1, train={"ray_address": "auto"})) is None


def test_the_job_runs_the_same_config_in_the_same_directory(
        make_config, synth_v1: SynthData, tmp_path: Path) -> None:  # noqa: ANN001
    cfg = make_config(synth_v1, train={"ray_address": "http://head:8265", "max_steps": 7})
    shared = tmp_path / "shared dir"
    shared.mkdir()
    fake = tmp_path / "bin" / "rcpipe"  # what the head's rcpipe would be handed
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$@"\npwd\ncp "$4" job.yaml\n')
    fake.chmod(0o755)
    command = entrypoint("bidaf", job_config(cfg), shared, force=True)
    ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                         env={"PATH": f"{fake.parent}:/usr/bin:/bin"}, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    argv, where = ran.stdout.splitlines()[:2]
    assert argv.startswith("train bidaf --params /") and argv.endswith(" --force")
    assert where == str(shared)
    again = load_config(shared / "job.yaml")  # the params as the job read them
    assert again.train.ray_address == "auto"
    assert again.model_dump() == cfg.model_copy(update={"train": cfg.train.model_copy(
        update={"ray_address": "auto"})}).model_dump()
    gone = subprocess.run(["bash", "-c", entrypoint("bidaf", "x: 1", tmp_path / "nope", False)],
                          capture_output=True, text=True)
    assert gone.returncode == 2 and "not on this node" in gone.stderr


def test_no_jobs_api_at_the_address_is_one_located_error(
        make_config, synth_v1: SynthData) -> None:  # noqa: ANN001
    address = f"http://127.0.0.1:{ray_nodes.free_port()}"  # nothing listens there
    cfg = make_config(synth_v1, train={"ray_address": address})
    with pytest.raises(InputError) as err:
        stages.train(cfg, "bidaf")
    assert err.value.location == "train.ray_address" and address in err.value.what
