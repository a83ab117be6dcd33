"""A temporary DVC workspace of the project for tests: dvc.yaml, the code it lists, the
committed .dvc/config with the remote pointed at a test bucket, a tiny params.yaml holding
every key dvc.yaml tracks, and synthetic SQuAD files (tests/integration/test_nights.py);
what the tests read of it and of the remote, and an endpoint that goes down mid-push."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rcpipe.config import VARIANTS
from tests.conftest import TINY_MODEL, SynthData
from tests.relay import Relay

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BUCKET = "rcpipe-test"  # made by the s3 fixture


def tiny_params(dev_sha256: str) -> dict[str, Any]:
    """Every key dvc.yaml lists, at the smallest sizes that train (2 steps per variant)."""
    return {
        "data": {"train_file": "data/synth/train.json", "dev_file": "data/synth/dev.json",
                 "out_dir": "data/prepared", "cache_dir": "data/cache", "word_vectors": None,
                 "word_dim": 16, "min_word_count": 1, "min_char_count": 1,
                 "missing_vectors": "unk", "answer_search_window": 64,
                 "heldout": {"fraction": 0.05, "seed": 0, "file": None},
                 "window": {"length": 1000, "stride": 500, "train_stride": None},
                 "limits": {"para": 400, "question": 50, "answer": 30, "char": 16},
                 "workers": 1, "sha256": {"data/synth/dev.json": dev_sha256}},
        "train": {"num_workers": 1, "epochs": 1, "batch_size": 8, "seed": 42, "device": "cpu",
                  "threads": 1, "eval_every": 0, "max_steps": 2, "max_minutes": 0,
                  "patience": 0, "tf32": True, "compile": False,
                  "compile_backend": "inductor", "buckets": None, "shuffle_buffer": 32768},
        "eval": {"max_answer_len": 15, "na_threshold": None, "length_prior": False},
        "ensemble": {"method": "selected", "rounds": 10},  # params.yaml's
        # no student: the nights train the variants (the distill stage's own test:
        # tests/stages/test_distill.py); dvc.yaml made without it (make_project)
        "distill": {"student": None, "temperature": 2.0, "alpha": 0.5},
        "models": {v: dict(TINY_MODEL) for v in VARIANTS},  # copies: no YAML aliases
    }


def sh(root: Path, *cmd: str, check: bool = True, timeout: float | None = None
       ) -> subprocess.CompletedProcess[str]:
    """A command in the project with the venv first on PATH (dvc.yaml runs `rcpipe`). No
    clock of its own by default: pytest-timeout's per-test net (pyproject.toml) ends a hung
    one, and a slow one on a busy machine (a first `dvc repro`: 166 s idle, past 600 s at
    load 11-60) is not a failure."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1", "NO_COLOR": "1", "COLUMNS": "200",
           "AWS_MAX_ATTEMPTS": "2"}  # botocore's own retries: keep the outage test short
    exe = [sys.executable, "-m", "dvc"] if cmd[0] == "dvc" else \
        [str(BIN / "rcpipe")] if cmd[0] == "rcpipe" else [cmd[0]]
    out = subprocess.run([*exe, *cmd[1:]], cwd=root, env=env, capture_output=True, text=True,
                         timeout=timeout)
    if check:
        assert out.returncode == 0, f"{cmd}: {out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def make_project(root: Path, synth: SynthData, prefix: str = "dvc",
                 variants: Sequence[str] = VARIANTS) -> Path:
    """The workspace at ``root`` (git committed), not reproduced yet; its remote is
    s3://rcpipe-test/<prefix> (moto keeps one store per process: a prefix per test module).
    ``variants``: its dvc.yaml made in the workspace as a user makes one (rcpipe/pipeline/
    dvc_yaml.py --variants), without a student (tiny_params' distill.student is null)."""
    root.mkdir(parents=True)
    shutil.copytree(REPO / "rcpipe", root / "rcpipe",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    sh(root, sys.executable, "-m", "rcpipe.pipeline.dvc_yaml",
       "--variants", ",".join(variants), "--no-student")
    for split, src in (("train", synth.train), ("dev", synth.dev)):
        (root / "data/synth").mkdir(parents=True, exist_ok=True)
        shutil.copy(src, root / f"data/synth/{split}.json")
    dev_sha256 = hashlib.sha256((root / "data/synth/dev.json").read_bytes()).hexdigest()
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(dev_sha256), sort_keys=False))
    sh(root, "git", "init", "-q")
    (root / ".dvc").mkdir()
    for name in (".dvc/config", ".dvc/.gitignore", ".dvcignore"):
        shutil.copy(REPO / name, root / name)
    # the committed remote names the real bucket; this machine's --local config points it
    # at the test bucket, exactly as README.md tells a user with another bucket to do
    sh(root, "dvc", "remote", "modify", "--local", "storage", "url", f"s3://{BUCKET}/{prefix}")
    sh(root, "git", "add", ".")
    sh(root, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "project")
    return root


OUTPUTS = ("data/cache", "data/prepared", "models", "predictions", "metrics", "reports")


def ran_stages(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines()
            if line.startswith("Running stage '")}


def digests(root: Path) -> dict[str, str]:
    """sha256 of every output file (relative path -> digest)."""
    found = {}
    for top in OUTPUTS:
        for path in sorted((root / top).rglob("*")):
            # not Ray's checkpoints (runs/) and the record of them, prepare's token cache
            # (<data.cache_dir>/tokens/, .dvcignore), nor an output's lock file
            # (rcpipe/locks.py, `.<output>.lock` beside it): not versioned
            lock = path.name.startswith(".") and path.name.endswith(".lock")
            unversioned = {"runs", "tokens"} & set(path.relative_to(root).parts)
            if path.is_file() and not unversioned and not lock and \
                    path.name not in {".gitignore", "runs.json"}:
                found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def remote_objects(s3: Any, prefix: str = "dvc") -> dict[str, bytes]:
    """Every object under the DVC remote's ``prefix`` (make_project's), read straight from
    the endpoint."""
    found = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                             Prefix=f"{prefix}/"):
        for item in page.get("Contents", []):
            found[item["Key"]] = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
    return found


def assert_content_addressed(objects: dict[str, bytes]) -> int:
    """Each DVC object's md5 is its name: a torn or truncated upload would not be."""
    count = 0
    for key, body in objects.items():
        if "/files/md5/" not in key:
            continue
        prefix, rest = key.split("/files/md5/")[1].split("/")
        assert hashlib.md5(body).hexdigest() == prefix + rest.removesuffix(".dir"), key
        count += 1
    return count


class Outage(Relay):
    """A relay in front of the S3 endpoint that drops every connection, and refuses new
    ones, once ``allow`` PUT requests have gone through: the endpoint going down mid-push."""

    def __init__(self, target: int, allow: int) -> None:
        self.allow, self.puts = allow, 0
        self.down_now = threading.Event()
        super().__init__(target)

    def refuses(self) -> bool:
        return self.down_now.is_set()

    def up(self, data: bytes, server: socket.socket, conn: dict[str, Any]) -> bool:
        with self.lock:
            self.puts += data.count(b"PUT /")
            over = self.puts > self.allow
        if over:
            self.down_now.set()
            self.cut()
            return False
        return super().up(data, server, conn)

    def restore(self) -> None:
        self.allow = 10**9
        self.down_now.clear()
