"""What every model's forward takes: one padded, masked batch of questions.

Here, beside the models, so that a model file needs nothing of the data side
(data/dataset.py builds batches from the prepared Parquet files).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Batch:
    ids: list[str]
    cw: torch.Tensor  # (B, Lc) context word ids, 0 = pad
    cc: torch.Tensor  # (B, Lc, W) context char ids
    qw: torch.Tensor  # (B, Lq)
    qc: torch.Tensor  # (B, Lq, W)
    c_mask: torch.Tensor  # (B, Lc) bool, True on real tokens
    q_mask: torch.Tensor  # (B, Lq)
    y1: torch.Tensor  # (B,) answer start token, -1 when none
    y2: torch.Tensor  # (B,)
    is_impossible: torch.Tensor  # (B,) bool
    # The batch's distinct words, (word id, char row) pairs, and, per token, its row there:
    # given by collate, found on the host, so that an embedding runs once per distinct word,
    # not once per token (models/embeddings.py's per_word and chars_per_word; per token
    # without them)
    words: torch.Tensor | None = None  # (U, W) each distinct word's chars
    word_ids: torch.Tensor | None = None  # (U,) its word id
    cu: torch.Tensor | None = None  # (B, Lc) context token -> row of words
    qu: torch.Tensor | None = None  # (B, Lq)
    # a student's batch (`rcpipe distill`): the teacher's p_start and p_end over [no-answer,
    # token 0 .. Lc-1], 0 on padding (data/teacher.py)
    teacher_start: torch.Tensor | None = None  # (B, 1 + Lc)
    teacher_end: torch.Tensor | None = None  # (B, 1 + Lc)

    @property
    def lists_words(self) -> bool:
        """Whether collate listed the batch's distinct words (``words`` and the rest)."""
        return not any(t is None for t in (self.words, self.word_ids, self.cu, self.qu))

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        return Batch(**{k: fn(v) if isinstance(v, torch.Tensor) else v
                        for k, v in self.__dict__.items()})

    def to(self, device: torch.device | str) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin(self) -> Batch:
        """In page-locked memory, so that ``to(cuda)`` copies without blocking the host."""
        return self._map(torch.Tensor.pin_memory)

    def __len__(self) -> int:
        return len(self.ids)
