"""The Job every rank is given (train/job.py), built in one place from the prepared data."""

from __future__ import annotations

import pickle

from rcpipe.config import load_config
from rcpipe.data.prepared import Prepared
from rcpipe.train.job import make_job
from tests.conftest import Prepared as PreparedFixture


def test_a_job_carries_the_config_and_where_every_rank_reads_the_data(
        prepared: PreparedFixture) -> None:
    cfg = load_config(prepared.cfg.source, ["train.threads=3"])
    data = Prepared(prepared.out_dir.resolve()).job_fields()
    job = make_job(cfg, "qanet", data)
    assert job.variant == "qanet" and job.threads == 3
    assert job.config is cfg  # the config as loaded and validated, not a dump to validate
    assert pickle.loads(pickle.dumps(job)).config == cfg  # as Ray hands it to each rank
    assert (job.train_path, job.dev_path, job.vocab_sha256) == \
        (data["train_path"], data["dev_path"], data["vocab_sha256"])


def test_a_students_job_names_its_teachers_targets(make_config, synth_v1  # noqa: ANN001
        ) -> None:
    from rcpipe.train.job import make_job

    cfg = make_config(synth_v1)
    data = {"train_path": "t", "dev_path": "d", "vocab_sha256": "v"}
    assert make_job(cfg, "bidaf", data).teacher_path == ""
    assert make_job(cfg, "bidaf", data, "/x/teacher").teacher_path == "/x/teacher"
