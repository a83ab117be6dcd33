"""The embedding layer the families share: word vectors (with the trainable out-of-vocabulary
row), a char CNN over each word, the highway network over their concatenation, and an
embedding run once per distinct word of a batch (``chars_per_word``, ``per_word``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rcpipe.models.layers import Dropout

if TYPE_CHECKING:
    from rcpipe.models import ModelInputs
    from rcpipe.models.batch import Batch

OOV = 1  # the id data/vocab.py gives a word the vocabulary does not hold


class WordEmbedding(nn.Module):
    """Word vectors: pretrained (frozen unless fine-tuned) or trainable from scratch.

    Frozen pretrained vectors get one trainable vector for the out-of-vocabulary id instead
    of the fixed random row the vocabulary built for it (R-Net starts it at zero): a word
    the vectors do not know still gets a learned meaning. It trains on the training words
    the vectors lack (data.missing_vectors: unk makes them OOV) and on word dropout.
    ``learn_oov`` says so; it must be the same when a saved model is built again
    (ModelInputs.pretrained carries it). ``trained_words`` (data.missing_vectors: train):
    ids 2 .. 1 + n read their own trainable rows instead of the frozen table's, so the
    frozen table stays out of the optimiser and the EMA.
    """

    def __init__(self, vocab_size: int, dim: int, vectors: np.ndarray | None = None,
                 trainable: bool = False, learn_oov: bool = False,
                 word_dropout: float = 0.0, trained_words: int = 0) -> None:
        super().__init__()
        if not 0 <= trained_words <= vocab_size - 2:
            raise ValueError(f"trained_words {trained_words} outside 0 .. {vocab_size - 2}")
        self.word_dropout = word_dropout
        self.emb = nn.Embedding(vocab_size, dim, padding_idx=0)
        if vectors is not None:
            if vectors.shape != (vocab_size, dim):
                raise ValueError(f"vectors {vectors.shape} != ({vocab_size}, {dim})")
            self.emb.weight.data.copy_(torch.from_numpy(vectors))
            self.emb.weight.requires_grad = trainable
        self.oov = nn.Parameter(torch.zeros(dim)) if learn_oov else None  # (dim,)
        self.trained: nn.Parameter | None = None
        if trained_words:  # starting from the random rows prepare gave these words
            start = self.emb.weight.detach()[OOV + 1 : OOV + 1 + trained_words]
            self.trained = nn.Parameter(start.clone())  # (n, dim)
        self.dim = dim

    @classmethod
    def of(cls, inputs: ModelInputs, fine_tune: bool, word_dropout: float = 0.0
           ) -> WordEmbedding:
        """A model's word embedding from its data-side inputs and its config."""
        frozen = inputs.pretrained and not fine_tune  # fine-tuned: every row trains anyway
        return cls(inputs.word_vocab, inputs.word_dim, inputs.vectors, trainable=fine_tune,
                   learn_oov=frozen, word_dropout=word_dropout,
                   trained_words=inputs.trained_words if frozen else 0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.training and self.word_dropout > 0:
            # word dropout: a real word becomes out-of-vocabulary with this probability, so
            # the model cannot lean on memorising rare words (its chars still carry it)
            drop = torch.rand(ids.shape, device=ids.device) < self.word_dropout
            ids = torch.where(drop & (ids > OOV), torch.full_like(ids, OOV), ids)
        x = self.emb(ids)  # (B, L, dim)
        if self.trained is not None:
            n = self.trained.size(0)
            own = ids - (OOV + 1)  # (B, L): the row in ``trained`` where 0 <= own < n
            rows = F.embedding(own.clamp(0, n - 1), self.trained)  # (B, L, dim)
            x = torch.where(((own >= 0) & (own < n)).unsqueeze(-1), rows.to(x.dtype), x)
        if self.oov is not None:
            x = torch.where((ids == OOV).unsqueeze(-1), self.oov.to(x.dtype), x)  # (B, L, dim)
        return x


class CharCNN(nn.Module):
    """Char embeddings -> 1D conv over each word's chars -> max over chars (BiDAF, QANet).

    Its dropout is drawn per row of ``chars``: run by ``chars_per_word`` (as the models
    run it in eager mode), a word that occurs several times in a batch has one mask for
    all its occurrences.
    """

    def __init__(self, vocab_size: int, char_dim: int, filters: int, kernel: int,
                 dropout: float) -> None:
        super().__init__()
        if kernel % 2 == 0:  # padding kernel // 2 each side: one output per char
            raise ValueError(f"char_kernel must be odd to keep one output per char, not {kernel}")
        self.emb = nn.Embedding(vocab_size, char_dim, padding_idx=0)
        self.conv = nn.Conv1d(char_dim, filters, kernel, padding=kernel // 2)
        self.drop = Dropout(dropout)
        self.dim = filters

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        if (self.training or torch.is_grad_enabled() or torch.compiler.is_compiling()
                or torch.compiler.is_exporting()):
            return self.convolved(chars)
        return self.windowed(chars)

    def convolved(self, chars: torch.Tensor) -> torch.Tensor:
        """(B, L, W) -> (B, L, filters), as the paper: conv1d, max over chars, ReLU."""
        b, n, w = chars.shape
        x = self.drop(self.emb(chars.view(b * n, w)))  # (B*L, W, char_dim)
        x = self.conv(x.transpose(1, 2))  # (B*L, filters, W)
        # padding chars never win; ReLU after the max, as max(relu(x)) = relu(max(x)), on a
        # W-th of the values (a word of padding alone gives relu(-inf) = 0)
        x = x.masked_fill_(chars.view(b * n, 1, w) == 0, float("-inf"))
        # amax has no indices to write, but its backward splits a tie: max's where grads flow
        top = x.max(dim=2).values if x.requires_grad else x.amax(dim=2)  # (B*L, filters)
        return F.relu(top).view(b, n, -1)  # (B, L, filters)

    def windowed(self, chars: torch.Tensor) -> torch.Tensor:
        """``convolved`` where nothing trains (eager inference, no dropout): the conv as one
        matrix product over each char's window of embeddings, its bias after the max (a
        constant per filter; rounding is monotone, so the same floats), padding pushed to
        -inf by an add over (W, 1) rows: 2x faster a forward on one CPU thread than the
        conv's, whose layout makes the mask and the max stride over the filters."""
        b, n, w = chars.shape
        k = self.conv.kernel_size[0]
        ids = F.pad(chars.view(b * n, w), (k // 2, k // 2)).unfold(1, k, 1)  # (B*L, W, k)
        windows = self.emb(ids).view(b * n * w, -1)  # (B*L*W, k*char_dim), k-major
        weight = self.conv.weight.transpose(1, 2).reshape(self.dim, -1)  # (filters, k*char_dim)
        x = torch.mm(windows, weight.t()).view(b * n, w, self.dim)  # (B*L, W, filters)
        padding = torch.zeros(b * n, w, 1, dtype=x.dtype, device=x.device)  # (B*L, W, 1)
        x = x.add_(padding.masked_fill_(chars.view(b * n, w, 1) == 0, float("-inf")))
        return F.relu(x.amax(dim=1).add_(self.conv.bias)).view(b, n, -1)  # (B, L, filters)


class Highway(nn.Module):
    """y = g * relu(W x) + (1 - g) * x, g = sigmoid(W_g x) (Srivastava et al.)."""

    def __init__(self, dim: int, layers: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.transform = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.gate = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.drop = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for t, g in zip(self.transform, self.gate, strict=True):
            gate = torch.sigmoid(g(x))
            x = gate * self.drop(F.relu(t(x))) + (1 - gate) * x
        return x


def per_word(embed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], batch: Batch
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``embed`` (word ids (B, L), chars (B, L, W)) -> (B, L, D), a token's embedding, of
    every context and question token, (B, Lc, D) and (B, Lq, D): once per distinct (word id,
    chars) pair where collate listed them (``Batch.words``), gathered; else per token.

    A batch of 32 SQuAD contexts holds about 2.5x as many tokens as distinct words. Collate
    lists them on the host, off the step (finding them here would read their number back
    from the device: a host sync per step). Only for an ``embed`` that draws nothing per
    token (a word's dropout mask then follows its row): BiDAF's 200-wide highway then runs
    on a third of the rows. Under torch.compile, per token, one static graph: a compiled
    graph that read batch.words would take it as an input and recompile for each number of
    distinct words (so the compiler is asked first). An exported graph (rcpipe export)
    takes them as inputs, their number a dynamic axis, and runs once per distinct word.
    """
    if ((torch.compiler.is_compiling() and not torch.compiler.is_exporting())
            or not batch.lists_words):
        return embed(batch.cw, batch.cc), embed(batch.qw, batch.qc)
    table = embed(batch.word_ids.unsqueeze(0), batch.words.unsqueeze(0)).squeeze(0)  # (U, D)
    return F.embedding(batch.cu, table), F.embedding(batch.qu, table)  # (B, Lc, D), (B, Lq, D)


def chars_per_word(embed: Callable[[torch.Tensor], torch.Tensor], batch: Batch
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``embed`` (B, L, W) -> (B, L, D), a char embedding, of every context and question
    token: ``per_word`` over the chars alone (a word's char embedding depends on them)."""
    return per_word(lambda _, chars: embed(chars), batch)


def embed_batch(embed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                chars: Callable[[torch.Tensor], torch.Tensor], batch: Batch,
                per_token: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The context's and the question's embeddings, (B, Lc, D) and (B, Lq, D):
    ``embed(word ids, char features)`` over ``chars(char ids)``. The whole of it once per
    distinct word (``per_word``), or, when ``per_token`` (the model draws something per
    token before the embedding's output: word dropout), only ``chars`` (``chars_per_word``)."""
    if per_token:
        c_chars, q_chars = chars_per_word(chars, batch)  # (B, Lc, Dc), (B, Lq, Dc)
        return embed(batch.cw, c_chars), embed(batch.qw, q_chars)
    return per_word(lambda words, char_ids: embed(words, chars(char_ids)), batch)
