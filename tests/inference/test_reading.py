"""inference/reading.py: the answers given, and SQuAD v2.0's no-answer threshold chosen by the
official best-threshold walk over the best non-empty spans."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rcpipe.data.dataset import SquadDataset, bucket_batches
from rcpipe.inference.reading import evaluate_model, heldout_then_dev, predict
from rcpipe.scoring.metrics import ORACLE, score
from rcpipe.train.audit import HostSyncs
from tests.conftest import Prepared, SynthData
from tests.inference.readers import ShyReader, UnsureReader


@pytest.fixture(scope="module")
def v2_folder(tmp_path_factory: pytest.TempPathFactory, synth_v2: SynthData) -> Path:
    """The v2.0 training split prepared in row groups of 8 rows (labelled, so ShyReader
    can find the gold spans)."""
    from rcpipe import stages
    from rcpipe.config import load_config
    from tests.conftest import write_params

    root = tmp_path_factory.mktemp("v2_predict")
    cfg = load_config(write_params(root / "params.yaml", data={
        "train_file": str(synth_v2.train), "dev_file": str(synth_v2.train),
        "out_dir": str(root / "out"), "cache_dir": str(root / "cache"),
        "shards": {"group_rows": 8},
        "heldout": {"fraction": 0}}))  # every training question in train/
    stages.prepare(cfg)
    return root / "out" / "train"


@pytest.fixture(scope="module")
def v2_train(v2_folder: Path, synth_v2: SynthData) -> tuple[SquadDataset, dict]:
    return SquadDataset.from_parquet(v2_folder), synth_v2.train_doc


def test_a_split_answered_a_chunk_at_a_time_is_answered_as_a_whole(
        v2_folder: Path, synth_v2: SynthData, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large dev or held-out set is never held whole (Split.chunks): the answers, the
    v2.0 threshold walk over them and the scores are the whole split's."""
    from rcpipe.inference import reading

    whole = evaluate_model(ShyReader(), SquadDataset.from_parquet(v2_folder),
                           synth_v2.train_doc, torch.device("cpu"))
    monkeypatch.setattr(reading, "EVAL_CHUNK", 10)
    split = reading.split_of(v2_folder, synth_v2.train_doc)
    sizes = [len(d) for d in split.chunks()]
    assert len(sizes) == 3 and sizes[:2] == [16, 16]  # whole row groups of 8 rows
    chunked = evaluate_model(ShyReader(), split.chunks(), split.doc, torch.device("cpu"))
    assert chunked.nbest == whole.nbest and chunked.result == whole.result


def test_the_walk_answers_what_the_raw_rule_abstained_on(v2_train) -> None:  # noqa: ANN001
    dataset, doc = v2_train
    batches = bucket_batches(dataset.context_lengths(), 64, shuffle=False)
    raw = predict(ShyReader(), dataset, batches, torch.device("cpu"))  # na_prob > span prob
    assert not any(v["text"] for v in raw.values())
    walked = evaluate_model(ShyReader(), dataset, doc, torch.device("cpu"))
    abstain_all = 100.0 * sum(not qa["answers"] for a in doc["data"] for p in a["paragraphs"]
                              for qa in p["qas"]) / len(dataset)
    assert walked.result["HasAns_f1"] == pytest.approx(100.0)
    assert walked.result["NoAns_f1"] == pytest.approx(100.0)
    assert walked.result["f1"] == pytest.approx(100.0) and abstain_all < 50
    assert walked.na_threshold == walked.result["best_f1_thresh"]
    assert walked.span_f1 == pytest.approx(100.0)  # its spans, whatever the threshold
    # the answers given are the official ones at that threshold
    assert score(doc, walked.predictions)["f1"] == pytest.approx(walked.result["f1"])
    for entry in walked.nbest.values():
        assert entry["span_text"] and entry["prob"] > 0  # kept even where it abstains


