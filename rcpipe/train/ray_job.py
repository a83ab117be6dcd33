"""`rcpipe train VARIANT` as one Ray Train job: a TorchTrainer over 1..N DDP workers.

Every worker runs ``train_worker``: it takes its shard of each global batch (the global
batch stays ``batch_size`` whatever the world size), averages gradients through DDP (NCCL
on GPUs, gloo on CPU) and steps in lock-step with the others. Rank 0 alone keeps the EMA,
evaluates on dev and writes each checkpoint (see checkpoint.py), which ``ray.train.report``
persists to RunConfig's storage: ``models/<variant>/checkpoints`` or ``s3://...``. Running
the same job again finds that storage and resumes from the latest checkpoint; FailureConfig
restarts a worker group that died the same way. The driver side (``fit``) shows the
workers' progress live and hands the result back to rcpipe.stages, which writes the files.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rcpipe.config import Config
from rcpipe.train.checkpoint import META, MODEL, STATE, model_payload

PROGRESS_EVERY = 10  # steps between progress messages from rank 0
RUN_NAME = "checkpoints"  # RunConfig.name: the run's folder under the storage path


@dataclass
class JobSpec:
    """What the driver hands every worker (plain data and Ray object refs)."""

    config: dict[str, Any]  # Config.model_dump(mode="json")
    variant: str
    train_path: str  # Parquet, a path every worker can read
    dev_path: str
    inputs: Any  # ObjectRef -> ModelInputs (the pretrained vectors travel once)
    dev_doc: Any  # ObjectRef -> the dev dataset dict, for the official scorer
    vocab_sha256: str
    threads: int
    progress: Any = None  # ray.util.queue.Queue for the driver's progress bar, or None


@dataclass
class _State:
    """Where a run is: everything a checkpoint restores besides the tensors' owners."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # global batches of this epoch already trained on
    elapsed: float = 0.0  # training seconds, all attempts (max_minutes spans resumes)
    seen: int = 0  # examples in this attempt, for examples/s
    started: float = 0.0  # perf_counter at this attempt's start
    before: float = 0.0  # training seconds of earlier attempts
    saved_step: int = -1
    best: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    resumed_from_step: int = 0


# ---------------------------------------------------------------- worker side


