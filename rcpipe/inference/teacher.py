"""The teacher's distributions over the training rows (`rcpipe distill`): the ensemble's
members read each row as training reads it (whole, as prepare cut it) and their start/end
distributions combined as the ensemble combines them: the mean of the weighted members
(ensemble.method mean or selected, with the weights `rcpipe ensemble` chose on the held-out
questions), or, for the vote, the equal mean of its voters, the one distribution a vote's
answer is the likeliest text of most often. Written beside the training split by
data/teacher.py."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from rcpipe.data.dataset import SquadDataset, bucket_batches
from rcpipe.data.teacher import Targets
from rcpipe.inference.reading import EVAL_BATCH


def teacher_weights(names: Sequence[str], weights: dict[str, float], votes: bool
                    ) -> list[float]:
    """Each member's share of the teacher, summing to 1: equal for a vote, else its weight
    in the ensemble's mean."""
    raw = [1.0] * len(names) if votes else [weights.get(n, 0.0) for n in names]
    total = sum(raw)
    if total <= 0:
        raise ValueError("no member weighs in the teacher")
    return [w / total for w in raw]


def targets(members: Sequence[nn.Module], shares: Sequence[float], device: torch.device,
            char_limit: int, batch_size: int = EVAL_BATCH) -> Targets:
    """A row group's rows -> each row's teacher (p_start, p_end) over [no-answer, its
    tokens]: ``members``' distributions, weighed by ``shares``."""
    for m in members:
        m.eval()

    @torch.no_grad()
    def of(rows: pa.Table) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        data = SquadDataset(rows, char_limit=char_limit)
        lengths = data.context_lengths()
        found: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for indices in bucket_batches(lengths, batch_size, shuffle=False):
            batch = data.collate(indices).to(device)
            p1 = p2 = None
            for model, share in zip(members, shares, strict=True):
                log_p1, log_p2 = model(batch).log_probs()  # (B, 1 + Lc) each
                p1 = share * log_p1.exp() + (0 if p1 is None else p1)
                p2 = share * log_p2.exp() + (0 if p2 is None else p2)
            assert p1 is not None and p2 is not None
            s1, s2 = p1.float().cpu().numpy(), p2.float().cpu().numpy()  # one copy a batch
            for b, i in enumerate(indices):
                n = 1 + int(lengths[i])
                found[i] = (s1[b, :n].copy(), s2[b, :n].copy())
        yield from (found[i] for i in range(len(data)))

    return of
