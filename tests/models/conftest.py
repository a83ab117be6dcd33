"""Tiny random batches for model tests: padded, masked, with answer spans inside."""

from __future__ import annotations

import pytest
import torch

from rcpipe.data.dataset import Batch
from rcpipe.models import ModelInputs

WORDS, CHARS = 50, 20


def make_batch(b: int = 4, lc: int = 30, lq: int = 8, seed: int = 0,
               impossible: bool = False) -> Batch:
    """Rows of different lengths (the first is full length); spans lie in the real tokens."""
    g = torch.Generator().manual_seed(seed)
    c_len = torch.randint(lc // 2, lc + 1, (b,), generator=g)
    c_len[0] = lc
    q_len = torch.randint(2, lq + 1, (b,), generator=g)
    q_len[0] = lq
    c_mask = torch.arange(lc)[None, :] < c_len[:, None]  # (B, Lc)
    q_mask = torch.arange(lq)[None, :] < q_len[:, None]  # (B, Lq)
    cw = torch.randint(2, WORDS, (b, lc), generator=g) * c_mask
    qw = torch.randint(2, WORDS, (b, lq), generator=g) * q_mask
    cc = torch.randint(2, CHARS, (b, lc, 16), generator=g) * c_mask[..., None]
    qc = torch.randint(2, CHARS, (b, lq, 16), generator=g) * q_mask[..., None]
    cc[..., 5:] = 0  # words of 5 chars
    qc[..., 5:] = 0
    y1 = (torch.rand(b, generator=g) * (c_len - 3)).long()
    y2 = y1 + torch.randint(0, 3, (b,), generator=g)
    imp = torch.zeros(b, dtype=torch.bool)
    if impossible:
        imp[1::2] = True
        y1[imp], y2[imp] = -1, -1
    return Batch(ids=[f"q{i}" for i in range(b)], cw=cw, cc=cc, qw=qw, qc=qc,
                 c_mask=c_mask, q_mask=q_mask, y1=y1, y2=y2, is_impossible=imp)


def inputs(no_answer: bool = False, word_dim: int = 16) -> ModelInputs:
    return ModelInputs(word_vocab=WORDS, char_vocab=CHARS, word_dim=word_dim, vectors=None,
                       no_answer=no_answer)


@pytest.fixture
def batch() -> Batch:
    return make_batch()
