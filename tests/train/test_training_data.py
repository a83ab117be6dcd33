"""What a run reads of the prepared data (train/training_data.py)."""

from __future__ import annotations

from rcpipe.config import load_config
from rcpipe.data.prepared import Prepared
from rcpipe.train.job import make_job
from rcpipe.train.training_data import TrainingData
from tests.conftest import Prepared as PreparedFixture


def test_a_run_reads_its_splits_the_heldout_questions_and_the_length_prior(
        prepared: PreparedFixture) -> None:
    prep = Prepared(prepared.out_dir)
    for prior in (True, False):
        cfg = load_config(prepared.cfg.source, [f"eval.length_prior={str(prior).lower()}"])
        data = TrainingData.load(make_job(cfg, "bidaf", prep.job_fields()), cfg)
        assert len(data.train.epoch(0)) and data.dev == prep.dev
        # the synthetic train set holds one article out: checkpoints are ranked on it
        assert data.heldout is not None and data.heldout.parquet == prep.heldout_parquet
        assert (data.length_prior is not None) is prior
        if prior:
            assert data.length_prior.shape == (cfg.eval.max_answer_len,)
