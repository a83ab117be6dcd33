"""`prefect deployment run train-all/local` against a real Prefect server, worker and Ray.

The stack is the one `make up` starts (flows/stack.py), with a temporary PREFECT_HOME for
the server and another for the client, on a free port of 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from flows import stack
from rcpipe.config import VARIANTS
from tests.conftest import SynthData, questions_of, write_params

TINY = {"hidden": 8, "char_dim": 4, "char_hidden": 8, "heads": 2, "model_blocks": 1,
        "emb_convs": 1, "model_convs": 1, "highway_layers": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prefect_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "client"))
    monkeypatch.setenv("DO_NOT_TRACK", "1")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    home = tmp_path / "server"
    running = stack.up(_free_port(), home)
    try:
        yield running
    finally:
        stack.down(home)


@pytest.mark.integration
def test_deployment_run_train_all_local_completes_with_every_metric(
        prefect_stack: dict, tmp_path: Path, synth_v1: SynthData) -> None:
    params = write_params(tmp_path / "params.yaml",
                          data={"train_file": str(synth_v1.train),
                                "dev_file": str(synth_v1.dev)},
                          train={"max_steps": 3, "batch_size": 8},
                          models={v: TINY for v in VARIANTS})
    work = tmp_path / "work"
    env = stack.server_env(tmp_path / "client", str(prefect_stack["api_url"]))
    run = subprocess.run(
        [stack._prefect(), "deployment", "run", "train-all/local",
         "--param", f"params={params}", "--param", f"workdir={work}",
         "--param", "synth_data=false", "--watch", "--watch-timeout", "1200"],
        env=env, capture_output=True, text=True, timeout=1300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Completed" in run.stdout
    for name in (*VARIANTS, "ensemble"):
        result = json.loads((work / f"metrics/{name}.json").read_text())
        assert set(result) == {"exact_match", "f1"}  # the official v1.1 keys
        assert 0.0 <= result["f1"] <= 100.0
        answers = json.loads((work / f"predictions/{name}.json").read_text())
        assert len(answers) == len(questions_of(synth_v1.dev_doc))
