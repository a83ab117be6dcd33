"""Shared fixtures: a tiny synthetic SQuAD dataset, a params file, and one prepared output.

Everything is sized to keep the whole suite fast: a few articles, one tokenizer process.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from filelock import FileLock

from rcpipe import stages
from rcpipe.config import Config, load_config
from rcpipe.data import synth
from tests.marker_audit import job_ledger
from tests.markers import (  # noqa: F401 - the markers' rules: hooks, registered from here
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_runtest_setup,
)

if TYPE_CHECKING:  # heavy: imported where it is used
    from torch import nn

pytest_plugins = ["tests.job_count"]  # the suite's Ray Train jobs, counted and capped


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long files first: every file with a test marked slow, integration or trains (Ray,
    Prefect and dvc start-ups, minutes each) ahead of the rest, each file's tests kept
    together and in order. `make test`'s workers take a file each as they free up, in this
    order (--no-loadscope-reorder; xdist's own order, most tests first, ran the files of
    one or two long tests last, one worker alone with them for minutes at the end), so the
    short files fill the end and the two workers finish together."""
    long = {item.path for item in items
            if any(item.get_closest_marker(m) for m in ("slow", "integration", "trains"))}
    items.sort(key=lambda item: item.path not in long)  # stable: files stay contiguous


# params.demo.yaml with small synth sizes, a small word_dim and one tokenizer process
PARAMS: dict[str, Any] = {
    "data": {
        "train_file": "data/synth/train.json",
        "dev_file": "data/synth/dev.json",
        "out_dir": "data/prepared",
        "cache_dir": "data/cache",
        "word_vectors": None,
        "word_dim": 16,
        "limits": {"para": 400, "question": 50, "answer": 30, "char": 16},
        "workers": 1,
    },
    "synth": {
        "seed": 13,
        "version": "1.1",
        "train_articles": 4,  # one of them held out (data.heldout: at least one)
        "dev_articles": 2,
        "paragraphs_per_article": 3,
        "questions_per_paragraph": 4,
    },
    # one torch thread: make test runs two pytest workers on two cores, and a Ray Train
    # worker otherwise takes its CPU share (2 here) of threads, whose OpenMP waits spin
    # against the other worker's tests (test_qanet: 10x slower beside a busy job)
    "train": {"num_workers": 1, "epochs": 1, "batch_size": 8, "seed": 42, "device": "cpu",
              "threads": 1},
    "eval": {"max_answer_len": 15},
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def write_params(path: Path, **sections: dict[str, Any]) -> Path:
    """PARAMS with ``sections`` merged in (``data={"workers": 2}``), written as YAML."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(_merge(PARAMS, sections), sort_keys=False))
    return path


def questions_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [qa for a in doc["data"] for p in a["paragraphs"] for qa in p["qas"]]


@dataclass(frozen=True)
class SynthData:
    version: str
    train: Path
    dev: Path
    train_doc: dict[str, Any]
    dev_doc: dict[str, Any]


@contextmanager
def built_once(factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """(folder, build?) for a session fixture both pytest workers share: the first to ask
    builds it (``build`` True) while the other waits on the lock, then reads what was built
    (docs/dev/testing.md: a Ray Train job trained once for every test that reads it). The
    folder is read-only to the tests: one that must write copies it first."""
    base = factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's
    root, done = shared / name, shared / f"{name}.built"
    with FileLock(shared / f"{name}.lock"):
        build = not done.exists()
        if build:
            shutil.rmtree(root, ignore_errors=True)  # a builder that failed half-way
            root.mkdir()
        yield root, build
        if build:
            done.touch()


def _synth(factory: pytest.TempPathFactory, version: str) -> SynthData:
    s = PARAMS["synth"]
    with built_once(factory, f"synth_v{version[0]}") as (root, build):
        if build:
            for split, seed, articles in (("train", s["seed"], s["train_articles"]),
                                          ("dev", s["seed"] + 1, s["dev_articles"])):
                doc = synth.generate(seed, articles, s["paragraphs_per_article"],
                                     s["questions_per_paragraph"], version=version,
                                     unanswerable_fraction=0.3, title_prefix=f"t-{split}")
                synth.write(doc, root / f"{split}.json")
        docs = {split: json.loads((root / f"{split}.json").read_text(encoding="utf-8"))
                for split in ("train", "dev")}
    return SynthData(version, root / "train.json", root / "dev.json", docs["train"], docs["dev"])


def prepared_files(out: Path) -> dict[str, Any]:
    """Everything prepare wrote in ``out`` that a later stage reads, but where it came from:
    two prepares that wrote the same data compare equal."""
    import pyarrow.parquet as pq

    meta = json.loads((out / "meta.json").read_text())
    return {"rows": {s: pq.read_table(out / s).to_pylist() for s in ("train", "dev", "heldout")},
            **{n: (out / n).read_bytes() for n in ("vocab.json", "report.json", "heldout.json")},
            **{k: meta[k] for k in ("words", "chars", "version", "heldout", "splits")}}


@pytest.fixture(scope="session")
def synth_v1(tmp_path_factory: pytest.TempPathFactory) -> SynthData:
    """A tiny SQuAD v1.1 train/dev pair (read-only: tests must not modify it)."""
    return _synth(tmp_path_factory, "1.1")


@pytest.fixture(scope="session")
def synth_v2(tmp_path_factory: pytest.TempPathFactory) -> SynthData:
    """A tiny SQuAD v2.0 train/dev pair with unanswerable questions (read-only)."""
    return _synth(tmp_path_factory, "2.0")


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., Config]:
    """Build a Config from PARAMS plus overrides, with absolute paths under tmp_path."""

    def make(synth_data: SynthData, /, **sections: dict[str, Any]) -> Config:
        base = {"data": {"train_file": str(synth_data.train), "dev_file": str(synth_data.dev),
                         "out_dir": str(tmp_path / "prepared"),
                         "cache_dir": str(tmp_path / "cache")}}
        params = write_params(tmp_path / "params.yaml", **_merge(base, sections))
        return load_config(params)

    return make


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary current directory holding params.yaml (relative paths, as in the demo)."""
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path / "params.yaml")
    return tmp_path


