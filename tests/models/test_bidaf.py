"""BiDAF and BiDAF + self-matching (bidaf_selfattn) on tiny random batches.

allennlp-models style: probabilities sum to 1, start <= end, a tiny batch can be overfit,
save/load round-trips; plus exact parameter counts derived from the paper's layer sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from rcpipe.config import ModelConfig
from rcpipe.models import ModelInputs, build_model
from rcpipe.models.bidaf import BiDAF
from rcpipe.models.layers import SelfMatching, count_parameters
from tests.models.conftest import CHARS, WORDS, inputs

VARIANTS = ("bidaf", "bidaf_selfattn")
D = 16  # hidden
CFG = ModelConfig(hidden=D, char_dim=8, char_hidden=16, char_kernel=5, layers=2,
                  highway_layers=2, dropout=0.1)


def build(variant: str, no_answer: bool = False, seed: int = 0,
          cfg: ModelConfig = CFG, model_inputs: ModelInputs | None = None) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(variant, cfg, model_inputs or inputs(no_answer))


def test_pretrained_vectors_are_frozen_unless_fine_tuned() -> None:
    vectors = np.random.default_rng(0).normal(size=(WORDS, 16)).astype(np.float32)
    given = ModelInputs(word_vocab=WORDS, char_vocab=CHARS, word_dim=16, vectors=vectors,
                        no_answer=False)
    frozen = build("bidaf", model_inputs=given)
    assert isinstance(frozen, BiDAF)
    weight = frozen.word_emb.emb.weight
    assert not weight.requires_grad
    np.testing.assert_array_equal(weight.detach().numpy(), vectors)
    tuned = build("bidaf", cfg=CFG.model_copy(update={"train_word_vectors": True}),
                  model_inputs=given)
    assert isinstance(tuned, BiDAF) and tuned.word_emb.emb.weight.requires_grad
    scratch = build("bidaf")  # no vectors: trained from scratch
    assert isinstance(scratch, BiDAF) and scratch.word_emb.emb.weight.requires_grad
    assert tuned.word_emb.oov is None and scratch.word_emb.oov is None  # every row learns


def test_frozen_vectors_learn_one_vector_for_out_of_vocabulary_words() -> None:
    from rcpipe.data.vocab import OOV as OOV_WORD
    from rcpipe.data.vocab import Vocab
    from rcpipe.models.embeddings import OOV
    from rcpipe.trained.model_file import model_from_payload, model_payload

    assert Vocab(["--NULL--", OOV_WORD, "a"]).id("never-seen") == OOV
    vectors = np.random.default_rng(0).normal(size=(WORDS, 16)).astype(np.float32)
    given = ModelInputs(word_vocab=WORDS, char_vocab=CHARS, word_dim=16, vectors=vectors,
                        no_answer=False)
    model = build("bidaf", model_inputs=given)
    emb = model.word_emb
    assert emb.oov is not None and emb.oov.requires_grad and not emb.oov.any()  # R-Net: zero
    ids = torch.tensor([[OOV, 2, OOV, 0]])
    out = emb(ids)  # (1, 4, 16)
    assert not out[0, 0].any() and torch.equal(out[0, 1], torch.from_numpy(vectors[2]))
    out.sum().backward()
    assert emb.oov.grad is not None and emb.emb.weight.grad is None
    # a saved model (vectors in its weights, not its inputs) is built with the same vector
    saved = model_payload("bidaf", CFG, given, model.state_dict(), "v")
    again, inputs = model_from_payload(saved, "bidaf", "v")
    assert inputs.pretrained and again.word_emb.oov is not None


@pytest.mark.parametrize("rows_per_chunk", [7, 3])
def test_self_matching_attention_matches_the_per_step_formula(rows_per_chunk: int) -> None:
    """c_t = sum_j softmax_j(v^T tanh(W_v^P v_j + W_v^~P v_t)) v_j, one t at a time."""
    torch.manual_seed(0)
    block = SelfMatching(dim=6, attn_dim=5, hidden=4).eval()
    block.CHUNK = 2 * 7 * 5 * rows_per_chunk  # (B, rows, L, A) elements per block of rows
    v = torch.randn(2, 7, 6)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    c = block.attend(v, mask)
    for b in range(2):
        n = int(mask[b].sum())
        for t in range(7):
            s = torch.stack([block.v(torch.tanh(block.w_v(v[b, j]) + block.w_v_t(v[b, t])))
                             for j in range(n)]).squeeze(-1)
            expected = torch.softmax(s, 0) @ v[b, :n]
            torch.testing.assert_close(c[b, t], expected, atol=1e-5, rtol=1e-5)


def lstm_params(n_in: int, h: int) -> int:
    """One direction of nn.LSTM: 4 gates of W_ih, W_hh, b_ih, b_hh."""
    return 4 * (n_in * h + h * h + 2 * h)


def test_parameter_counts() -> None:
    d, w, c = D, 16, CFG.char_hidden  # hidden, word_dim, char filters
    e = w + c  # highway width
    model = build("bidaf")
    selfattn = build("bidaf_selfattn")
    v2 = build("bidaf", no_answer=True)
    assert isinstance(model, BiDAF) and isinstance(selfattn, BiDAF)
    highway = 2 * (e * e + e) * CFG.highway_layers  # transform + gate, weights + biases
    assert count_parameters(model.highway) == highway
    char_cnn = CHARS * CFG.char_dim + CFG.char_dim * c * CFG.char_kernel + c
    assert count_parameters(model.char_emb) == char_cnn
    contextual = 2 * lstm_params(e, d)
    assert count_parameters(model.contextual) == contextual
    attention_flow = 3 * 2 * d + 1  # w_S over [h; u; h * u] (each 2d) + bias
    assert count_parameters(model.attention_flow) == attention_flow
    modeling = 2 * lstm_params(8 * d, d) + 2 * lstm_params(2 * d, d) * (CFG.layers - 1)
    assert count_parameters(model.modeling) == modeling
    # the output layer: w_p1 and w_p2 over [G; M] (10d) with a bias each, M2 = BiLSTM(M)
    output = 2 * (10 * d + 1) + 2 * lstm_params(2 * d, d)
    assert count_parameters(model.w_p1) + count_parameters(model.w_p2) \
        + count_parameters(model.end_rnn) == output
    words = WORDS * w
    total = words + char_cnn + highway + contextual + attention_flow + modeling + output
    assert count_parameters(model) == total
    # v2.0: the no-answer head pools [G; M2] (10d) and maps it to two logits
    assert count_parameters(v2) - total == (10 * d + 1) + (10 * d * 2 + 2)
    # bidaf_selfattn: the 8d -> 2d projection, self-matching (W_v^P, W_v^~P, v, W_g, BiGRU)
    # and a modeling layer that now reads 2d
    gru = 2 * 3 * (4 * d * d + d * d + 2 * d)  # BiGRU over g * [v; c] (4d)
    self_matching = 2 * (2 * d * d) + d + (4 * d) ** 2 + gru
    assert count_parameters(selfattn.self_matching) == self_matching
    extra = (8 * d * 2 * d + 2 * d) + self_matching - (lstm_params(8 * d, d)
                                                       - lstm_params(2 * d, d)) * 2
    assert count_parameters(selfattn) == total + extra
    print(f"bidaf {count_parameters(model)}  bidaf_selfattn {count_parameters(selfattn)}")
    assert count_parameters(model) == 44147  # pinned for CFG, word_dim 16
    assert count_parameters(selfattn) == 48995


def test_word_dropout_turns_real_words_out_of_vocabulary_in_training_only() -> None:
    from rcpipe.models.embeddings import OOV, WordEmbedding

    torch.manual_seed(0)
    emb = WordEmbedding(50, 4, word_dropout=0.5)
    ids = torch.randint(2, 50, (8, 100))
    ids[:, -10:] = 0  # padding is never dropped
    dropped = emb(ids) == emb.emb.weight[OOV]  # (8, 100, 4)
    share = dropped.all(-1)[:, :-10].float().mean()
    assert 0.4 < share < 0.6 and not dropped.all(-1)[:, -10:].any()
    emb.eval()
    assert torch.equal(emb(ids), emb.emb(ids))