def test_v1_evaluation_gives_every_span(prepared: Prepared) -> None:
    dataset = SquadDataset.from_parquet(prepared.out_dir / "dev")
    v1 = evaluate_model(ShyReader(no_answer=False), dataset, prepared.data.dev_doc,
                        torch.device("cpu"))
    assert v1.na_threshold is None and v1.span_f1 is None and all(v1.predictions.values())
    assert set(v1.result) == {"exact_match", "f1"}


def test_the_threshold_is_chosen_on_heldout_and_dev_reports_at_it(v2_splits) -> None:  # noqa: ANN001
    dev, heldout = v2_splits
    cpu = torch.device("cpu")
    own = evaluate_model(UnsureReader(), heldout.dataset, heldout.doc, cpu).na_threshold
    oracle = evaluate_model(UnsureReader(), dev.dataset, dev.doc, cpu)
    assert own != oracle.na_threshold  # the case: dev's own best threshold is another

    ev, held = heldout_then_dev(UnsureReader(), dev, heldout, "heldout", cpu)
    assert held is not None and held.na_threshold == ev.na_threshold == own
    r = ev.result
    assert r["na_threshold"] == own and r["na_threshold_source"] == "heldout"
    spans = {q: v["span_text"] for q, v in ev.nbest.items()}
    at_own = score(dev.doc, spans, ev.na_probs, own)
    for key in ("exact", "f1", "HasAns_f1", "NoAns_f1", "total"):
        assert r[key] == at_own[key], key  # the headline: dev at the held-out threshold
    assert score(dev.doc, ev.predictions)["f1"] == pytest.approx(r["f1"])  # answers given
    assert r["oracle"] == {k: oracle.result[k] for k in ORACLE}
    assert r["f1"] < r["oracle"]["best_f1"] and "best_f1" not in r


def test_a_fixed_threshold_is_the_params_and_needs_no_heldout(v2_splits) -> None:  # noqa: ANN001
    dev, heldout = v2_splits
    cpu = torch.device("cpu")
    ev, held = heldout_then_dev(UnsureReader(), dev, heldout, "heldout", cpu,
                                na_threshold=0.5)
    assert held.na_threshold == ev.na_threshold == 0.5  # held-out scored at it, not walked
    assert ev.result["na_threshold_source"] == "params"
    ev, held = heldout_then_dev(UnsureReader(), dev, heldout, "file:mine.json", cpu)
    assert ev.result["na_threshold_source"] == "file:mine.json"
    ev, held = heldout_then_dev(UnsureReader(), dev, None, None, cpu)  # the oracle, named
    assert held is None and ev.result["na_threshold_source"] == "dev"
    assert ev.result["f1"] == ev.result["oracle"]["best_f1"]


@pytest.mark.parametrize("token_probs", [False, True])
def test_a_batch_of_answers_comes_to_the_host_at_once(prepared: Prepared,
                                                      token_probs: bool) -> None:
    """No value read back element by element (on a GPU each int() or float() of a device
    tensor waits for it: 5 a question before); every answer still the reader's."""
    dataset = SquadDataset.from_parquet(prepared.out_dir / "dev")
    batches = bucket_batches(dataset.context_lengths(), 16, shuffle=False)
    syncs = HostSyncs()
    with syncs:
        out = predict(ShyReader(no_answer=False), dataset, batches, torch.device("cpu"),
                      token_probs=token_probs)
    assert dict(syncs.ops) == {}
    assert len(out) == len(dataset) > 16  # more than one batch
    for row, qid in enumerate(dataset.ids):  # ShyReader finds the gold span
        gold = dataset.answer_text(row, int(dataset.y1[row]), int(dataset.y2[row]))
        assert out[qid]["span_text"] == gold and 0 < out[qid]["prob"] < 1
        if token_probs:
            assert len(out[qid]["p_start"]) == len(out[qid]["p_end"]) == \
                dataset.context_lengths()[row]
