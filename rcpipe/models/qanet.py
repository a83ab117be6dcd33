"""QANet (Yu et al. 2018): convolution and self-attention instead of recurrence.

Embedding (word + char-CNN, two-layer highway, 1D conv to d) -> embedding encoder (one
block, shared by context and question) -> context-query attention (trilinear, DCN q2c)
-> 1D conv to d -> model encoder (a stack of blocks run three times with shared weights:
M0, M1, M2) -> p_start = softmax(W1 [M0; M1]), p_end = softmax(W2 [M0; M2]).

An encoder block is [position encoding, conv x #, self-attention, feed-forward], each
sublayer wrapped as x + f(layernorm(x)) and randomly skipped in training (stochastic depth).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rcpipe.config import ModelConfig
from rcpipe.models import ModelInputs
from rcpipe.models.batch import Batch
from rcpipe.models.embeddings import CharCNN, Highway, WordEmbedding, embed_batch
from rcpipe.models.layers import (
    NoAnswerHead,
    SpanLogits,
    TrilinearAttention,
    capturing,
    keep_attention,
    mask_logits,
    masked_softmax,
)
from rcpipe.models.views import C2Q, SELF, ViewSpec


def positional_encoding(length: int, dim: int, device: torch.device,
                        dtype: torch.dtype) -> torch.Tensor:
    """The sinusoid of Vaswani et al.: PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos."""
    t = torch.arange(length, device=device, dtype=torch.float32)  # (L,)
    inv_freq = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32)
                         * (-math.log(10000.0) / dim))  # (ceil(d/2),)
    angle = t[:, None] * inv_freq[None, :]  # (L, ceil(d/2))
    pe = torch.zeros(length, dim, device=device)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : dim // 2])  # an odd d has one cosine column fewer
    return pe.to(dtype)  # (L, d)


class DepthwiseSeparableConv(nn.Module):
    """A per-channel conv over time, then a 1x1 conv mixing channels, then ReLU.

    d*k + d + d*d + d parameters instead of a full conv's d*d*k + d (Chollet 2017).
    """

    def __init__(self, dim: int, kernel: int) -> None:
        super().__init__()
        if kernel % 2 == 0:
            raise ValueError(f"conv kernel must be odd to keep the length, not {kernel}")
        self.depthwise = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.pointwise = nn.Linear(dim, dim)  # a 1x1 conv, applied without a transpose

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # padded positions are zeroed so that the window of a real token near the end sees
        # exactly the zeros the conv's own padding would give, whatever the padded length
        x = x.masked_fill(~mask.unsqueeze(-1), 0.0)  # (B, L, d)
        x = self.depthwise(x.transpose(1, 2)).transpose(1, 2)  # (B, L, d)
        return F.relu(self.pointwise(x))  # (B, L, d)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention; padded keys get no weight.

    No dropout on the attention weights: the paper drops between layers only, and without it
    scaled_dot_product_attention can take its fused kernel instead of materialising the
    (B, h, L, L) weights and a mask of the same size.
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads != 0:
            raise ValueError(f"hidden {dim} is not divisible by heads {heads}")
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, d // self.heads)  # (B, L, 3, h, d/h)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, h, L, d/h)
        # a row with no real token (an empty context) would softmax over nothing -> NaN;
        # let it attend everywhere instead, its outputs are masked downstream anyway
        keys = mask | ~mask.any(dim=1, keepdim=True)  # (B, L)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=keys[:, None, None, :]  # (B, 1, 1, L) broadcast over queries
        )  # (B, h, L, d/h)
        if capturing(self):  # the fused kernel keeps no weights: form them again, for explain
            s = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)  # (B, h, L, L)
            keep_attention(self, "self", masked_softmax(s, keys[:, None, None, :]))
        y = y.transpose(1, 2).reshape(b, n, d)  # (B, L, d)
        return self.out(y)


class EncoderBlock(nn.Module):
    """[position encoding, conv x #, self-attention, feed-forward], pre-norm residuals.

    ``scale[i]`` multiplies sublayer i's output: 1 in eval; in training 1 / survival_i when
    the sublayer survives the step and 0 when it is dropped (stochastic depth, Huang et al.
    2016), so eval needs no rescale. The coin is a tensor, never a Python branch: a dropped
    sublayer is still computed, but a training step has one shape of graph (CUDA graphs and
    torch.compile capture it) and never waits for the host to decide.
    """

    def __init__(self, dim: int, convs: int, kernel: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.conv_norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(convs))
        self.convs = nn.ModuleList(DepthwiseSeparableConv(dim, kernel) for _ in range(convs))
        self.attn_norm = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.drop = nn.Dropout(dropout)
        self.sublayers = convs + 2

    @staticmethod
    def _add(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return x + (y if scale is None else y * scale.to(y.dtype))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pe: torch.Tensor | None,
                scale: torch.Tensor | None = None) -> torch.Tensor:
        """``scale``: (convs + 2,) stochastic-depth factors; None runs every sublayer as is."""
        def s(i: int) -> torch.Tensor | None:
            return None if scale is None else scale[i]

        if pe is not None:
            x = x + pe  # (B, L, d) + (L, d)
        for i, (norm, conv) in enumerate(zip(self.conv_norms, self.convs, strict=True)):
            h = norm(x)
            if i % 2 == 0:  # the paper's dropout on every other conv layer's input
                h = self.drop(h)
            x = self._add(x, self.drop(conv(h, mask)), s(i))
        x = self._add(x, self.drop(self.attn(self.attn_norm(x), mask)), s(len(self.convs)))
        x = self._add(x, self.drop(self.ffn(self.ffn_norm(x))), s(len(self.convs) + 1))
        return x  # (B, L, d)


class Encoder(nn.Module):
    """A stack of encoder blocks; stochastic depth numbers sublayers across the stack.

    Sublayer l of L (1-based, L = blocks * (convs + 2)) survives with 1 - l / L * p_L, so
    deeper sublayers are dropped more often, up to p_L for the last one. One coin per
    sublayer per call (per batch, as in the paper), all drawn at once on the input's device
    from torch's generator: torch.manual_seed governs them and no step syncs for them.
    """

    def __init__(self, blocks: int, dim: int, convs: int, kernel: int, heads: int,
                 dropout: float, p_l: float, position_encoding: bool = True) -> None:
        super().__init__()
        self.position_encoding = position_encoding
        total = blocks * (convs + 2)
        survival = [1.0 - sub / total * p_l for sub in range(1, total + 1)]
        self.stochastic = p_l > 0
        # not in the state_dict: it follows from the config, and old model files lack it
        self.register_buffer("survival", torch.tensor(survival), persistent=False)  # (L,)
        self.blocks = nn.ModuleList(
            EncoderBlock(dim, convs, kernel, heads, dropout) for _ in range(blocks))

    def scales(self, device: torch.device) -> torch.Tensor | None:
        """This call's stochastic-depth factors, (blocks, convs + 2); None: run everything."""
        if not (self.training and self.stochastic):
            return None
        keep = torch.rand(self.survival.shape, device=device) < self.survival  # (L,)
        return (keep / self.survival).view(len(self.blocks), -1)  # (blocks, convs + 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pe = positional_encoding(x.size(1), x.size(2), x.device, x.dtype) \
            if self.position_encoding else None  # (L, d), once
        scales = self.scales(x.device)
        for b, block in enumerate(self.blocks):
            x = block(x, mask, pe, None if scales is None else scales[b])  # (B, L, d)
        return x


class QANet(nn.Module):
    def __init__(self, cfg: ModelConfig, inputs: ModelInputs) -> None:
        super().__init__()
        d = cfg.hidden
        if d % cfg.heads != 0:
            raise ValueError(f"hidden {d} is not divisible by heads {cfg.heads}")
        for name in ("conv_kernel", "model_kernel"):
            if getattr(cfg, name) % 2 == 0:
                raise ValueError(f"{name} must be odd to keep the length")
        self.word_emb = WordEmbedding.of(inputs, cfg.train_word_vectors, cfg.word_dropout)
        self.char_emb = CharCNN(inputs.char_vocab, cfg.char_dim, cfg.char_hidden,
                                cfg.char_kernel, cfg.char_dropout)
        emb_dim = inputs.word_dim + cfg.char_hidden  # p1 + p2
        # the paper's order: highway over [x_w; x_c], then the 1D conv (a shared linear) to d
        self.highway = Highway(emb_dim, cfg.highway_layers, cfg.dropout)
        self.emb_proj = nn.Linear(emb_dim, d)
        self.emb_encoder = Encoder(1, d, cfg.emb_convs, cfg.conv_kernel, cfg.heads,
                                   cfg.dropout, cfg.stochastic_depth, cfg.position_encoding)
        self.cq_attention = TrilinearAttention(d, "dcn", cfg.similarity_init)
        self.cq_proj = nn.Linear(4 * d, d)
        self.model_encoder = Encoder(cfg.model_blocks, d, cfg.model_convs, cfg.model_kernel,
                                     cfg.heads, cfg.dropout, cfg.stochastic_depth,
                                     cfg.position_encoding)
        self.w1 = nn.Linear(2 * d, 1, bias=False)  # the paper's W1, W2 have no bias
        self.w2 = nn.Linear(2 * d, 1, bias=False)
        self.na_head = NoAnswerHead(3 * d) if inputs.no_answer else None
        self.drop = nn.Dropout(cfg.dropout)

    def embed(self, words: torch.Tensor, chars: torch.Tensor) -> torch.Tensor:
        """Word ids (B, L) and their char-CNN features (B, L, p2) -> (B, L, d)."""
        w = self.drop(self.word_emb(words))  # (B, L, p1); char dropout is inside CharCNN
        return self.emb_proj(self.highway(torch.cat([w, chars], dim=-1)))  # (B, L, d)

    def forward(self, batch: Batch) -> SpanLogits:
        c_mask, q_mask = batch.c_mask, batch.q_mask
        # in training word and highway dropout draw per token: there, chars once per word
        c_emb, q_emb = embed_batch(self.embed, self.char_emb, batch, self.training)  # (B, L, d)
        c = self.emb_encoder(c_emb, c_mask)  # (B, Lc, d)
        q = self.emb_encoder(q_emb, q_mask)  # (B, Lq, d)
        g = self.cq_attention(c, q, c_mask, q_mask)  # (B, Lc, 4d)
        m = self.cq_proj(self.drop(g))  # (B, Lc, d)
        # one stack, three passes (shared weights); dropout on every other pass's input
        m0 = self.model_encoder(self.drop(m), c_mask)  # (B, Lc, d)
        m1 = self.model_encoder(m0, c_mask)  # (B, Lc, d)
        m2 = self.model_encoder(self.drop(m1), c_mask)  # (B, Lc, d)
        # logits in float32 so that masking with NEG_INF is safe under fp16 autocast
        start = self.w1(torch.cat([m0, m1], dim=-1)).squeeze(-1).float()  # (B, Lc)
        end = self.w2(torch.cat([m0, m2], dim=-1)).squeeze(-1).float()  # (B, Lc)
        na = None
        if self.na_head is not None:
            na = self.na_head(torch.cat([m0, m1, m2], dim=-1), c_mask).float()  # (B, 2)
        return SpanLogits(mask_logits(start, c_mask), mask_logits(end, c_mask), na)


def build_qanet(cfg: ModelConfig, inputs: ModelInputs) -> nn.Module:
    return QANet(cfg, inputs)


# what `rcpipe explain` shows (rcpipe.models.views)
VIEWS: dict[str, tuple[ViewSpec, ...]] = {
    "qanet": (
        ViewSpec("cq_attention", "c2q", 0, "question", f"{C2Q} (C2Q)",
                 "QANet context-query attention (trilinear): for each passage word, a "
                 "softmax over the question words"),
        ViewSpec("model_encoder.blocks.0.attn", "self", 0, "passage", SELF,
                 "QANet model encoder, first block, first pass (M0): multi-head "
                 "self-attention, mean over the heads"),
    ),
}