def train_worker(config: dict[str, JobSpec]) -> None:
    """The per-worker training function TorchTrainer runs on every rank."""
    import numpy as np
    import ray
    import ray.train
    import ray.train.torch

    from rcpipe.data.dataset import SquadDataset, bucket_batches
    from rcpipe.models import build_model
    from rcpipe.train.loop import EMA, make_optimizer, train_step

    spec = config["spec"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    cfg = Config.model_validate(spec.config)
    mcfg = cfg.models.of(spec.variant)
    torch.set_num_threads(spec.threads)
    device = ray.train.torch.get_device()
    inputs = ray.get(spec.inputs)

    torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
    raw = build_model(spec.variant, mcfg, inputs).to(device)
    optimizer, scheduler = make_optimizer(raw, mcfg.optim)
    ema = EMA(raw, mcfg.optim.ema_decay) if mcfg.optim.ema_decay and rank == 0 else None
    run = _State()
    torch.manual_seed(cfg.train.seed + 1000 * rank)  # its own dropout masks per rank

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            saved = torch.load(Path(d) / STATE, map_location=device, weights_only=True)
        raw.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        if ema is not None and saved["ema"] is not None:
            ema.load_state_dict(saved["ema"])
        rngs = saved["rng"]
        if len(rngs) == world:  # the same world size: each rank continues its own stream
            torch.set_rng_state(rngs[rank].cpu())
        run = _State(**{k: saved[k] for k in ("step", "epoch", "batch_in_epoch", "elapsed",
                                               "best", "history")})
        run.resumed_from_step, run.before = run.step, run.elapsed

    model = ray.train.torch.prepare_model(
        raw, parallel_strategy_kwargs={"find_unused_parameters": True})  # stochastic depth
    if cfg.train.compile:
        model = torch.compile(model)
    bf16 = device.type == "cuda" and cfg.train.bf16

    train_set = SquadDataset.from_parquet(Path(spec.train_path))
    dev_set = SquadDataset.from_parquet(Path(spec.dev_path), para_limit=cfg.train.dev_para_limit)
    batch_size = mcfg.batch_size or cfg.train.batch_size
    lengths = train_set.context_lengths()
    limit_s = cfg.models.minutes(spec.variant, cfg.train.max_minutes) * 60
    run.started = time.perf_counter()

    def stop_now() -> bool:
        over = bool(cfg.train.max_steps and run.step >= cfg.train.max_steps) or bool(
            limit_s and run.before + time.perf_counter() - run.started > limit_s)
        if world == 1:
            return over
        flag = torch.tensor([float(over)], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())  # every rank stops at the same step

    def save(losses: list[float]) -> None:
        if run.saved_step == run.step:
            return  # an eval_every checkpoint at an epoch's last step is that epoch's one
        run.saved_step = run.step
        run.elapsed = run.before + time.perf_counter() - run.started
        _report(spec, cfg, run, rank, world, raw, optimizer, scheduler, ema, inputs,
                dev_set, device, float(np.mean(losses)) if losses else float("nan"))

    stop = run.step > 0 and stop_now()
    while run.epoch < cfg.train.epochs and not stop:
        batches = [b for b in bucket_batches(lengths, batch_size, shuffle=True,
                                             seed=cfg.train.seed + run.epoch)
                   if len(b) >= world]  # every rank needs a share of every step
        losses: list[float] = []
        for indices in batches[run.batch_in_epoch:]:
            shard = indices[rank::world]
            batch = train_set.collate(shard).to(device)
            losses.append(train_step(model, batch, optimizer, scheduler,
                                     mcfg.optim.grad_clip, ema, raw=raw, bf16=bf16))
            run.step += 1
            run.batch_in_epoch += 1
            run.seen += len(indices)
            if rank == 0 and spec.progress is not None and run.step % PROGRESS_EVERY == 0:
                _progress(spec, {"step": run.step, "epoch": run.epoch,
                                 "loss": float(np.mean(losses[-PROGRESS_EVERY:])),
                                 "examples_per_s": _rate(run)})
            stop = stop_now()
            if stop:
                break
            if cfg.train.eval_every and run.step % cfg.train.eval_every == 0:
                save(losses[-cfg.train.eval_every:])
        if run.batch_in_epoch >= len(batches):
            run.epoch, run.batch_in_epoch = run.epoch + 1, 0
        save(losses)


def _rate(run: _State) -> float:
    seconds = time.perf_counter() - run.started
    return round(run.seen / seconds, 2) if seconds > 0 else 0.0


def _report(spec: JobSpec, cfg: Config, run: _State, rank: int, world: int, raw, optimizer,
            scheduler, ema, inputs, dev_set, device, loss: float) -> None:  # noqa: ANN001
    """Evaluate (rank 0), write a checkpoint (rank 0) and report it (every rank)."""
    import ray.train

    mine = (torch.get_rng_state(), weights_digest(raw))
    ranks = [mine]
    if world > 1:
        ranks = [None] * world
        torch.distributed.all_gather_object(ranks, mine)
    rngs, digests = [r for r, _ in ranks], [d for _, d in ranks]
    name = f"step-{run.step:08d}"
    if rank != 0:
        ray.train.report({"step": run.step}, checkpoint=None, checkpoint_dir_name=name)
        return
    from ray.train import Checkpoint

    result = _evaluate(spec, cfg, raw, ema, dev_set, device)
    em, f1 = result.get("exact_match", result.get("exact", 0.0)), result["f1"]
    run.history.append({"epoch": run.epoch, "step": run.step, "loss": loss, "em": em, "f1": f1})
    if run.best is None or f1 > run.best["f1"]:
        run.best = {"em": em, "f1": f1, "step": run.step, "epoch": run.epoch}
    weights = dict(raw.state_dict())
    if ema is not None:
        weights.update(ema.shadow)
    meta = {"step": run.step, "epoch": run.epoch, "dev_em": em, "dev_f1": f1,
            "best": run.best, "history": run.history, "world_size": world,
            "replica_digests": digests,  # DDP keeps every rank's weights identical
            "resumed_from_step": run.resumed_from_step, "elapsed": run.elapsed,
            "examples_per_s": _rate(run),
            "device": str(device)}
    with tempfile.TemporaryDirectory() as tmp:
        torch.save({"model": raw.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "ema": ema.state_dict() if ema is not None else None,
                    "rng": rngs, "step": run.step, "epoch": run.epoch,
                    "batch_in_epoch": run.batch_in_epoch, "elapsed": run.elapsed,
                    "best": run.best, "history": run.history}, Path(tmp) / STATE)
        torch.save(model_payload(spec.variant, cfg.models.of(spec.variant), inputs, weights,
                                 spec.vocab_sha256), Path(tmp) / MODEL)
        (Path(tmp) / META).write_text(json.dumps(meta, indent=1))
        ray.train.report({"step": run.step, "epoch": run.epoch, "dev_em": em, "dev_f1": f1},
                         checkpoint=Checkpoint.from_directory(tmp), checkpoint_dir_name=name)
    if spec.progress is not None:
        _progress(spec, {"eval": {"step": run.step, "epoch": run.epoch, "em": em, "f1": f1}})


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every weight's bytes: equal digests mean bitwise-equal weights."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _evaluate(spec: JobSpec, cfg: Config, raw, ema, dev_set, device) -> dict[str, Any]:  # noqa: ANN001
    import ray

    from rcpipe.data.dataset import bucket_batches
    from rcpipe.eval import metrics
    from rcpipe.train.loop import predict

    batches = bucket_batches(dev_set.context_lengths(), 64, shuffle=False)
    with ema.applied(raw) if ema is not None else nullcontext():
        nbest = predict(raw, dev_set, batches, device, cfg.eval.max_answer_len,
                        cfg.eval.na_threshold)
    return metrics.score(ray.get(spec.dev_doc), {q: v["text"] for q, v in nbest.items()})


def _progress(spec: JobSpec, message: dict[str, Any]) -> None:
    try:
        spec.progress.put_nowait(message)
    except Exception:  # noqa: BLE001 - a full or gone queue must never stop training
        pass


# ---------------------------------------------------------------- driver side


# A local Ray is one machine that no cloud preempts, running short jobs: no preemption
# watcher (one process less to start per job) and the controller polls its workers every
# 0.5 s instead of 2 s (a job's end is seen sooner). ~2.5 s less per job on 2 cores.
LOCAL_RAY_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
                 "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}


def start_local_ray(num_cpus: int | None = None) -> None:
    """ray.init of a local cluster; its processes inherit LOCAL_RAY_ENV (unless set)."""
    import ray

    for key, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(key, value)
    ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)