@dataclass(frozen=True)
class Prepared:
    cfg: Config
    data: SynthData
    out_dir: Path
    report: dict[str, Any]


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory, synth_v1: SynthData) -> Prepared:
    """`stages.prepare` run once on synth_v1, for tests that only read its output."""
    with built_once(tmp_path_factory, "prepared") as (root, build):
        params = root / "params.yaml"
        if build:
            write_params(params, data={
                "train_file": str(synth_v1.train), "dev_file": str(synth_v1.dev),
                "out_dir": str(root / "out"), "cache_dir": str(root / "cache")})
            report = stages.prepare(load_config(params))
            (root / "report.json").write_text(json.dumps(report), encoding="utf-8")
        report = json.loads((root / "report.json").read_text(encoding="utf-8"))
    return Prepared(load_config(params), synth_v1, root / "out", report)


@pytest.fixture(scope="session")
def v2_splits(tmp_path_factory: pytest.TempPathFactory, synth_v2: SynthData
              ) -> tuple[Any, Any]:
    """(dev, held-out) of synth_v2 as prepare writes them: the held-out slice is one of
    the training file's articles."""

    from rcpipe.data.dataset import SquadDataset
    from rcpipe.inference.reading import Split

    root = tmp_path_factory.mktemp("v2_heldout")
    cfg = load_config(write_params(root / "params.yaml", data={
        "train_file": str(synth_v2.train), "dev_file": str(synth_v2.dev),
        "out_dir": str(root / "out"), "cache_dir": str(root / "cache")}))
    stages.prepare(cfg)
    out = root / "out"
    return (Split(SquadDataset.from_parquet(out / "dev"), synth_v2.dev_doc),
            Split(SquadDataset.from_parquet(out / "heldout"),
                  json.loads((out / "heldout.json").read_text())))


def vectors_for_half(prepared: Prepared, path: Path) -> tuple[list[str], set[str]]:
    """A GloVe-format file at ``path`` (4-d) with a vector for every other training word of
    ``prepared`` (made without vectors, so its vocabulary is the training words): those
    words (count order) and the ones no case form of which has a vector."""

    from rcpipe.data.vocab import case_forms

    words = json.loads((prepared.out_dir / "vocab.json").read_text())["words"][2:]
    given = {w for w in words[::2] if w and w == w.strip()}
    path.write_text("".join(f"{w} {i % 7} 1 2 {i % 3}\n" for i, w in enumerate(sorted(given))))
    lacking = {w for w in words if not any(f in given for f in case_forms(w))}
    return words, lacking


