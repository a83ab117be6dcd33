"""`rcpipe serve`: the answer service on Ray Serve (rcpipe/serve/deployments.py), its
models loaded as `rcpipe predict` loads them (stages/predict.py's ``load_reader``: a
trained variant through trained/model_file.py, a package directory through trained/package_dir.py,
``--runtime onnx`` its exported graph), each in its own Reader deployment.

Locally it starts its own Ray (or joins RAY_ADDRESS's); on a cluster the RayService of
infra/kuberay/rayservice.yaml builds the application with ``champion_app``: the champion's
package from the DVC remote. No training code is imported.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

from rcpipe.config import Config, load_config
from rcpipe.errors import InputError
from rcpipe.stages.predict import ENSEMBLE, load_reader

log = logging.getLogger(__name__)


def answerer(cfg: Config, name: str, runtime: str, threads: int, root: str) -> Any:
    """In a Reader replica: ``name``'s model loaded, and the function answering a batch of
    pairs with it (a context over data.window.max_tokens: {"refused": why} in its place)."""
    import torch

    os.chdir(root)  # the run's models/ and data/ are relative to where `rcpipe serve` ran
    reader = load_reader(cfg, [name], runtime, threads)
    if threads:
        torch.set_num_threads(threads)

    def answer(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
        return [{"refused": str(a)} if isinstance(a, Exception) else a
                for a in reader.answer_pairs(pairs, name, token_probs=True)]

    return answer


def vote(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The ensemble's answer from its voters' (inference/answer.py's vote, as `rcpipe evaluate`
    votes), with the context's tokens the voters share."""
    from rcpipe.inference.answer import vote as majority

    voted = majority([{"q": a} for a in answers], token_probs=True)["q"]
    return voted | {"tokens": answers[0]["tokens"]}


def application(cfg: Config, models: list[str] | None, limits: Any, threads: int = 1,
                runtime: str = "torch", replicas: int | None = None) -> tuple[Any, list[str]]:
    """(the bound Serve application, the names it serves) for ``models`` (default: the
    ensemble and every trained variant). The models are loaded here once first, so a
    mistake (an unknown model, no prepared data, a changed package) is one line before
    any Ray starts; each Reader replica then loads its own."""
    from rcpipe.serve.deployments import Scaling
    from rcpipe.serve.deployments import application as bind

    names = models or [ENSEMBLE]
    reader = load_reader(cfg, names, runtime, threads)
    loaded = list(reader.models)
    served = list(dict.fromkeys([*names, *(loaded if ENSEMBLE in names else [])]))
    root = str(Path.cwd())
    loads = {m: partial(answerer, cfg, m, runtime, threads, root) for m in loaded}
    auto = cfg.serve.autoscaling
    scaling = Scaling(
        replicas=replicas or cfg.serve.replicas,
        autoscaling=None if auto is None or replicas else auto.model_dump(),
        replica_cpus=cfg.serve.replica_cpus)
    ensembles = {ENSEMBLE: loaded} if ENSEMBLE in served else {}
    app = bind(loads, ensembles, vote if ensembles else None, served, limits,
               reader.no_answer, scaling)
    return app, served


def join_ray(needed_cpus: float) -> None:
    """The Ray this process joined, RAY_ADDRESS's, or a local one as `rcpipe train` starts it
    (no dashboard), with CPUs enough for the replicas asked."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], logging_level="WARNING",
                 log_to_driver=False)
        return
    ray.init(num_cpus=max(os.cpu_count() or 1, int(needed_cpus + 0.999)),
             include_dashboard=False, logging_level="WARNING", log_to_driver=False)


def serve(cfg: Config, models: list[str] | None = None, host: str = "127.0.0.1",
          port: int = 8000, limits: Any = None, threads: int = 1, runtime: str = "torch",
          replicas: int | None = None) -> None:
    """`rcpipe serve`: the service and its page on http://host:port/ until interrupted."""
    from rcpipe.serve import deployments, server
    from rcpipe.serve.app import Limits

    # a bad or taken port is said before the models load; the guard serves on the socket
    sock = server.listen(host, port)
    try:
        limits = limits or Limits()
        app, served = application(cfg, models, limits, threads, runtime, replicas)
        count = replicas or cfg.serve.replicas
        join_ray(count * cfg.serve.replica_cpus * len([m for m in served if m != ENSEMBLE]))
    except BaseException:
        sock.close()
        raise
    t0 = time.perf_counter()
    s = cfg.serve
    front = deployments.guarded(sock, limits, s.keep_alive_s, s.header_timeout_s,
                                s.max_connections)
    try:
        deployments.run(app)
        how = "autoscaled" if s.autoscaling and not replicas else f"{count} replica(s)"
        log.info(f"serve ({runtime}, Ray Serve, {how} a model): {', '.join(served)} on "
                 f"http://{host}:{port}/ (POST /answer, the page at /), up in "
                 f"{time.perf_counter() - t0:.1f} s; Ctrl-C stops")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        front.stop()
        deployments.shutdown()


def champion_app(args: dict[str, Any]) -> Any:
    """The RayService's application (infra/kuberay/rayservice.yaml): ``args["package"]``, a
    package on the DVC remote (champion.json's "package", read through the workspace's
    .dvc/config) or a directory, downloaded and served as the default model;
    ``args["params"]``: the params file (its serve section, data.window). Promoting a new
    champion changes ``package``: Serve rolls the replicas over to it, new ones answering
    before old ones drain (tests/serve/test_rollout.py)."""
    from rcpipe.serve.app import Limits

    cfg = load_config(args.get("params", "params.yaml"))
    package = str(args["package"])
    if "://" in package:
        from rcpipe.stages.remote import Remote

        where = Remote(Path(args.get("workspace", ".")), args.get("remote"))
        key = hashlib.sha256(package.encode()).hexdigest()[:16]  # one folder per package
        package = str(where.download(package, Path(args.get("cache", "/tmp/rcpipe-champion"))
                                     / key, cfg.limits))
    if not Path(package).is_dir():
        raise InputError(package, "", "no package directory")
    s = cfg.serve
    limits = Limits(max_batch=s.max_batch, max_wait_ms=s.batch_wait_ms, timeout_s=s.timeout_s,
                    max_pending=s.max_pending, body_timeout_s=s.body_timeout_s)
    app, _ = application(cfg, [package], limits, int(args.get("threads", 1)))
    return app