@contextmanager
def ray_cluster(address: str | None):  # noqa: ANN201
    """Join the Ray cluster at ``address``, reuse this process's, or start a local one."""
    import ray

    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS")  # a cluster's job environment
    if address:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    else:
        start_local_ray()
    try:
        yield
    finally:
        ray.shutdown()


def scaling(cfg: Config) -> tuple[Any, int]:
    """ScalingConfig for the cluster at hand, and the torch threads of each worker."""
    import ray
    from ray.train import ScalingConfig

    t = cfg.train
    gpus = ray.cluster_resources().get("GPU", 0)
    use_gpu = t.device == "cuda" or (t.device == "auto" and gpus > 0)
    cpus = t.cpus_per_worker or (
        1 if use_gpu else max(1, int(ray.cluster_resources().get("CPU", 1)) // t.num_workers))
    threads = t.threads or max(1, math.floor(cpus))
    return ScalingConfig(num_workers=t.num_workers, use_gpu=use_gpu,
                         resources_per_worker={"CPU": cpus}), threads


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

    An s3:// storage path goes through a pyarrow S3FileSystem built here from the standard
    AWS settings (AWS_ENDPOINT_URL for MinIO or any S3-compatible endpoint), so the workers
    need no AWS environment of their own.
    """
    if cfg.train.storage_path is None:
        return str(local_dir.resolve()), None
    base = cfg.train.storage_path.rstrip("/")
    if not base.startswith("s3://"):
        return f"{str(Path(base).resolve())}/{variant}", None
    import boto3
    from botocore.credentials import RefreshableCredentials
    from pyarrow import fs

    session = boto3.Session()
    options: dict[str, Any] = {"region": session.region_name or "us-east-1"}
    credentials = session.get_credentials()
    # Static keys travel to the workers with the filesystem; expiring ones (instance or
    # container roles) must not: every node then asks its own role through pyarrow.
    if credentials is not None and not isinstance(credentials, RefreshableCredentials):
        frozen = credentials.get_frozen_credentials()
        options |= {"access_key": frozen.access_key, "secret_key": frozen.secret_key,
                    "session_token": frozen.token}
    if endpoint := os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"):
        options |= {"endpoint_override": endpoint,
                    "scheme": "https" if endpoint.startswith("https") else "http"}
    return f"{base[len('s3://'):]}/{variant}", fs.S3FileSystem(**options)


def forget_run(storage_path: str, filesystem: Any) -> None:
    """Delete a run's checkpoints (``rcpipe train --force``), wherever they are stored."""
    from pyarrow import fs

    filesystem = filesystem or fs.LocalFileSystem()
    run = f"{storage_path}/{RUN_NAME}"
    if filesystem.get_file_info(run).type != fs.FileType.NotFound:
        filesystem.delete_dir(run)


def fit(spec: JobSpec, cfg: Config, storage_path: str, filesystem: Any,
        on_progress: Any) -> Any:
    """Run the TorchTrainer to the end; ``on_progress(message)`` sees rank 0's messages.

    Returns Ray Train's Result (its checkpoints live in the run's storage).
    """
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Empty, Queue

    scaling_config, spec.threads = scaling(cfg)
    spec.progress = Queue(maxsize=10_000)
    trainer = TorchTrainer(
        train_worker, train_loop_config={"spec": spec}, scaling_config=scaling_config,
        torch_config=TorchConfig(backend="nccl" if scaling_config.use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=RUN_NAME, storage_path=storage_path, storage_filesystem=filesystem,
            failure_config=ray.train.FailureConfig(max_failures=cfg.train.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=cfg.train.keep_checkpoints, checkpoint_score_attribute="dev_f1",
                checkpoint_score_order="max")))
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name="ray-train-fit", daemon=True)
    thread.start()
    while thread.is_alive() or spec.progress.qsize():
        try:
            on_progress(spec.progress.get(timeout=0.5))
        except Empty:
            continue
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
