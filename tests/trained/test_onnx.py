"""The exported graph is the model's forward: onnxruntime's span probabilities equal the
eager model's to 1e-4 at batch sizes, lengths and numbers of distinct words other than the
ones it was traced on (the session's trained bidaf, its LSTMs written as ONNX LSTM ops;
qanet; a GRU); it embeds each distinct word once, as eager inference does, and a graph from
before the distinct words still runs; R-Net's Python recurrence is refused, not exported for
one passage length."""

from __future__ import annotations

import dataclasses

import onnx
import pytest
import torch
from torch import nn

from rcpipe.data.dataset import SquadDataset
from rcpipe.models import build_model
from rcpipe.models.batch import Batch
from rcpipe.models.layers import SpanLogits
from rcpipe.models.rnn import RNNWeights
from rcpipe.trained.model_file import load_model, prepared_inputs
from rcpipe.trained.onnx import FixedAxis, OnnxForward, compare, export_graph
from tests.conftest import TINY_MODEL, Prepared, Trained


def _dev(trained: Trained) -> SquadDataset:
    return SquadDataset.from_parquet(trained.cfg.data.out_dir / "dev")


@pytest.mark.integration
@pytest.mark.trains
@pytest.mark.parametrize("variant", ["bidaf", "qanet"])
def test_the_graph_answers_as_the_eager_model_at_other_shapes(
        trained: Trained, variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(trained.root)
    model, _ = load_model(trained.cfg, variant)
    model.eval()
    dev = _dev(trained)
    example = dev.collate([0, 1, 2])  # traced at B = 3
    data = export_graph(model, example)
    inputs = onnx.load_model_from_string(data).graph.input
    assert [i.name for i in inputs] == ["cw", "cc", "qw", "qc", "words", "word_ids", "cu", "qu"]
    assert all(d.dim_param for i in inputs for d in i.type.tensor_type.shape.dim)
    graph = OnnxForward(data)
    order = sorted(range(len(dev)), key=lambda i: -int(dev.context_lengths()[i]))
    batches = [order[:5], order[-1:], order[5:12]]  # B = 5, 1, 7, the longest context first
    result = compare(model, graph, dev, batches)
    shapes = {tuple(s) for s in result["shapes"]}
    assert len(shapes) == 3 and tuple(example.cc.shape) not in shapes
    assert {s[0] for s in shapes} == {5, 1, 7}
    assert result["max_abs_diff"] <= 1e-4, result


@pytest.mark.integration
@pytest.mark.trains
def test_a_model_of_several_runs_exports_as_one_graph(
        trained: Trained, monkeypatch: pytest.MonkeyPatch) -> None:
    """models.<v>.seeds: the runs' mean (models/seed_mean.py) is one graph answering as the
    eager mean does."""
    from rcpipe.models.seed_mean import SeedMean

    monkeypatch.chdir(trained.root)
    model, inputs = load_model(trained.cfg, "bidaf")
    torch.manual_seed(1)
    other = build_model("bidaf", trained.cfg.models.bidaf, inputs)
    both = SeedMean([model, other]).eval()
    dev = _dev(trained)
    graph = OnnxForward(export_graph(both, dev.collate([0, 1, 2])))
    result = compare(both, graph, dev, [[3, 4, 5, 6], [7]])
    assert result["max_abs_diff"] <= 1e-4, result


class _Recurrence(nn.Module):
    """A forward around one GRU direction, to check the ONNX GRU's gate order alone."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(30, 6)
        self.rnn = RNNWeights("gru", 6, 5)
        self.out = nn.Linear(5, 1)

    def forward(self, batch: Batch) -> SpanLogits:
        h = self.rnn(self.emb(batch.cw))  # (B, Lc, H)
        logits = self.out(h).squeeze(-1)  # (B, Lc)
        return SpanLogits(logits, -logits)


def _ids(b: int, lc: int, lq: int, w: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    cw, qw = torch.randint(1, 30, (b, lc), generator=g), torch.randint(1, 30, (b, lq), generator=g)
    cc, qc = torch.randint(1, 9, (b, lc, w), generator=g), torch.randint(1, 9, (b, lq, w),
                                                                         generator=g)
    none = torch.zeros(b, dtype=torch.long)
    return Batch([], cw, cc, qw, qc, cw != 0, qw != 0, none, none, none.bool())


def test_a_gru_becomes_onnxs_gru_with_pytorchs_gates() -> None:
    model = _Recurrence().eval()
    graph = OnnxForward(export_graph(model, _ids(3, 11, 4, 5, 0)))
    for b, lc in ((1, 40), (6, 2)):
        batch = _ids(b, lc, 3, 2, b)
        with torch.no_grad():
            want = model(batch)
        got = graph(batch)
        assert got.start.shape == (b, lc)
        assert torch.allclose(got.start, want.start, atol=1e-5)


def test_rnets_python_recurrence_is_refused(prepared: Prepared) -> None:
    from rcpipe.models import ModelInputs

    model = build_model("rnet", prepared.cfg.models.rnet.model_copy(update=TINY_MODEL),
                        ModelInputs(40, 20, 16, None, False))
    with pytest.raises(FixedAxis, match=r"question_matching\.fwd steps through the passage"):
        export_graph(model.eval(), _ids(3, 11, 4, 5, 0))


def test_the_graph_embeds_distinct_words_and_a_four_input_graph_still_runs(
        prepared: Prepared) -> None:
    cfg = prepared.cfg
    torch.manual_seed(0)
    model = build_model("bidaf", cfg.models.bidaf.model_copy(update=TINY_MODEL),
                        prepared_inputs(prepared.out_dir, cfg.data.word_dim)).eval()
    dev = SquadDataset.from_parquet(prepared.out_dir / "dev")
    example = dev.collate([0, 1, 2])
    per_word = export_graph(model, example)
    # as exported before the distinct words: the token inputs alone
    per_token = export_graph(model, dataclasses.replace(
        example, words=None, word_ids=None, cu=None, qu=None))
    names = [i.name for i in onnx.load_model_from_string(per_token).graph.input]
    assert names == ["cw", "cc", "qw", "qc"]
    for data in (per_word, per_token):  # served a collate batch, distinct words and all
        assert compare(model, OnnxForward(data), dev, [[3, 4, 5, 6, 7], [8]])[
            "max_abs_diff"] <= 1e-4
    # the graph reads the distinct words' chars, not each token's
    batch = dev.collate([3, 4, 5])
    graph = OnnxForward(per_word)
    blanked = dataclasses.replace(batch, words=torch.zeros_like(batch.words))
    assert not torch.equal(graph(batch).start, graph(blanked).start)
    assert torch.equal(graph(batch).start, graph(dataclasses.replace(
        batch, cc=torch.zeros_like(batch.cc), qc=torch.zeros_like(batch.qc))).start)
