"""How a training stage opens on Ray: what `rcpipe train` (stages/train.py) and `rcpipe
tune` (stages/tune.py) both do before their Ray starts training, in one place, beside the
Ray layer it opens.

In their order: the variant is known and the Ray at hand resumes runs (Train V2), checked
before anything is deleted, loaded or started (``check_trainable``); through a cluster's
Jobs API the stage is a Ray job on the head, read back from the disk the nodes share
(``through_jobs_api``, ``as_ray_job``); else the run's storage (``run_storage``), which
--force clears (``forget``); the stage's own finished check (a run's summary, a search's
trials); the prepared data's model inputs (``model_inputs``), every model the stage will
build built once here (``check_build``), the dev set (``dev_document``) and what every
rank's Job reads (``job_data``); then the Ray it trains on (``on_ray``). Training code and
Ray are imported inside the functions: importing the stages loads neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rcpipe.config import Config
from rcpipe.data.prepared import Prepared
from rcpipe.data.squad import load_document
from rcpipe.errors import InputError

if TYPE_CHECKING:  # heavy (torch): imported where they are used
    from rcpipe.config import ModelConfig
    from rcpipe.models import ModelInputs

T = TypeVar("T")


def check_trainable(cfg: Config, variant: str) -> None:
    """``variant`` is one of the params' (the user's mistake, found before Ray starts) and
    this Ray resumes a run (Train V2: cluster/ray_runtime.py)."""
    from rcpipe.cluster.ray_runtime import check_train_v2

    cfg.models.of(variant)
    check_train_v2()


def through_jobs_api(cfg: Config) -> bool:
    """Whether train.ray_address (or Ray's own variables) names a cluster's Jobs API: the
    stage is then a Ray job on the head (cluster/jobs_api.py)."""
    from rcpipe.cluster.jobs_api import jobs_api_address

    return jobs_api_address(cfg) is not None


def as_ray_job(cfg: Config, variant: str, force: bool, run: str | None, detach: bool,
               command: str, outcome: Callable[[], T | None], where: Path, what: str) -> T:
    """`rcpipe <command> <variant>` as the Ray job of ``run`` (its lines go to
    rcpipe.cluster.jobs_api's log; ``detach``: an interrupted submitter leaves it running),
    then its ``outcome()`` from the files it wrote here; None there (``where``, which should
    hold ``what``) means this directory is not the one the cluster's nodes share."""
    from rcpipe.cluster.jobs_api import submit_train

    submit_train(cfg, variant, force, run=run, detach=detach, command=command)
    found = outcome()
    if found is None:
        raise InputError(where, "", f"the Ray job finished but this directory has no {what}: "
                         "it must be on the file system the cluster's nodes share")
    return found


def run_storage(cfg: Config, name: str, local_dir: Path) -> tuple[str, Any]:
    """(storage path, pyarrow filesystem or None) of the run ``name``: under
    train.storage_path (s3:// or a directory) when set, else ``local_dir``."""
    from rcpipe.cluster.train_job import storage

    return storage(cfg, name, local_dir)


def forget(storage: tuple[str, Any], name: str | None = None) -> None:
    """Delete the checkpoints of run ``name`` in ``storage`` (--force, a stale run), or all
    of ``storage`` (name None: a search's run and its trials), wherever it is stored."""
    from rcpipe.cluster.train_job import forget_run

    forget_run(*storage, name)


def model_inputs(cfg: Config) -> ModelInputs:
    """The data-side facts every model of cfg's prepared data is built with."""
    from rcpipe.trained.model_file import prepared_inputs

    prepared = Prepared(cfg.data.out_dir)
    if not prepared.train.is_dir():
        raise InputError(prepared.out_dir, "", "no prepared data; run `rcpipe prepare` first")
    # every part's footer against the manifest: an older layout, a cut part or one of
    # another vocabulary is one line here, before any worker starts (data/shards.py)
    prepared.shards("train").check()
    return prepared_inputs(prepared.out_dir, cfg.data.word_dim)


def check_build(cfg: Config, variant: str, inputs: ModelInputs, at: str,
                config: Callable[[], ModelConfig], said: str = "") -> None:
    """Build ``variant`` at ``config()`` here, without its vectors, so a size that cannot
    build fails now in one line at the params key ``at`` (``said`` before the reason), not
    on every Ray worker or in a trial."""
    from rcpipe.models import build_model

    try:
        build_model(variant, config(), replace(inputs, vectors=None))
    except ValueError as e:
        raise InputError(cfg.source, at, f"{said}{e}") from None


def dev_document(cfg: Config) -> dict[str, Any]:
    """The dev set's SQuAD JSON (data.dev_file), validated: rank 0 scores dev on it."""
    return load_document(cfg.data.dev_file, cfg.data.cache_dir, cfg.limits)


def job_data(cfg: Config) -> dict[str, str]:
    """What every rank's Job reads of the prepared data (train/job.py's make_job takes it):
    absolute paths, as a Ray worker works in a directory of its own."""
    return Prepared(cfg.data.out_dir.resolve()).job_fields()


@contextmanager
def on_ray(cfg: Config) -> Iterator[None]:
    """The Ray the stage trains on: train.ray_address's cluster, this process's Ray, or a
    local one started for the stage (cluster/ray_runtime.py)."""
    from rcpipe.cluster.ray_runtime import ray_cluster

    with ray_cluster(cfg.train.ray_address):
        yield