# What a node's AWS environment holds in the tests: the loopback S3 (moto) takes any key
AWS_WORKER_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="session")
def local_ray() -> Iterator[None]:
    """One real local Ray cluster (2 CPUs, as on the CI machine) for every training test.

    stages.train joins a Ray that this process already started instead of starting its own.
    """
    import ray

    from rcpipe.cluster.ray_runtime import start_local_ray

    # the workers find S3 credentials in their own environment (rcpipe never hands them
    # keys): the test cluster's processes carry the dummy ones the loopback S3 takes
    with pytest.MonkeyPatch.context() as mp:
        for key, value in AWS_WORKER_ENV.items():
            mp.setenv(key, value)
        start_local_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def join_local_ray(local_ray: None) -> Iterator[str]:
    """RAY_ADDRESS set to the test cluster for the module: `rcpipe train` in a subprocess
    joins it (as on a cluster) instead of starting a Ray of its own, ~10 s a command."""
    import ray

    address = ray.get_runtime_context().gcs_address
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ADDRESS", address)
        yield address


# `rcpipe` as the jobs of lifecycle_jobs_api run it: a run's life (its lines, its pid, its
# summary at the end) with no training in it, held while ./hold exists in the job's directory
HELD_TRAIN = """#!/bin/sh
echo "rcpipe $1 $2 (pid $$)"
echo $$ > "pid-$2"
while [ -e hold ]; do sleep 0.1; done
mkdir -p "models/$2"
echo '{"finished": true}' > "models/$2/summary.json"
echo "trained $2"
"""


@pytest.fixture(scope="session")
def lifecycle_jobs_api() -> Iterator[str]:
    """A Ray head with the Jobs API (``ray start``, its own temp dir; its URL) whose jobs'
    ``rcpipe`` is HELD_TRAIN: the submitter under test is the real one, the job a short
    shell loop, for tests about a job's life, not its training."""
    from tests import ray_nodes

    short = Path(tempfile.mkdtemp(prefix="rj-", dir="/tmp"))  # Ray's sockets: <= 107 bytes
    fake = short / "bin" / "rcpipe"
    fake.parent.mkdir()
    fake.write_text(HELD_TRAIN)
    fake.chmod(0o755)
    env = ray_nodes.node_env({})
    env["PATH"] = f"{fake.parent}{os.pathsep}{env['PATH']}"
    head, _, url = ray_nodes.start_head(short / "head", env, cpus=1)
    try:
        yield url
    finally:
        ray_nodes.stop_all([head])  # and removes ``short``


