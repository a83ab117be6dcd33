"""How an ensemble's answer is made from its members' (ensemble.method and what `rcpipe
ensemble` chose for it), as a record the gate and a champion.json carry. Apart from
inference/ensemble.py, which does the combining, so that reading a record needs no torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from rcpipe.config.ensemble import Method

METHODS = get_args(Method)  # ensemble.method's values


@dataclass(frozen=True)
class Combination:
    """How an ensemble's answer is made from its members': ensemble.method, with what `rcpipe
    ensemble` chose for it on the held-out questions. The gate's ensemble candidate answers
    with it, and a promoted ensemble's champion.json carries it to the champion app."""

    method: str = "vote"
    # member -> its weight in the mean (mean: equal; selected: chosen on the held-out
    # questions, 0 for a member left out); empty for the vote
    weights: dict[str, float] = field(default_factory=dict)
    na_threshold: float | None = None  # v2.0 mean and selected: "" above this averaged na_prob

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> Combination:
        """From `rcpipe ensemble`'s methods (metrics/ensemble.methods.json, or a
        metrics/ensemble.json of before they had a file of their own): its method, and that
        method's weights and threshold; the vote for metrics from before methods."""
        method = str(result.get("method", "vote"))
        chosen = (result.get("methods") or {}).get(method) or {}
        return cls(method, {k: float(v) for k, v in (chosen.get("weights") or {}).items()},
                   chosen.get("na_threshold"))

    @classmethod
    def parse(cls, found: Any) -> Combination:
        """From a record read from outside (champion.json's "ensemble"); a ValueError saying
        what is wrong with it."""
        if found is None:
            return cls()
        if not isinstance(found, dict) or set(found) - {"method", "weights", "na_threshold"}:
            raise ValueError("expected {method, weights, na_threshold}")
        method, weights, na = found.get("method"), found.get("weights") or {}, \
            found.get("na_threshold")
        if method not in METHODS:
            raise ValueError(f"method {method!r} is none of {', '.join(METHODS)}")
        if not isinstance(weights, dict) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1e6
                for v in weights.values()):
            raise ValueError("weights: expected member -> a number from 0")
        if method != "vote" and not any(weights.values()):
            raise ValueError(f"method {method} with no member weighted")
        if na is not None and (isinstance(na, bool) or not isinstance(na, int | float)):
            raise ValueError("na_threshold: expected a number or null")
        return cls(method, {str(k): float(v) for k, v in weights.items()},
                   None if na is None else float(na))

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "weights": self.weights,
                "na_threshold": self.na_threshold}

    @property
    def votes(self) -> bool:
        """The majority vote of the answers given; else the mean of their distributions."""
        return self.method == "vote"

    def members(self, names: list[str]) -> tuple[list[int], list[float]]:
        """(the positions in ``names`` that weigh in the mean, their weights)."""
        chosen = [i for i, n in enumerate(names) if self.weights.get(n, 0) > 0]
        return chosen, [self.weights[names[i]] for i in chosen]

    def voters(self, names: list[str]) -> list[str]:
        """Those of ``names`` that answer for the ensemble: every one in a vote, the weighted
        ones in a mean (a member weighed 0 answers for nothing: not loaded, not pinned)."""
        return list(names) if self.votes else [names[i] for i in self.members(names)[0]]
