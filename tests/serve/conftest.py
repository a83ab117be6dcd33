"""The answer service over the session's trained models: Ray Serve on the session's local
Ray (one Serve start per module that asks for it), behind the guard as `rcpipe serve` runs
it (deployments.guarded): the guard on a free loopback port, the proxy on another."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rcpipe.config import Config, ReadLimits
from rcpipe.inference.combination import Combination
from rcpipe.release import record as champion_record
from rcpipe.release.promotion import pointer
from rcpipe.release.remote import Remote
from rcpipe.serve.app import Limits
from rcpipe.trained.package_dir import sha256
from tests.conftest import Trained
from tests.ray_nodes import free_port

# Test limits: a slow client is cut after 6 s, an idle connection after 2 s. The body's
# deadline runs from when the Ingress starts reading it, so it also holds the time a busy
# Ingress takes to read: at 2 s, 72 of the 200 concurrent requests got 408 while the
# suite's two other workers held the cores
LIMITS = Limits(body_timeout_s=6.0)
KEEP_ALIVE_S = 2
HEADER_TIMEOUT_S = 3.0  # the guard's: short, so that its end-to-end test takes seconds


@dataclass(frozen=True)
class Service:
    url: str
    trained: Trained
    nbest: dict[str, dict[str, Any]]  # model -> qid -> evaluate's (or ensemble's) answer
    contexts: dict[str, str]  # qid -> context
    questions: dict[str, str]  # qid -> question


def light(cfg: Config) -> Config:
    """The session's config with Readers that reserve no Ray CPU: the session's 2-CPU Ray
    may still hold a training test's actors."""
    return cfg.model_copy(update={"serve": cfg.serve.model_copy(update={"replica_cpus": 0})})


@dataclass(frozen=True)
class Front:
    url: str  # the guard's: what `rcpipe serve` listens on
    proxy: str  # Serve's proxy behind it


@pytest.fixture(scope="session")
def front(trained: Trained) -> Iterator[Front]:
    """Ray Serve started once on the session's Ray, behind the guard."""
    from rcpipe.serve import deployments, server

    port = free_port()
    running = deployments.guarded(server.listen("127.0.0.1", port), LIMITS, KEEP_ALIVE_S,
                                  HEADER_TIMEOUT_S, max_connections=1024)
    host, inner = running.guard.upstream
    yield Front(f"http://127.0.0.1:{port}", f"http://{host}:{inner}")
    running.stop()
    deployments.shutdown()


@pytest.fixture(scope="session")
def serve_on_ray(front: Front) -> str:
    """The URL of Serve's proxy itself: the app's own limits are tested without the guard's
    (which refuses a chunked body with 411 before the app's streaming limit sees it)."""
    return front.proxy


@contextmanager
def deployed(app: Any, name: str) -> Iterator[None]:
    """``app`` deployed on the session's Serve under ``name`` at /<name> for the block, then
    deleted: an app left deployed idles for the rest of the session (its replicas, and a
    champion app's registry poll, ~1% of a core each on the 2-core CI machine)."""
    from ray import serve

    from rcpipe.serve import deployments

    deployments.run(app, name=name, route_prefix=f"/{name}")
    try:
        yield
    finally:
        serve.delete(name)


@pytest.fixture(scope="module")
def service(trained: Trained, serve_on_ray: str) -> Service:
    """The ensemble and its voters, as `rcpipe serve` with no --model serves them."""
    from rcpipe.serve import deployments
    from rcpipe.stages.serving import application

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained.root)  # models/ is relative to the run directory
        app, _ = application(light(trained.cfg), None, LIMITS, threads=1)
        deployments.run(app)
        nbest = {m: json.loads(Path(f"predictions/{m}.nbest.json").read_text())
                 for m in (*trained.variants, "ensemble")}
    contexts, questions = {}, {}
    for article in trained.data.dev_doc["data"]:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                contexts[qa["id"]], questions[qa["id"]] = p["context"], qa["question"]
    return Service(serve_on_ray, trained, nbest, contexts, questions)


def champion_workspace(root: Path) -> Remote:
    """A DVC workspace at ``root`` (no git) whose default remote is a local directory beside
    it: where nights put their packages and champion.json."""
    root.mkdir()
    for cmd in (["init", "--no-scm", "-q"],
                ["remote", "add", "-d", "storage", str(root.parent / "dvc-remote")]):
        subprocess.run([sys.executable, "-m", "dvc", *cmd], cwd=root, check=True,
                       capture_output=True)
    return Remote(root, None)


def crown_night(where: Remote, run: str, package: Path, crowned: bool,
                broken: bool = False, also: tuple[Path, ...] = (),
                ensemble: Combination | None = None) -> None:
    """A night's package on the remote (its weights tampered with when ``broken``); when
    ``crowned``, champion.json names it as the gate's promotion writes it. ``also``: more
    of the night's packages, and then the night's champion is their ensemble with it,
    combined as ``ensemble`` says (None: a pointer without the key, the vote)."""
    locals_, urls = {}, {}
    for one in (package, *also):
        variant = json.loads((one / "config.json").read_text())["variant"]
        local = locals_[variant] = one.parent.parent / run / variant
        shutil.copytree(one, local)
        if broken:
            weights = local / "model.safetensors"
            data = bytearray(weights.read_bytes())
            data[-1] ^= 0xFF
            weights.write_bytes(bytes(data))
        for file in sorted(local.iterdir()):
            where.write(file.read_bytes(), "versions", run, "packages", variant, file.name)
        urls[variant] = where._where("versions", run, "packages", variant)[1]
    model = "ensemble" if also else next(iter(urls))
    record = {"run": run, "dvc_lock": f"{run}/dvc.lock", "git_commit": None,
              "packages": urls,
              "packages_sha256": {v: sha256((d / "config.json").read_bytes())
                                  for v, d in locals_.items()},
              "candidate": {"model": model, "run": run, "f1": 0.0, "em": 0.0,
                            "dev_sha256": ""},
              "scores": {m: {"em": 0.0, "f1": 0.0} for m in {*urls, model}},
              **({"ensemble": (ensemble or Combination()).as_dict()} if also else {})}
    # versions/<run>/version.json as `rcpipe version` writes it (`rcpipe champion set`)
    where.write(json.dumps(record).encode(), "versions", run, "version.json")
    if crowned:
        champion = pointer(record, {"model": model, "run": run}, list(urls), locals_, None,
                           {"promoted": True}, ensemble)
        champion_record.append(where, champion_record.read(where, ReadLimits()), champion,
                               "promotion", "the test's night", f"night {run}", ReadLimits())
