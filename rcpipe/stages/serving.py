"""`rcpipe serve`: the answer service on Ray Serve (rcpipe/serve/deployments.py), its
models loaded as `rcpipe predict` loads them (trained/reader.py's ``load_reader``: a
trained variant through trained/model_file.py, a package directory through
trained/package_dir.py, ``--runtime onnx`` its exported graph), each in its own Reader
deployment. It starts its own Ray (or joins RAY_ADDRESS's); on a cluster the RayService of
infra/kuberay/rayservice.yaml serves the champion instead (rcpipe/champion/). No training
code is imported.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

from rcpipe.config import Config
from rcpipe.trained.reader import ENSEMBLE, load_reader, on_device

log = logging.getLogger(__name__)


def answerer(cfg: Config, name: str, runtime: str, threads: int, root: str) -> Any:
    """In a Reader replica: ``name``'s model loaded, and the function answering a batch of
    pairs with it (a context over data.window.max_tokens: {"refused": why} in its place)."""
    import torch

    os.chdir(root)  # the run's models/ and data/ are relative to where `rcpipe serve` ran
    reader = load_reader(on_device(cfg), [name], runtime, threads)
    if threads:
        torch.set_num_threads(threads)

    def answer(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
        return [{"refused": str(a)} if isinstance(a, Exception) else a
                for a in reader.answer_pairs(pairs, name, token_probs=True)]

    return answer


def application(cfg: Config, models: list[str] | None, limits: Any, threads: int = 1,
                runtime: str = "torch", replicas: int | None = None) -> tuple[Any, list[str]]:
    """(the bound Serve application, the names it serves) for ``models`` (default: the
    ensemble and every trained variant). The models are loaded here once first, so a
    mistake (an unknown model, no prepared data, a changed package) is one line before
    any Ray starts; each Reader replica then loads its own."""
    from rcpipe.inference.answer import voted
    from rcpipe.serve.deployments import Scaling
    from rcpipe.serve.deployments import application as bind

    names = models or [ENSEMBLE]
    reader = load_reader(on_device(cfg, replica=False), names, runtime, threads)
    loaded = list(reader.models)
    served = list(dict.fromkeys([*names, *(loaded if ENSEMBLE in names else [])]))
    root = str(Path.cwd())
    loads = {m: partial(answerer, cfg, m, runtime, threads, root) for m in loaded}
    auto = cfg.serve.autoscaling
    scaling = Scaling(
        replicas=replicas or cfg.serve.replicas,
        autoscaling=None if auto is None or replicas else auto.model_dump(),
        replica_cpus=cfg.serve.replica_cpus, replica_gpus=cfg.serve.replica_gpus)
    ensembles = {ENSEMBLE: loaded} if ENSEMBLE in served else {}
    app = bind(loads, ensembles, voted if ensembles else None, served, limits,
               reader.no_answer, scaling)
    return app, served


def join_ray(needed_cpus: float) -> None:
    """The Ray this process joined, RAY_ADDRESS's, or a local one as `rcpipe train` starts it
    (no dashboard), with CPUs enough for the replicas asked."""
    import ray

    if ray.is_initialized():
        return
    from rcpipe.cluster.ray_runtime import connect

    # a cluster asking for a token is one line (ray_runtime.join)
    connect(None, num_cpus=max(os.cpu_count() or 1, int(needed_cpus + 0.999)))


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the service as Ctrl-C does


def _stop_on_sigterm() -> None:
    """SIGTERM (a container runtime's, systemd's stop) handled as SIGINT is: the service
    shut down and Ray's processes ended. Set again once Ray is up: ray.init installs its own
    handler, which aborted the process and left Ray's agents running."""
    signal.signal(signal.SIGTERM, _interrupt)


def serve(cfg: Config, models: list[str] | None = None, host: str = "127.0.0.1",
          port: int = 8000, limits: Any = None, threads: int = 1, runtime: str = "torch",
          replicas: int | None = None) -> None:
    """`rcpipe serve`: the service and its page on http://host:port/ until interrupted
    (SIGINT or SIGTERM: exit 0, Serve and a Ray it started shut down)."""
    from rcpipe.serve import deployments, server
    from rcpipe.serve.app import Limits

    before = signal.signal(signal.SIGTERM, _interrupt)

    # a bad or taken port is said before the models load; the guard answers on it at once,
    # 503 with Retry-After until the app is deployed (rather than refused connections, then
    # Serve's 404 while the app deploys)
    sock = server.listen(host, port)
    s = cfg.serve
    front = deployments.waiting(sock, s.header_timeout_s, s.max_connections)
    serving = False  # Serve started: a mistake before it (a bad model) starts no Ray
    try:
        limits = limits or Limits()
        app, served = application(cfg, models, limits, threads, runtime, replicas)
        count = replicas or s.replicas
        join_ray(count * s.replica_cpus * len([m for m in served if m != ENSEMBLE]))
        _stop_on_sigterm()
        t0, serving = time.perf_counter(), True
        deployments.behind(front, limits, s.keep_alive_s)
        deployments.run(app)
        _stop_on_sigterm()
        front.guard.ready = True
        how = "autoscaled" if s.autoscaling and not replicas else f"{count} replica(s)"
        log.info(f"serve ({runtime}, Ray Serve, {how} a model): {', '.join(served)} on "
                 f"http://{host}:{port}/ (POST /answer, the page at /), up in "
                 f"{time.perf_counter() - t0:.1f} s; Ctrl-C stops")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM: the shutdown goes on
        front.stop()
        sock.close()
        if serving:
            deployments.shutdown()
        signal.signal(signal.SIGTERM, before)