def start_s3(mp: pytest.MonkeyPatch, bucket: str, **env: str) -> tuple[Any, int, Any]:
    """A real moto S3 server on a free port of 127.0.0.1 holding ``bucket``, the standard
    AWS variables pointing at it (AWS_ENDPOINT_URL, dummy keys, and ``env``), as they would
    at MinIO or any S3-compatible endpoint; (the server, its port, a boto3 client)."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                       **AWS_WORKER_ENV, **env}.items():
        mp.setenv(key, value)
    mp.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    return server, port, client


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """The loopback S3 (start_s3) for a module; yields a client with a bucket 'rcpipe-test'."""
    with pytest.MonkeyPatch.context() as mp:
        server, _, client = start_s3(mp, "rcpipe-test")
        try:
            yield client
        finally:
            server.stop()


# model sizes small enough to train in seconds (tests/stages/test_train.py's TINY)
TINY_MODEL = {"hidden": 8, "char_dim": 4, "char_hidden": 8, "layers": 1, "heads": 2,
              "model_blocks": 1, "emb_convs": 1, "model_convs": 1, "highway_layers": 1}


@dataclass(frozen=True)
class Trained:
    """A run directory (models/, predictions/, metrics/) and the config that made it."""

    root: Path
    cfg: Config
    data: SynthData
    variants: tuple[str, ...]
    summary: dict[str, Any]  # what stages.train returned for bidaf


def save_untrained_model(cfg: Config, variant: str, no_answer: bool = False) -> Path:
    """models/<variant>/model.pt (relative to the current directory) with initial weights,
    for tests about what is done with a model file rather than what it learned."""

    import torch

    from rcpipe.data.prepared import Prepared
    from rcpipe.models import ModelInputs, build_model
    from rcpipe.trained.model_file import model_payload

    vocab = json.loads((cfg.data.out_dir / "vocab.json").read_text())
    inputs = ModelInputs(len(vocab["words"]), len(vocab["chars"]), cfg.data.word_dim, None,
                         no_answer)
    model = build_model(variant, cfg.models.of(variant), inputs)
    path = Path("models") / variant / "model.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model_payload(variant, cfg.models.of(variant), inputs, model.state_dict(),
                             Prepared(cfg.data.out_dir).vocab_digest()), path)
    return path


def write_package(prepared: Prepared, out: Path, variant: str = "qanet",
                  threshold: dict[str, Any] | None = None) -> nn.Module:
    """A package of ``variant``'s initial weights (TINY_MODEL, seed 0) on ``prepared``'s
    vocabulary at ``out``, as `rcpipe package` writes one, for tests about loading a package
    rather than what it learned; returns the model (eval mode)."""
    import torch

    from rcpipe.config import ModelConfig
    from rcpipe.models import build_model
    from rcpipe.trained.model_file import prepared_inputs
    from rcpipe.trained.package_dir import package_files

    torch.manual_seed(0)
    mc = ModelConfig.model_validate({**prepared.cfg.models.of(variant).model_dump(),
                                     **TINY_MODEL})
    inputs = prepared_inputs(prepared.out_dir, prepared.cfg.data.word_dim)
    model = build_model(variant, mc, inputs).eval()
    inputs_doc = {k: v for k, v in vars(inputs).items()} | {"vectors": None}
    config = {"variant": variant, "model_config": mc.model_dump(), "inputs": inputs_doc,
              "data": {"version": "1.1", "char_limit": 16,
                       "window": {"length": 1000, "stride": 500}},
              # a prior of max_answer_len weights, as evaluate's: one a length
              "decoding": {"max_answer_len": 3, "length_prior": [0.5, 0.25, 0.25]}}
    files = package_files(config, model.state_dict(),
                          (prepared.out_dir / "vocab.json").read_bytes(), threshold, "# card\n")
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
    return model


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, synth_v1: SynthData,
            request: pytest.FixtureRequest) -> Trained:
    """bidaf trained for 3 steps on synth_v1 through Ray Train and qanet with its initial
    weights (a second voter without a second Ray job), each evaluated, and their ensemble,
    once for both pytest workers (built_once): for the tests that use trained models
    (predict, serve). Read-only; chdir to ``root`` to use it (models/ is relative to it)."""
    variants = ("bidaf", "qanet")
    with built_once(tmp_path_factory, "trained") as (root, build):
        params = root / "params.yaml"
        if build:
            request.getfixturevalue("local_ray")  # only the worker that trains starts one
            write_params(params, data={
                "train_file": str(synth_v1.train), "dev_file": str(synth_v1.dev),
                "out_dir": str(root / "data" / "prepared"),
                "cache_dir": str(root / "data" / "cache"),
            }, train={"batch_size": 8, "max_steps": 3},
                models=dict.fromkeys(variants, TINY_MODEL))
            cfg = load_config(params)
            with pytest.MonkeyPatch.context() as mp:
                mp.chdir(root)
                mp.setenv(job_ledger.LABEL, "trained")  # job_count.SHARED_JOBS
                stages.prepare(cfg)
                stages.train(cfg, "bidaf")
                save_untrained_model(cfg, "qanet")
                for v in variants:
                    stages.evaluate(cfg, v)
                stages.ensemble(cfg, [Path(f"predictions/{v}.nbest.json") for v in variants])
        summary = json.loads((root / "models" / "bidaf" / "summary.json").read_text())
    return Trained(root, load_config(params), synth_v1, variants, summary)


# A run long enough to be interrupted mid-training and resumed: tests/faults/test_kills.py
# kills `rcpipe train` with SIGKILL, tests/integration/test_prefect_deployment.py loses the
# node its Ray job trains on; each compares the resumed run with `undisturbed`. bidaf: its
# tiny model's dev F1 moves within 40 steps (qanet's, in its warm-up, does not)
RESUMED_VARIANT = "bidaf"
RESUMED_TRAIN = {"max_steps": 40, "eval_every": 4, "batch_size": 4, "epochs": 50,
                 "threads": 1}


@pytest.fixture(scope="session")
def undisturbed(tmp_path_factory: pytest.TempPathFactory, prepared: Prepared
                ) -> dict[str, Any]:
    """The summary of RESUMED_VARIANT trained RESUMED_TRAIN's steps on ``prepared`` in one
    plain process (train_local: the Worker every Ray Train rank runs), never interrupted:
    the reference that each interrupted and resumed run must match (one run for both
    pytest workers: built_once)."""
    from rcpipe.train.local import train_local

    with built_once(tmp_path_factory, "undisturbed") as (root, build):
        if build:
            params = write_params(root / "params.yaml", data={
                "train_file": str(prepared.data.train), "dev_file": str(prepared.data.dev),
                "out_dir": str(prepared.out_dir), "cache_dir": str(root / "cache"),
            }, train=RESUMED_TRAIN, models={RESUMED_VARIANT: TINY_MODEL})
            summary = train_local(load_config(params), RESUMED_VARIANT, root / RESUMED_VARIANT)
            (root / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
        return json.loads((root / "summary.json").read_text(encoding="utf-8"))
