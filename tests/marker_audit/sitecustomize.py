"""The marker audit (RCPIPE_MARKER_AUDIT=1): a test that starts Ray, Prefect or an S3 server
and is not marked ``integration``, or trains a model and is not marked ``trains``, fails.

Why at the entry points, at run time: which tests start what is decided by fixtures,
helpers and subprocesses several calls away (``rcpipe train`` in a subprocess starts Ray;
a dvc stage trains), so reading the test's source would miss most of them. Each start goes
through one of a few calls, wrapped here to ask first whether the running test may:

- ray: ``ray.init`` (a local Ray, or joining one), ``ray start`` in a subprocess;
- prefect: Prefect's test server (``SubprocessASGIServer.start``, what
  prefect_test_harness runs), ``prefect server start`` in a subprocess;
- s3: moto's ``ThreadedMotoServer.start``, ``moto_server`` in a subprocess;
- train: ``rcpipe.train.worker.Worker.train``, the loop every training run goes through
  (train_local, each Ray Train rank, ``rcpipe train``, a flow, a dvc stage), and the
  optimizer step past STEPS_ALLOWED in one test (torch's global step hook: a test's own
  loop that overfits a batch or trains a model for its fixture).

It raises before the call, so an audited run starts nothing heavy. tests/conftest.py
installs it in the pytest process and puts this directory on PYTHONPATH, so that Python
imports this file as ``sitecustomize`` in every Python subprocess a test starts (an
``rcpipe`` command, ``python -m dvc``, a flow): those are audited as well, and write what
they refused to the audit log, which the pytest process reads after each phase of a test
(a subprocess's refusal may be a failed command that the test expected to fail). The
running test and what its markers allow are passed down in the environment, also to a
subprocess given an environment of its own (Popen's env=, which the audit completes).

Meant for the fast selection (make test-fast: no integration, no trains), where nothing
heavy may start at all: processes that outlive a test (a Ray node's workers) keep the
environment of the test that started them, so the audit is not for the full suite.

The same start-up hook carries the Ray Train job ledger (job_ledger.py, RCPIPE_JOB_LEDGER:
every run, the full suite's too), which only records, never refuses.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SWITCH = "RCPIPE_MARKER_AUDIT"  # "1": audit
TEST = "RCPIPE_MARKER_AUDIT_TEST"  # the running test's node id
ALLOWED = "RCPIPE_MARKER_AUDIT_ALLOWED"  # what its markers allow: "ray,prefect,s3,train"
LOG = "RCPIPE_MARKER_AUDIT_LOG"  # a file: a line a refusal, "<test>\t<kind>\t<what>\t<pid>"

if __name__ == "sitecustomize":  # a subprocess: this directory is on sys.path
    import job_ledger
else:  # the pytest process: imported as a module of tests
    from tests.marker_audit import job_ledger

# what each marker allows a test to start
ALLOWS = {"integration": ("ray", "prefect", "s3"), "trains": ("train",),
          "ray_train": ("ray_train",)}
MARKER_OF = {kind: marker for marker, kinds in ALLOWS.items() for kind in kinds}
VERB = {"ray": "starts Ray", "prefect": "starts a Prefect server", "s3": "starts an S3 server",
        "train": "trains a model", "ray_train": "starts a Ray Train job"}


class MarkerAuditError(RuntimeError):
    """A test started what its markers do not allow."""


def hit(kind: str, what: str) -> None:
    """Refuse ``kind`` unless the running test's markers allow it: log it, raise."""
    if kind in os.environ.get(ALLOWED, "").split(","):
        return
    test = os.environ.get(TEST, "") or "(no test)"
    message = (f"{test} {VERB[kind]} ({what}) but is not marked {MARKER_OF[kind]} "
               f"(pyproject.toml's markers; tests/marker_audit/sitecustomize.py)")
    log = os.environ.get(LOG)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{test}\t{kind}\t{what}\t{os.getpid()}\n")
    raise MarkerAuditError(message)


