"""R-Net (additive, recurrent attention) and rnet_mult (multiplicative) on tiny batches.

allennlp-models style: probabilities sum to 1, start <= end, a tiny batch can be overfit,
save/load round-trips; plus the recurrent attention against the paper's per-step formula,
exact parameter counts, and BiRNN (the unpacked BiRNN both families use).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from rcpipe.config import ModelConfig
from rcpipe.models import build_model
from rcpipe.models.batch import Batch
from rcpipe.models.layers import (
    BiRNN,
    count_parameters,
    reverse_padded,
    span_loss,
)
from rcpipe.models.rnet import CharGRU, GatedAttentionRNN, MultiplicativeMatching, RNet
from tests.models.conftest import CHARS, WORDS, inputs, make_batch

VARIANTS = ("rnet", "rnet_mult")
D = 16  # hidden
CFG = ModelConfig(hidden=D, char_dim=8, char_hidden=16, layers=2, dropout=0.1)


def build(variant: str, no_answer: bool = False, seed: int = 0, cfg: ModelConfig = CFG
          ) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(variant, cfg, inputs(no_answer))


def test_gated_attention_matches_the_per_step_formula() -> None:
    """v_t = GRU(v_{t-1}, g_t * [u_t; c_t]), c_t from v^T tanh(W_u^Q u^Q + W_u^P u_t +
    W_v^P v_{t-1}), g_t = sigmoid(W_g [u_t; c_t]): written out with the whole W_g."""
    torch.manual_seed(0)
    rnn = GatedAttentionRNN(dim=6, attn_dim=5, hidden=4).eval()
    u_p, u_q = torch.randn(2, 7, 6), torch.randn(2, 3, 6)
    c_mask = torch.ones(2, 7, dtype=torch.bool)
    q_mask = torch.tensor([[True, True, True], [True, True, False]])
    out = rnn(u_p, c_mask, u_q, q_mask)
    for b in range(2):
        n = int(q_mask[b].sum())
        v = torch.zeros(4)
        for t in range(7):
            s = rnn.v(torch.tanh(rnn.w_uq(u_q[b, :n]) + rnn.w_up(u_p[b, t]) + rnn.w_vp(v)))
            c = torch.softmax(s.squeeze(-1), 0) @ u_q[b, :n]
            x = torch.cat([u_p[b, t], c])
            v = rnn.cell((torch.sigmoid(rnn.gate.w_g(x)) * x).unsqueeze(0), v.unsqueeze(0))[0]
            torch.testing.assert_close(out[b, t], v, atol=1e-5, rtol=1e-5)


def test_the_backward_direction_reads_each_passage_reversed_within_its_length() -> None:
    from rcpipe.models.rnet import BiGatedAttentionRNN

    torch.manual_seed(0)
    rnn = BiGatedAttentionRNN(dim=6, attn_dim=5, hidden=4).eval()
    u_p, u_q = torch.randn(2, 7, 6), torch.randn(2, 3, 6)
    c_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    q_mask = torch.ones(2, 3, dtype=torch.bool)
    out = rnn(u_p, c_mask, u_q, q_mask)  # (B, Lc, 8)
    torch.testing.assert_close(out[..., :4], rnn.fwd(u_p, c_mask, u_q, q_mask))
    for b, n in enumerate((7, 4)):
        back = rnn.bwd(u_p[b : b + 1, :n].flip(1), c_mask[b : b + 1, :n], u_q[b : b + 1],
                       q_mask[b : b + 1])  # (1, n, 4): the real words, last first
        torch.testing.assert_close(out[b, :n, 4:], back[0].flip(0), atol=1e-6, rtol=1e-5)


def test_gated_attention_is_causal() -> None:
    """Unidirectional: changing the passage at step 4 leaves steps 0-3 unchanged."""
    torch.manual_seed(0)
    rnn = GatedAttentionRNN(dim=6, attn_dim=5, hidden=4).eval()
    u_p, u_q = torch.randn(1, 7, 6), torch.randn(1, 3, 6)
    c_mask, q_mask = torch.ones(1, 7, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool)
    changed = u_p.clone()
    changed[0, 4] += 1.0
    a, b = rnn(u_p, c_mask, u_q, q_mask), rnn(changed, c_mask, u_q, q_mask)
    assert torch.equal(a[0, :4], b[0, :4])
    assert not torch.allclose(a[0, 4:], b[0, 4:])


def test_multiplicative_self_matching_masks_the_diagonal_and_padding() -> None:
    torch.manual_seed(0)
    block = MultiplicativeMatching(dim=6, memory_dim=6, attn_dim=5, hidden=4).eval()
    x = torch.randn(3, 5, 6)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] + [False] * 4])
    a = block.attention(x, mask, x, None)  # (B, L, L)
    assert (a.diagonal(dim1=1, dim2=2) == 0).all()
    assert (a.transpose(1, 2)[~mask] == 0).all()  # no weight on padding
    torch.testing.assert_close(a[0].sum(-1), torch.ones(5))
    torch.testing.assert_close(a[1, :3].sum(-1), torch.ones(3))
    assert (a[2, 0] == 0).all()  # a one-token passage has nothing else to attend to
    with pytest.raises(ValueError):
        block(x, mask, x, None)


def test_char_gru_ignores_padding_tokens_and_the_batch() -> None:
    torch.manual_seed(0)
    emb = CharGRU(CHARS, 8, 5).eval()
    chars = torch.zeros(2, 4, 16, dtype=torch.long)
    chars[0, 0, :3] = torch.tensor([3, 4, 5])
    chars[0, 1, :6] = torch.tensor([6, 7, 8, 9, 10, 11])
    chars[1, 0, :1] = 12
    out = emb(chars)  # (2, 4, 10)
    assert out.shape == (2, 4, 10)
    assert (out[0, 2:] == 0).all() and (out[1, 1:] == 0).all()
    alone = emb(chars[:1, :1, :3])  # the first word alone, no char padding
    torch.testing.assert_close(out[0, 0], alone[0, 0], atol=1e-6, rtol=1e-6)


def _packed_reference(rnns: list[nn.RNNBase], x: torch.Tensor, mask: torch.Tensor
                      ) -> torch.Tensor:
    """The textbook way: pack, run the bidirectional RNNs, unpack, concatenate layers."""
    lengths = mask.sum(1).clamp(min=1)
    outs = []
    for rnn in rnns:
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        y, _ = rnn(packed)
        x, _ = pad_packed_sequence(y, batch_first=True, total_length=mask.size(1))
        outs.append(x)
    return torch.cat(outs, dim=-1)


@pytest.mark.parametrize("variant", ["rnet", "rnet_mult"])
def test_char_states_of_distinct_words_are_the_per_token_ones(variant: str) -> None:
    """collate's distinct words (unbucketed batches): the same outputs and gradients as
    running the char GRU on every token."""
    from rcpipe.data.dataset import distinct_words

    batch = make_batch(b=3, lc=12, lq=5, seed=2)
    listed = Batch(**{**batch.__dict__, **distinct_words(
        batch.cw.numpy(), batch.cc.numpy(), batch.qw.numpy(), batch.qc.numpy())})
    model = build(variant).train()
    results = []
    for b in (batch, listed):
        model.zero_grad()
        torch.manual_seed(1)
        out = model(b)
        span_loss(out, b.y1, b.y2).backward()
        results.append((out.start.detach(), {n: p.grad.clone() for n, p
                                             in model.named_parameters() if p.grad is not None}))
    (a, ga), (b2, gb) = results
    torch.testing.assert_close(b2, a, atol=1e-6, rtol=1e-5)
    assert ga.keys() == gb.keys()
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_birnn_matches_a_packed_bidirectional_rnn(cell: str) -> None:
    torch.manual_seed(0)
    kind = {"gru": nn.GRU, "lstm": nn.LSTM}[cell]
    packed = [kind(6, 4, batch_first=True, bidirectional=True),
              kind(8, 4, batch_first=True, bidirectional=True)]
    padded = BiRNN(6, 4, layers=2, cell=cell, concat_layers=True).eval()
    for i, rnn in enumerate(packed):
        for name, p in rnn.named_parameters():
            target = padded.bwd[i] if name.endswith("_reverse") else padded.fwd[i]
            getattr(target, name.removesuffix("_reverse")).data.copy_(p.data)
    x = torch.randn(3, 9, 6)
    mask = torch.arange(9) < torch.tensor([9, 5, 1]).unsqueeze(1)  # (3, 9)
    with torch.no_grad():
        torch.testing.assert_close(padded(x, mask), _packed_reference(packed, x, mask),
                                   atol=1e-6, rtol=1e-5)
    lengths = mask.sum(1)
    assert torch.equal(reverse_padded(reverse_padded(x, lengths), lengths), x)
    assert torch.equal(reverse_padded(x, lengths)[1, :5], x[1, :5].flip(0))


def gru_params(n_in: int, h: int) -> int:
    """One direction of nn.GRU / an nn.GRUCell: 3 gates of W_ih, W_hh, b_ih, b_hh."""
    return 3 * (n_in * h + h * h + 2 * h)


def test_parameter_counts() -> None:
    d, w, ch, cd = D, 16, CFG.char_hidden, CFG.char_dim
    model, mult = build("rnet"), build("rnet_mult")
    v2 = build("rnet", no_answer=True)
    assert isinstance(model, RNet) and isinstance(mult, RNet)
    char = CHARS * cd + 2 * gru_params(cd, ch)
    assert count_parameters(model.char_emb) == char
    e = w + 2 * ch
    encoder = 2 * gru_params(e, d) + 2 * gru_params(2 * d, d) * (CFG.layers - 1)
    assert count_parameters(model.encoder) == encoder
    # per direction: W_u^Q, W_u^P (2d -> d), W_v^P (d -> d), v (d), W_g on [u_t; c_t] (4d),
    # GRUCell 4d -> d; two directions (the report's section 4.1)
    one_way = 2 * (2 * d * d) + d * d + d + (4 * d) ** 2 + gru_params(4 * d, d)
    gated = 2 * one_way
    assert count_parameters(model.question_matching) == gated
    # W_v^P, W_v^~P (2d -> d), v, W_g on [v_t; c_t] (4d), BiGRU 4d -> d
    self_matching = 2 * (2 * d * d) + d + (4 * d) ** 2 + 2 * gru_params(4 * d, d)
    assert count_parameters(model.self_matching) == self_matching
    output_rnn = 2 * gru_params(2 * d, d)
    # W_u^Q (2d -> d), W_v^Q (d -> d), V_r^Q (d), v (d)
    pooling = 2 * d * d + d * d + d + d
    assert count_parameters(model.question_pooling) == pooling
    # W_h^P, W_h^a (2d -> d), v (d), GRUCell 2d -> 2d
    pointer = 2 * (2 * d * d) + d + gru_params(2 * d, 2 * d)
    assert count_parameters(model.pointer) == pointer
    total = WORDS * w + char + encoder + gated + self_matching + output_rnn + pooling + pointer
    assert count_parameters(model) == total
    assert count_parameters(v2) - total == (2 * d + 1) + (2 * d * 2 + 2)  # no-answer head
    # rnet_mult: W_1, W_2 (2d -> d), W_g (4d), BiGRU 4d -> d; then the same over v^P (2d)
    mult_matching = 2 * (2 * d * d) + (4 * d) ** 2 + 2 * gru_params(4 * d, d)
    assert count_parameters(mult.question_matching) == mult_matching
    assert count_parameters(mult.self_matching) == mult_matching
    assert count_parameters(mult) == total - gated - self_matching + 2 * mult_matching
    print(f"rnet {count_parameters(model)}  rnet_mult {count_parameters(mult)}")
    assert count_parameters(model) == 59232  # pinned for CFG, word_dim 16
    assert count_parameters(mult) == 53552
    forward_only = build("rnet", cfg=CFG.model_copy(update={"bidirectional_matching": False}))
    one_way_self = 2 * d * d + d + (2 * d) ** 2 + 2 * gru_params(2 * d, d)
    assert count_parameters(forward_only) == total - one_way - self_matching + one_way_self
