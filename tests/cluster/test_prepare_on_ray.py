"""prepare's tokenizing as Ray tasks over a cluster's nodes (data.on_ray,
rcpipe/cluster/tokenize_tasks.py): on a two-node cluster on loopback, `rcpipe prepare`
writes what one process writes, row for row, and both nodes tokenize and label; the next
night, with one more article, reads every known article from the token cache."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rcpipe import stages
from rcpipe.config import load_config
from rcpipe.errors import InputError
from tests import ray_nodes
from tests.conftest import SynthData, prepared_files, write_params


@pytest.mark.integration
def test_prepare_on_a_two_node_cluster_writes_what_one_process_writes(tmp_path: Path) -> None:
    # 40 articles, ~600 texts and ~480 training questions with dev's: two jobs of ~512 texts
    # and three batches (train, dev, held out) at least, one a node
    params = write_params(tmp_path / "params.yaml", synth={"train_articles": 41,
                                                           "dev_articles": 4}, data={
        "train_file": str(tmp_path / "train.json"), "dev_file": str(tmp_path / "dev.json"),
        "out_dir": str(tmp_path / "here"), "cache_dir": str(tmp_path / "cache-here")})
    cfg = load_config(params)
    stages.synth(cfg)
    whole = json.loads((tmp_path / "train.json").read_text())
    night_one = whole | {"data": whole["data"][:-1]}  # the last article comes a night later
    (tmp_path / "train.json").write_text(json.dumps(night_one))
    stages.prepare(cfg)  # data.workers' one process
    env = ray_nodes.node_env({"NO_COLOR": "1"})
    short = Path(tempfile.mkdtemp(prefix="rp-", dir="/tmp"))  # Ray's sockets: <= 107 bytes
    head, gcs, _ = ray_nodes.start_head(short / "head", env, cpus=1)
    nodes = [head]
    def on_the_cluster() -> subprocess.CompletedProcess[str]:
        # a cache of its own: on the first night every article is tokenized on the cluster
        return subprocess.run(
            [str(Path(sys.executable).parent / "rcpipe"), "prepare", "--params", str(params),
             "--set", "data.on_ray=true", "--set", f"train.ray_address={gcs}",
             "--set", f"data.out_dir={tmp_path / 'cluster'}",
             "--set", f"data.cache_dir={tmp_path / 'cache-cluster'}"],
            env=env, capture_output=True, text=True, timeout=600)

    try:
        nodes.append(ray_nodes.start(short / "second", env, "--address", gcs, "--num-cpus", "1"))
        run = on_the_cluster()
        first = prepared_files(tmp_path / "cluster") if run.returncode == 0 else None
        # the next night: one more training article; only it is tokenized on the cluster
        (tmp_path / "train.json").write_text(json.dumps(whole))
        again = on_the_cluster()
    finally:
        ray_nodes.stop_all(nodes)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "on Ray tasks over 2 CPU(s)" in run.stderr, run.stderr[-3000:]
    assert "prepare: tokenized on 2 Ray node(s), labelled on 2 Ray node(s)" in run.stderr, \
        run.stderr[-3000:]
    assert "prepare: 44 articles tokenized, 0 from the token cache" in run.stderr, \
        run.stderr[-3000:]
    assert first == prepared_files(tmp_path / "here")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "prepare: 1 articles tokenized, 44 from the token cache" in again.stderr, \
        again.stderr[-3000:]
    stages.prepare(cfg)  # the same night in one process: the same folder again
    assert prepared_files(tmp_path / "cluster") == prepared_files(tmp_path / "here")


def test_prepare_on_ray_through_a_jobs_api_url_is_one_located_line(
        make_config, synth_v1: SynthData, tmp_path: Path) -> None:  # noqa: ANN001
    """A Jobs API URL submits jobs; prepare's tasks need a driver that joins the cluster:
    refused before anything is read or started, naming the setting."""
    cfg = make_config(synth_v1, data={"on_ray": True},
                      train={"ray_address": "http://head:8265"})
    with pytest.raises(InputError) as info:
        stages.prepare(cfg)
    assert info.value.location == "data.on_ray", info.value.line()
    assert "http://head:8265 is a Jobs API" in info.value.what
    assert not (tmp_path / "prepared").exists()
