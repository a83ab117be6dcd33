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
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

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
    from ray._private import ray_constants, utils

    if ray.is_initialized():
        return
    from rcpipe.cluster.ray_runtime import connect

    # ray.init sets two SIGTERM handlers of its own, each of which ended a start-up stopped
    # half-way with Ray's processes left (issue 72): Python's, sys.exit(15), as it begins,
    # and its core worker's C++ failure handler (an abort) as it connects. Neither is set:
    # `rcpipe serve`'s own (sigterm_stops) holds a SIGTERM until ray.init has returned.
    # (This process's own C++ crashes go without Ray's stack trace; its replicas keep it.)
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    with mock.patch.object(utils, "set_sigterm_handler", lambda handler: None), _held():
        # a cluster asking for a token is one line (ray_runtime.join)
        connect(None, num_cpus=max(os.cpu_count() or 1, int(needed_cpus + 0.999)))


class _Stop:
    """`rcpipe serve`'s SIGTERM handler: the stop a container runtime or systemd sends ends
    the service as Ctrl-C does (KeyboardInterrupt in the main thread), once; a second
    SIGTERM lets the shutdown go on. While Ray starts (``held``) it waits for ray.init to
    return: cut half-way, ray.init leaves processes that no ray.shutdown knows of."""

    held = asked = False
    before_hook = sys.__unraisablehook__

    def __call__(self, signum: int, frame: Any) -> None:
        if frame is not None and frame.f_code is _Stop.swallowed.__code__:
            signal.setitimer(signal.ITIMER_REAL, AGAIN_S)  # raised in the hook, it is lost
            return
        if not self.asked:
            self.asked = True
            if not self.held:
                raise KeyboardInterrupt

    def swallowed(self, unraisable: Any) -> None:
        """The unraisable-exception hook: a KeyboardInterrupt that landed in a weakref
        callback or a ``__del__`` (the garbage collector runs them between any two lines,
        e.g. while the models load) is one Python prints as "Exception ignored" and drops;
        the stop is delivered again a moment later (SIGALRM), to ordinary code."""
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            self.before_hook(unraisable)
            return
        self.asked = False
        signal.setitimer(signal.ITIMER_REAL, AGAIN_S)


AGAIN_S = 0.01
_stop = _Stop()


@contextmanager
def _held() -> Iterator[None]:
    _stop.held = True
    try:
        yield
    finally:
        _stop.held = False
    if _stop.asked:  # a SIGTERM came while Ray started: now there is a whole Ray to end
        raise KeyboardInterrupt


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """SIGTERM or Ctrl-C at any moment in here ends it quietly (exit 0). `rcpipe serve` enters
    it first thing, before its models load, Ray starts and Serve deploys (issue 72: a
    SIGTERM while Ray started exited 15 or aborted, Ray's agents left running)."""
    _stop.asked, _stop.before_hook = False, sys.unraisablehook
    before = {n: signal.signal(n, _stop) for n in (signal.SIGTERM, signal.SIGALRM)}
    sys.unraisablehook = _stop.swallowed
    try:
        yield
    except KeyboardInterrupt:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for n, handler in before.items():
            signal.signal(n, handler)
        sys.unraisablehook = _stop.before_hook


def serve(cfg: Config, models: list[str] | None = None, host: str = "127.0.0.1",
          port: int = 8000, limits: Any = None, threads: int = 1, runtime: str = "torch",
          replicas: int | None = None) -> None:
    """`rcpipe serve`: the service and its page on http://host:port/ until interrupted
    (SIGINT or SIGTERM: exit 0, Serve and a Ray it started shut down), under
    ``sigterm_stops``."""
    from rcpipe.serve import deployments, server
    from rcpipe.serve.app import Limits

    # a bad or taken port is said before the models load; the guard answers on it at once,
    # 503 with Retry-After until the app is deployed (rather than refused connections, then
    # Serve's 404 while the app deploys)
    sock = server.listen(host, port)
    s = cfg.serve
    front = None
    serving = False  # Serve started: a mistake before it (a bad model) starts no Ray
    try:
        front = deployments.waiting(sock, s.header_timeout_s, s.max_connections)
        limits = limits or Limits()
        app, served = application(cfg, models, limits, threads, runtime, replicas)
        count = replicas or s.replicas
        join_ray(count * s.replica_cpus * len([m for m in served if m != ENSEMBLE]))
        t0, serving = time.perf_counter(), True
        deployments.behind(front, limits, s.keep_alive_s)
        deployments.run(app)
        front.guard.ready = True
        how = "autoscaled" if s.autoscaling and not replicas else f"{count} replica(s)"
        log.info(f"serve ({runtime}, Ray Serve, {how} a model): {', '.join(served)} on "
                 f"http://{host}:{port}/ (POST /answer, the page at /), up in "
                 f"{time.perf_counter() - t0:.1f} s; Ctrl-C stops")
        while True:
            time.sleep(3600)
    finally:
        if front is not None:
            front.stop()
        sock.close()
        _shut_down(serving)


def _shut_down(serving: bool) -> None:
    """Serve shut down (once started) and Ray left, wherever the start-up was stopped:
    a local Ray's processes end with it, a joined cluster's go on without this driver."""
    import ray

    from rcpipe.serve import deployments

    if serving:
        try:
            deployments.shutdown()
        except Exception as e:  # noqa: BLE001 - a Serve stopped half-way: ray.shutdown ends it
            log.warning(f"Serve's shutdown failed ({e!r:.200}); Ray's goes on")
    ray.shutdown()  # nothing when no Ray was joined
