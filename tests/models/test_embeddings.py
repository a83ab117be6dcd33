"""The shared embeddings: what trains beside frozen pretrained vectors, and the char
embedding run once per distinct word.

data.missing_vectors decides what a training word the vectors lack becomes: the OOV id
(unk), whose one vector then trains, or its own trainable row (train). Either way the frozen
table stays frozen and out of the optimiser and the EMA.

``chars_per_word`` computes each distinct word's chars once and gathers, ``per_word`` a
token's whole embedding (word vector, chars, highway): every variant's outputs and
gradients are those of the per-token path up to the order of a float64 sum (a word's
occurrences are summed before the batch is; a matrix product over fewer rows).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from rcpipe import stages
from rcpipe.config import Config, ModelConfig
from rcpipe.data.dataset import distinct_words
from rcpipe.data.stream import TrainStream
from rcpipe.models import ModelInputs, build_model, embeddings
from rcpipe.models.batch import Batch
from rcpipe.models.embeddings import OOV, CharCNN, WordEmbedding, chars_per_word
from rcpipe.train.loop import EMA, make_optimizer, train_step
from rcpipe.trained.model_file import model_from_payload, model_payload, prepared_inputs
from rcpipe.variants import REGISTRY
from tests.conftest import TINY_MODEL, Prepared, vectors_for_half
from tests.models.conftest import CHARS, WORDS, make_batch


def _vectors() -> np.ndarray:
    vectors = np.random.default_rng(0).normal(size=(WORDS, 16)).astype(np.float32)
    vectors[0] = 0.0  # PAD, as prepare writes it
    return vectors


def test_trained_words_read_their_own_rows_and_only_those_learn() -> None:
    vectors = _vectors()
    emb = WordEmbedding(WORDS, 16, vectors, learn_oov=True, trained_words=3)
    assert emb.trained is not None and emb.oov is not None
    torch.testing.assert_close(emb.trained.detach(), torch.from_numpy(vectors[2:5]))
    with torch.no_grad():
        emb.trained.add_(1.0)
    ids = torch.tensor([[0, OOV, 2, 4, 5, 9]])
    out = emb(ids)  # (1, 6, 16)
    assert not out[0, 0].any() and not out[0, 1].any()  # PAD, and OOV starts at zero
    torch.testing.assert_close(out[0, 2:4], emb.trained[[0, 2]])  # ids 2 and 4: trained
    torch.testing.assert_close(out[0, 4:], torch.from_numpy(vectors[[5, 9]]))  # frozen
    out.sum().backward()
    assert emb.emb.weight.grad is None and emb.oov.grad is not None
    assert emb.trained.grad is not None
    assert emb.trained.grad[[0, 2]].abs().sum() > 0 and not emb.trained.grad[1].any()
    with pytest.raises(ValueError, match="trained_words"):
        WordEmbedding(WORDS, 16, vectors, learn_oov=True, trained_words=WORDS - 1)


def test_trained_rows_only_beside_frozen_vectors() -> None:
    given = ModelInputs(WORDS, CHARS, 16, _vectors(), no_answer=False, trained_words=3)
    assert WordEmbedding.of(given, fine_tune=False).trained is not None
    assert WordEmbedding.of(given, fine_tune=True).trained is None  # every row learns


def test_model_files_keep_loading() -> None:
    """A model file written before trained_words existed lacks it and still loads; one
    with trained rows brings them back."""
    cfg = ModelConfig(hidden=8, char_dim=4, char_hidden=8, layers=1, highway_layers=1)
    for n in (0, 3):
        given = ModelInputs(WORDS, CHARS, 16, _vectors(), no_answer=False, trained_words=n)
        model = build_model("bidaf", cfg, given)
        saved = model_payload("bidaf", cfg, given, model.state_dict(), "v")
        if n == 0:
            del saved["inputs"]["trained_words"]  # as written before the setting
        again, inputs = model_from_payload(saved, "bidaf", "v")
        assert inputs.trained_words == n and inputs.pretrained
        for k, v in model.state_dict().items():
            assert torch.equal(again.state_dict()[k], v), k


@pytest.mark.parametrize("missing_vectors", ["unk", "train", "fixed"])
def test_what_the_vectors_lack_trains_and_the_vectors_stay(
        make_config: Callable[..., Config], prepared: Prepared, tmp_path: Path,
        missing_vectors: str) -> None:
    """A few QANet steps on prepared synthetic data with vectors for half its words: the
    OOV vector (unk) or the lacking words' rows (train) move, the frozen table does not,
    and only what trains is in the optimiser and the EMA. With fixed (the behaviour before
    the setting) the OOV vector stays zero: no training word is out of vocabulary."""
    vectors_for_half(prepared, tmp_path / "vectors.txt")
    cfg = make_config(prepared.data,
                      data={"word_vectors": str(tmp_path / "vectors.txt"), "word_dim": 4,
                            "missing_vectors": missing_vectors},
                      models={"qanet": TINY_MODEL})
    stages.prepare(cfg)
    inputs = prepared_inputs(cfg.data.out_dir, cfg.data.word_dim)
    torch.manual_seed(0)
    model = build_model("qanet", cfg.models.of("qanet"), inputs)
    emb = model.word_emb
    assert isinstance(emb, WordEmbedding) and emb.oov is not None
    learns, name = (emb.trained, "word_emb.trained") if missing_vectors == "train" else \
        (emb.oov, "word_emb.oov")
    assert learns is not None and (emb.trained is None) == (missing_vectors != "train")
    start, table = learns.detach().clone(), emb.emb.weight.detach().clone()
    opt, sched = make_optimizer(model, cfg.models.of("qanet").optim)
    ema = EMA(model, decay=0.9)
    data, batches = TrainStream.of(cfg.data.out_dir, 8).epoch(0).cut(0)
    model.train()
    for rows in batches[:3]:
        train_step(model, data.collate(rows), opt, sched, 5.0, ema)
    if missing_vectors == "fixed":  # the issue: no training word is OOV, nothing learns
        assert not emb.oov.any()
    else:
        assert not torch.equal(learns.detach(), start)
    assert torch.equal(emb.emb.weight, table)  # the pretrained vectors stay
    optimised = {id(p) for group in opt.param_groups for p in group["params"]}
    assert id(learns) in optimised and id(emb.emb.weight) not in optimised
    assert name in ema.shadow and "word_emb.emb.weight" not in ema.shadow


def repeating_words(batch: Batch) -> Batch:
    """``batch`` with its tokens 6 words (of 1 to 6 chars), so that words repeat in context
    and question as in real text; padding tokens keep word id 0 and no chars."""
    g = torch.Generator().manual_seed(1)
    spellings = torch.randint(2, CHARS, (6, batch.cc.size(-1)), generator=g)  # (6, W)
    spellings[torch.arange(spellings.size(1)) >= torch.arange(1, 7)[:, None]] = 0
    ids = torch.tensor([OOV, 2, 3, 4, 5, 5])  # (6,): two spellings of one word, as "The", "the"
    c_pick = torch.randint(0, 6, batch.cw.shape, generator=g)  # (B, Lc)
    q_pick = torch.randint(0, 6, batch.qw.shape, generator=g)  # (B, Lq)
    cw, qw = ids[c_pick] * batch.c_mask, ids[q_pick] * batch.q_mask
    cc = spellings[c_pick] * batch.c_mask[..., None]  # (B, Lc, W)
    qc = spellings[q_pick] * batch.q_mask[..., None]
    listed = distinct_words(cw.numpy(), cc.numpy(), qw.numpy(), qc.numpy())  # as collate does
    return Batch(**{**batch.__dict__, "cw": cw, "cc": cc, "qw": qw, "qc": qc, **listed})


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("variant", sorted(REGISTRY))
def test_embedding_once_per_distinct_word_changes_no_output_nor_gradient(
        variant: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each variant in float64, dropout off, against the same weights run per token (the
    path before ``chars_per_word`` and ``per_word``, and the one torch.compile and export
    take), in training's mode and in evaluation's (QANet embeds per distinct word there
    only: its word and highway dropout draw per token in training)."""
    cfg = ModelConfig(hidden=8, char_dim=4, char_hidden=6, char_kernel=3, layers=2,
                      highway_layers=1, heads=2, emb_convs=2, model_blocks=1, model_convs=2,
                      dropout=0.0, char_dropout=0.0, stochastic_depth=0.0)
    batch = repeating_words(make_batch(b=3, lc=12, lq=5))
    assert batch.words is not None and len(batch.words) <= 7  # 6 words and the padding
    torch.manual_seed(0)
    model = build_model(variant, cfg, ModelInputs(WORDS, CHARS, 16, None, False)).double()
    model.train(mode == "train")

    def run() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        model.zero_grad()
        with torch.backends.mkldnn.flags(enabled=False):  # oneDNN's RNN has no float64
            out = model(batch)
        loss = (out.start.masked_fill(~batch.c_mask, 0).sin().sum()
                + out.end.masked_fill(~batch.c_mask, 0).cos().sum())
        with torch.backends.mkldnn.flags(enabled=False):
            loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return [out.start.detach(), out.end.detach()], grads

    outs, grads = run()
    family = importlib.import_module(REGISTRY[variant].family)
    for module in (family, embeddings):  # R-Net calls chars_per_word itself
        if hasattr(module, "chars_per_word"):
            monkeypatch.setattr(module, "chars_per_word",
                                lambda embed, b: (embed(b.cc), embed(b.qc)))
    monkeypatch.setattr(embeddings, "per_word",
                        lambda embed, b: (embed(b.cw, b.cc), embed(b.qw, b.qc)))
    per_token_outs, per_token_grads = run()
    for new, old in zip(outs, per_token_outs, strict=True):
        torch.testing.assert_close(new, old, rtol=1e-13, atol=1e-14)
    assert len(grads) == len(per_token_grads) > 0
    for new, old in zip(grads, per_token_grads, strict=True):
        torch.testing.assert_close(new, old, rtol=1e-12, atol=1e-14)


