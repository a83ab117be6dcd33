"""`rcpipe train VARIANT` as one Ray Train job: a TorchTrainer over 1..N DDP workers.

Every Ray Train worker runs ``train_worker``: a ``Worker`` (worker.py, the same run a plain
process makes without Ray) in a ``RaySession``, which gives it its rank, device and DDP
wrapper, and persists each checkpoint through ``ray.train.report`` into RunConfig's
storage: ``models/<variant>/runs/<run>`` or ``s3://.../<variant>/<run>``, the run named
after what it is trained from (train/runs.py). Running the same job again finds that
storage and resumes from the latest checkpoint; FailureConfig restarts a worker group
that died the same way. The driver side (``fit``) hands rank 0's progress messages, as
they come, to a callback on the calling thread (train_run.py: the bar, and
train/progress.py's log lines and live dev curve; so in a Prefect task they land in that
task run) and the result back to train_run.py, which picks its checkpoints.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from torch import nn

from rcpipe.cluster import job_runs
from rcpipe.cluster.ray_runtime import joined
from rcpipe.config import Config
from rcpipe.errors import InputError
from rcpipe.models import ModelInputs
from rcpipe.train.checkpoint import RANK_METRIC, step_dir, step_of
from rcpipe.train.job import Job
from rcpipe.train.worker import Worker

log = logging.getLogger(__name__)

RUN_NAME = "checkpoints"  # RunConfig.name of a search's trials (train runs: train/runs.py)


# ---------------------------------------------------------------- worker side


class RaySession:
    """A Worker's view of Ray Train: rank, device, checkpoints, the driver's progress queue.

    ``inputs`` and ``dev_doc`` are object refs: the pretrained vectors and the dev set
    travel to each node once, not once per worker.
    """

    def __init__(self, inputs: Any, dev_doc: Any, progress: Any,
                 storage: tuple[str, Any] | None = None) -> None:
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.device: torch.device = ray.train.torch.get_device()
        self._inputs, self._dev_doc, self._queue = inputs, dev_doc, progress
        self._storage = storage  # the run's folder and pyarrow file system, for stored()
        self._taken: set[str] = set()  # its checkpoints' folders at resume: report()
        self._dev: dict[str, Any] | None = None
        self._raylet = os.getppid()  # the node's raylet started this worker process

    def check_node(self) -> None:
        """Raise once this worker's raylet has gone (its node shut down or lost: a cancelled
        flow's local Ray, whose whole process group Prefect's SIGTERM reaches). Orphaned,
        a worker trained on for seconds, until Ray's own check ended it, and stored
        checkpoints that no controller recorded (a cancelled night's runs reached their
        last step)."""
        if os.getppid() != self._raylet:
            raise RuntimeError(f"rank {self.rank}: this worker's Ray node is gone (its raylet "
                               "ended): it trains and stores nothing more")

    def inputs(self) -> ModelInputs:
        import ray

        return ray.get(self._inputs)

    def dev_doc(self) -> dict[str, Any]:
        import ray

        if self._dev is None:
            self._dev = ray.get(self._dev_doc)
        return self._dev

    @contextmanager
    def stored(self) -> Iterator[Iterator[Path]]:
        """The checkpoint Ray Train recorded last, then (if that one is broken) the older
        ones in the run's storage, newest first, each fetched only when asked for. With none
        recorded, the run's stored ones: a run stopped at its first checkpoint (Ctrl-C) had
        stored it before its controller recorded it, and used to train from the start."""
        import ray.train

        # the run's stored ones, newest first (none where the run's storage is not known: a
        # search's trials), listed once: every rank lists them before its first step, and
        # none stores one before all have (their names: report's)
        stored = stored_checkpoints(*self._storage) if self._storage is not None else []
        self._taken = {PurePosixPath(c.path).name for c in stored}
        with ExitStack() as fetched:
            def dirs() -> Iterator[Path]:
                recorded = ray.train.get_checkpoint()
                below = None
                if recorded is not None:
                    yield Path(fetched.enter_context(recorded.as_directory()))
                    below = PurePosixPath(recorded.path).name
                for checkpoint in stored:  # those below the recorded one
                    if below is None or PurePosixPath(checkpoint.path).name < below:
                        yield Path(fetched.enter_context(checkpoint.as_directory()))

            yield dirs()

    def prepare_model(self, model: nn.Module) -> nn.Module:
        import ray.train.torch

        # every parameter takes part in every step (stochastic depth multiplies by its coin
        # instead of skipping a sublayer), so DDP need not search the graph for unused ones
        return ray.train.torch.prepare_model(
            model, parallel_strategy_kwargs={"find_unused_parameters": False})

    def report(self, metrics: dict[str, Any], directory: Path | None, name: str) -> str:
        """Store the checkpoint in ``directory`` (rank 0's; the others report None) and
        report ``metrics``; the folder's name: ``name``, or where the run already had a
        checkpoint of that step at resume (a broken one passed by: Ray Train's record of it
        would delete this one's folder when evicted), the next free step-...-r<k>."""
        import ray.train
        from ray.train import Checkpoint

        self.check_node()  # before the checkpoint is stored
        step = step_of(name)
        name = step_dir(step, self._taken) if step is not None else name
        checkpoint = Checkpoint.from_directory(directory) if directory is not None else None
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name)
        return name

    def progress(self, message: dict[str, Any]) -> None:
        self.check_node()  # every few steps, rank 0 (the others at each checkpoint)
        if self._queue is None:
            return
        try:
            self._queue.put_nowait(message)
        except Exception:  # noqa: BLE001 - a full or gone queue must never stop training
            pass


def train_worker(config: dict[str, Any]) -> None:
    """The per-worker training function TorchTrainer runs on every rank."""
    session = RaySession(config["inputs"], config["dev_doc"], config["progress"],
                         config.get("storage"))
    Worker(config["job"], session).train()


# ---------------------------------------------------------------- driver side


def check_fits(cfg: Config) -> None:
    """Refuse at once a job that this machine's Ray can never place: Ray Train would wait
    for the resources forever, at 0 steps. A joined cluster may autoscale to fit the job,
    so only a local Ray (what this machine has) is held to it."""
    import ray

    if joined() is not None:
        return
    t = cfg.train
    have = ray.cluster_resources()
    cpus, gpus = int(have.get("CPU", 0)), int(have.get("GPU", 0))
    machine = f"this machine's Ray has {cpus} CPU(s) and {gpus} GPU(s)"
    if t.device == "cuda" and gpus == 0:
        raise InputError(cfg.source, "train.device", f"cuda asked for, but {machine}: "
                         "set train.device=auto or cpu")
    scaling_config, _ = scaling(cfg)
    if scaling_config.use_gpu and t.num_workers > gpus:
        raise InputError(cfg.source, "train.num_workers", f"{t.num_workers} workers need "
                         f"{t.num_workers} GPUs (one each), but {machine}: set "
                         f"train.num_workers to at most {gpus}")
    per_worker = scaling_config.resources_per_worker["CPU"]
    if t.num_workers * per_worker > cpus:
        raise InputError(cfg.source, "train.num_workers", f"{t.num_workers} workers x "
                         f"{per_worker:g} CPU(s) need {t.num_workers * per_worker:g} CPUs, "
                         f"but {machine}: set train.num_workers to at most "
                         f"{max(1, int(cpus // per_worker))} (or lower train.cpus_per_worker)")


def scaling(cfg: Config, gpus_per_worker: float = 0.0) -> tuple[Any, int]:
    """ScalingConfig for the cluster at hand, and the torch threads of each worker.

    ``gpus_per_worker`` > 0 gives each worker that share of a GPU (a search's trials share
    GPUs, search.py); else a worker on GPUs takes a whole one."""
    import ray
    from ray.train import ScalingConfig

    t = cfg.train
    gpus = ray.cluster_resources().get("GPU", 0)
    use_gpu = gpus_per_worker > 0 or t.device == "cuda" or (t.device == "auto" and gpus > 0)
    cpus = t.cpus_per_worker or (
        1 if use_gpu else max(1, int(ray.cluster_resources().get("CPU", 1)) // t.num_workers))
    threads = t.threads or max(1, math.floor(cpus))
    resources = {"CPU": cpus} | ({"GPU": gpus_per_worker} if gpus_per_worker else {})
    return ScalingConfig(num_workers=t.num_workers, use_gpu=use_gpu,
                         resources_per_worker=resources), threads


def jobs_that_fit(cfg: Config) -> int:
    """How many training jobs of this shape the cluster runs at once (at least one)."""
    import ray

    scaling_config, _ = scaling(cfg)
    resources = ray.cluster_resources()
    if scaling_config.use_gpu:
        return max(1, int(resources.get("GPU", 0)) // cfg.train.num_workers)
    per_job = scaling_config.resources_per_worker["CPU"] * cfg.train.num_workers
    return max(1, int(resources.get("CPU", 1) // per_job))


def storage(cfg: Config, variant: str, local_dir: Path) -> tuple[str, Any]:
    """(storage_path, pyarrow filesystem or None): where this variant's run lives.

    An s3:// storage path goes through a pyarrow S3FileSystem that holds the region and the
    endpoint (AWS_ENDPOINT_URL for MinIO or any S3-compatible store) and no credential: it
    travels pickled to every worker, and each worker's AWS SDK finds credentials in its own
    environment (an EC2 instance profile, IRSA or EKS Pod Identity, AWS_* variables,
    ~/.aws), which refreshes them for as long as a run lasts. No key leaves a node.
    """
    if cfg.train.storage_path is None:
        return str(local_dir.resolve()), None
    base = cfg.train.storage_path.rstrip("/")
    if not base.startswith("s3://"):
        return f"{str(Path(base).resolve())}/{variant}", None
    import boto3
    from pyarrow import fs

    options: dict[str, Any] = {"region": boto3.Session().region_name or "us-east-1"}
    if endpoint := os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"):
        options |= {"endpoint_override": endpoint,
                    "scheme": "https" if endpoint.startswith("https") else "http"}
    return f"{base[len('s3://'):]}/{variant}", fs.S3FileSystem(**options)


def storage_failure(error: BaseException) -> str | None:
    """The store's own words when ``error`` is the checkpoint store failing (S3 unreachable
    or refusing a write, as pyarrow's AWS SDK reports it), else None."""
    seen: BaseException | None = error
    while seen is not None:
        for line in str(seen).splitlines():
            if "AWS Error" in line:
                return line.strip()
        seen = seen.__cause__ or seen.__context__
    return None


def user_error(error: BaseException) -> InputError | None:
    """The InputError (or RunError) a Ray Train worker raised, when ``error`` is Ray's
    report of that worker's failure: found in the failures Ray keeps per worker and in the
    causes, so the driver says the user's one located line instead of Ray's traceback."""
    seen: list[BaseException] = [error]
    while seen:
        e = seen.pop()
        if isinstance(e, InputError):
            return e
        failures = getattr(e, "worker_failures", None)  # Train V2's WorkerGroupError
        if isinstance(failures, dict):
            seen += [f for f in failures.values() if isinstance(f, BaseException)]
        seen += [c for c in (e.__cause__, e.__context__, getattr(e, "cause", None))
                 if isinstance(c, BaseException)]
    return None


def forget_run(storage_path: str, filesystem: Any, name: str | None = RUN_NAME) -> None:
    """Delete a run's checkpoints (``rcpipe train --force``, an old run pruned), or with
    ``name`` None everything under ``storage_path`` (``rcpipe tune --force``: the search
    and its trials), wherever they are stored."""
    from pyarrow import fs

    filesystem = filesystem or fs.LocalFileSystem()
    run = storage_path if name is None else f"{storage_path}/{name}"
    if filesystem.get_file_info(run).type != fs.FileType.NotFound:
        filesystem.delete_dir(run)


def stored_checkpoints(run: str, filesystem: Any, below: str | None = None) -> list[Any]:
    """A run's stored checkpoints (step-<8 digits>/ under ``run``, its storage), newest
    first, those older than ``below`` (a step-... name) where given: what its controller
    recorded or not (a worker stores a checkpoint before its controller records it)."""
    from pyarrow import fs
    from ray.train import Checkpoint

    filesystem = filesystem or fs.LocalFileSystem()
    if filesystem.get_file_info(run).type == fs.FileType.NotFound:
        return []
    names = sorted((f.base_name for f in filesystem.get_file_info(fs.FileSelector(run))
                    if f.type == fs.FileType.Directory and step_of(f.base_name) is not None),
                   reverse=True)
    return [Checkpoint(f"{run}/{n}", filesystem) for n in names if below is None or n < below]


def latest_step(storage_path: str, filesystem: Any, name: str) -> int:
    """The step of a run's newest stored checkpoint (step-<8 digits>/), 0 when none."""
    newest = stored_checkpoints(f"{storage_path}/{name}", filesystem)[:1]
    return step_of(PurePosixPath(newest[0].path).name) or 0 if newest else 0


def make_trainer(job: Job, cfg: Config, refs: dict[str, Any], storage_path: str,
                 filesystem: Any, name: str = RUN_NAME, callbacks: tuple[Any, ...] = (),
                 gpus_per_worker: float = 0.0) -> Any:
    """The TorchTrainer of one run: ``train_worker`` on each rank with ``refs`` (the
    ``inputs`` and ``dev_doc`` object refs, the ``progress`` queue or None), checkpoints
    kept by RANK_METRIC in RunConfig(storage_path, name): started again, it resumes there."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    scaling_config, job.threads = scaling(cfg, gpus_per_worker)
    return TorchTrainer(
        train_worker, train_loop_config={"job": job} | refs,
        scaling_config=scaling_config,
        torch_config=TorchConfig(backend="nccl" if scaling_config.use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=name, storage_path=storage_path, storage_filesystem=filesystem,
            callbacks=list(callbacks),
            failure_config=ray.train.FailureConfig(max_failures=cfg.train.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=cfg.train.keep_checkpoints, checkpoint_score_attribute=RANK_METRIC,
                checkpoint_score_order="max")))


def fit(job: Job, inputs: ModelInputs, dev_doc: dict[str, Any], cfg: Config,
        storage_path: str, filesystem: Any, name: str, on_progress: Any) -> Any:
    """Run the TorchTrainer of run ``name`` to the end (resuming it where its storage holds
    checkpoints); ``on_progress(message)`` sees rank 0's messages.

    Returns Ray Train's Result (its checkpoints live in the run's storage). Raises
    RuntimeError within 0.5 s once this process is cancelled (job_runs.stop_followed).
    """
    import ray
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rcpipe.cluster import run_abort

    with job_runs.fitting():
        # the progress queue lives on the driver's node: on another it would die with that
        # node and take the driver down with it, while Ray Train restarts the workers elsewhere
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                              soft=False)
        progress = Queue(maxsize=10_000,
                         actor_options={"num_cpus": 0, "scheduling_strategy": here})
        trainer = make_trainer(job, cfg, {"inputs": ray.put(inputs),
                                          "dev_doc": ray.put(dev_doc), "progress": progress,
                                          "storage": (f"{storage_path}/{name}", filesystem)},
                               storage_path, filesystem, name,
                               callbacks=(run_abort.AnnounceController(progress),))
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = trainer.fit()
            except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
                outcome["error"] = e

        thread = threading.Thread(target=run, name="ray-train-fit", daemon=True)
        thread.start()
        controller = _follow(thread, progress, on_progress)
        if job_runs.cancelled():  # before the canceller shuts this process's Ray down
            if controller is not None:
                run_abort.abort(controller, name)
            raise RuntimeError(f"this process was cancelled: Ray Train run {name} stopped; "
                               "its checkpoints so far stay, to be resumed")
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _follow(thread: threading.Thread, progress: Any, on_progress: Any) -> Any:
    """Hand rank 0's messages to ``on_progress`` until the fit ``thread`` has ended and the
    ``progress`` queue is empty, or until this process is cancelled; the run's Train V2
    controller (run_abort.AnnounceController's message), None when it has not started."""
    from ray.util.queue import Empty

    from rcpipe.cluster import run_abort

    controller = None
    while not job_runs.cancelled() and (thread.is_alive() or progress.qsize()):
        try:
            message = progress.get(timeout=0.5)
        except Empty:
            continue
        if run_abort.CONTROLLER in message:
            controller = message[run_abort.CONTROLLER]
        else:
            on_progress(message)
    return controller