def _audited(kind: str, what: str, original: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(original, "__marker_audit__", False):
        return original  # installed twice (the pytest process): wrapped once

    @functools.wraps(original)
    def audited(*args: Any, **kwargs: Any) -> Any:
        hit(kind, what)
        return original(*args, **kwargs)

    audited.__marker_audit__ = True  # type: ignore[attr-defined]
    return audited


def _patch_ray(module: Any) -> None:
    module.init = _audited("ray", "ray.init", module.init)


def _patch_moto(module: Any) -> None:
    cls = module.ThreadedMotoServer
    cls.start = _audited("s3", "ThreadedMotoServer.start", cls.start)


def _patch_prefect(module: Any) -> None:
    cls = module.SubprocessASGIServer
    cls.start = _audited("prefect", "SubprocessASGIServer.start", cls.start)


def _patch_fit(module: Any) -> None:
    cls = module.DataParallelTrainer
    cls.fit = _audited("ray_train", "DataParallelTrainer.fit", cls.fit)


def _patch_worker(module: Any) -> None:
    cls = module.Worker
    cls.train = _audited("train", "rcpipe.train.worker.Worker.train", cls.train)


# more optimizer steps than this in one test train a model too (overfitting a batch); a
# model's unit test takes a step or a few
STEPS_ALLOWED = 50
_steps: dict[str, int] = {}  # test -> optimizer steps taken in this process


def _patch_optimizer(module: Any) -> None:
    def counted(optimizer: Any, args: Any, kwargs: Any) -> None:
        test = os.environ.get(TEST, "")
        _steps[test] = _steps.get(test, 0) + 1
        if _steps[test] == STEPS_ALLOWED + 1:
            hit("train", f"over {STEPS_ALLOWED} optimizer steps")

    module.register_optimizer_step_post_hook(counted)


PATCHES: dict[str, Callable[[Any], None]] = {
    "ray": _patch_ray,
    "moto.server": _patch_moto,
    "prefect.server.api.server": _patch_prefect,
    "rcpipe.train.worker": _patch_worker,
    job_ledger.FIT: _patch_fit,
    "torch.optim.optimizer": _patch_optimizer,
}


def _command_kind(args: Any) -> tuple[str, str] | None:
    """(kind, what) of a command line that starts a server, else None."""
    argv = args.split() if isinstance(args, str | bytes) else list(args)
    argv = [os.fsdecode(a) if isinstance(a, bytes | os.PathLike) else str(a) for a in argv]
    if not argv:
        return None
    name = Path(argv[0]).name
    if name == "ray" and "start" in argv[1:]:
        return "ray", "`ray start`"
    if name == "prefect" and "server" in argv[1:] and "start" in argv[1:]:
        return "prefect", "`prefect server start`"
    if name == "moto_server":
        return "s3", "`moto_server`"
    return None


def _audited_env(env: Any) -> dict[Any, Any]:
    """``env`` with the audit's variables and this directory first on PYTHONPATH."""
    env = dict(env)
    for key in (SWITCH, TEST, ALLOWED, LOG, job_ledger.LEDGER, job_ledger.LABEL):
        if key in os.environ:
            env.setdefault(key, os.environ[key])  # a probe run's own ledger stays its own
    here = str(Path(__file__).resolve().parent)
    paths = [p for p in str(env.get("PYTHONPATH", "")).split(os.pathsep) if p]
    if here not in paths:
        env["PYTHONPATH"] = os.pathsep.join([here, *paths])
    return env


def _patch_popen() -> None:
    init = subprocess.Popen.__init__
    if getattr(init, "__marker_audit__", False):
        return

    @functools.wraps(init)
    def audited(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        found = _command_kind(args)
        if found is not None and os.environ.get(SWITCH) == "1":  # not the ledger's alone
            hit(*found)
        env = kwargs.get("env")
        if env is not None and all(isinstance(k, str) for k in env):  # its own: audited too
            kwargs["env"] = _audited_env(kwargs["env"])
        init(self, args, *rest, **kwargs)

    audited.__marker_audit__ = True  # type: ignore[attr-defined]
    subprocess.Popen.__init__ = audited  # type: ignore[method-assign]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches a module of ``patches`` as soon as it is imported (the audit is installed at
    start-up, before rcpipe or a test imports ray, moto or prefect)."""

    marker_audit = True

    def __init__(self, patches: dict[str, Callable[[Any], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.patches:
            return None
        for finder in sys.meta_path:
            if getattr(finder, "marker_audit", False) or not hasattr(finder, "find_spec"):
                continue  # the audit's own (twice in the pytest process: two modules)
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            self.patches[name](module)

        loader.exec_module = exec_and_patch
        return spec


def install() -> None:
    """Wrap the entry points: those already imported now, the others when imported; the
    audit's where RCPIPE_MARKER_AUDIT=1, the job ledger's where RCPIPE_JOB_LEDGER is set."""
    if any(getattr(f, "marker_audit", False) for f in sys.meta_path):
        return  # this file runs twice in the pytest process: as sitecustomize, as tests
    patches: dict[str, Callable[[Any], None]] = {}
    if os.environ.get(SWITCH) == "1":
        patches.update(PATCHES)
    if os.environ.get(job_ledger.LEDGER):
        audit_fit = patches.get(job_ledger.FIT)
        patches[job_ledger.FIT] = (job_ledger.patch_fit if audit_fit is None else
                                   # recorded inside the audit: a refused job is none
                                   lambda module: (job_ledger.patch_fit(module),
                                                   audit_fit(module)))
    if not patches:
        return
    _patch_popen()
    for name, patch in patches.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _AfterImport(patches))


def _chain() -> None:
    """Run the sitecustomize this file shadows, if any (Debian's: apport's hook)."""
    here = str(Path(__file__).resolve().parent)
    rest = [p for p in sys.path if p and str(Path(p).resolve()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception:  # noqa: BLE001 - as site.py does: a broken one is not ours
            pass


if __name__ == "sitecustomize":  # imported at start-up from PYTHONPATH: a subprocess
    _chain()
    install()