def test_under_dropout_a_word_has_one_char_mask_for_all_its_occurrences() -> None:
    torch.manual_seed(0)
    cnn = CharCNN(CHARS, 4, 6, 3, dropout=0.5).train()
    batch = repeating_words(make_batch(b=3, lc=12, lq=5))
    c, q = chars_per_word(cnn, batch)  # (B, Lc, 6), (B, Lq, 6)
    tokens = torch.cat([batch.cc.flatten(0, 1), batch.qc.flatten(0, 1)])  # (N, W)
    features = torch.cat([c.flatten(0, 1), q.flatten(0, 1)])  # (N, 6)
    for word in torch.unique(tokens, dim=0):
        same = features[(tokens == word).all(dim=1)]  # (n, 6): one word's occurrences
        assert len(same) > 1 and torch.equal(same, same[:1].expand_as(same))



@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kernel", [1, 3, 5])
def test_inference_windows_give_the_convolutions_numbers(dtype: torch.dtype, kernel: int) -> None:
    torch.manual_seed(0)
    cnn = CharCNN(CHARS, 4, 6, kernel, dropout=0.3).to(dtype).eval()
    chars = make_batch(b=3, lc=12, lq=5).cc  # (3, 12, 16): words of 5 chars, padding rows
    chars[0, 0] = 0  # a word of padding alone: relu(-inf) = 0
    chars[0, 1] = torch.arange(2, 18)  # a word filling every char slot
    with torch.no_grad():
        windowed = cnn(chars)
        convolved = cnn.convolved(chars)
    assert not windowed[0, 0].any() and windowed.dtype == dtype
    # the bias after the max changes no float (rounding is monotone); the product's sums
    # may round in another order than the conv's
    tol = {"rtol": 1e-12, "atol": 1e-14} if dtype == torch.float64 else {"rtol": 1e-6, "atol": 1e-6}
    torch.testing.assert_close(windowed, convolved, **tol)
    assert torch.equal(windowed, cnn.windowed(chars))


def test_the_convolution_runs_where_anything_trains() -> None:
    cnn = CharCNN(CHARS, 4, 6, 3, dropout=0.0).eval()
    chars = make_batch(b=2, lc=6, lq=3).cc
    calls: list[str] = []
    cnn.convolved = lambda c: calls.append("conv") or CharCNN.convolved(cnn, c)  # type: ignore[method-assign]
    cnn.windowed = lambda c: calls.append("windows") or CharCNN.windowed(cnn, c)  # type: ignore[method-assign]
    cnn(chars).sum().backward()  # grad enabled: the weights' gradients come from the conv
    assert cnn.conv.weight.grad is not None
    with torch.no_grad():
        cnn.train()(chars)  # dropout on the embeddings: per char, not per window
        cnn.eval()(chars)
    assert calls == ["conv", "conv", "windows"]


def test_an_even_char_kernel_is_refused_at_build() -> None:
    with pytest.raises(ValueError, match="char_kernel must be odd"):
        CharCNN(CHARS, 4, 6, 4, dropout=0.0)
