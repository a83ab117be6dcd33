"""rcpipe/inference/combination.py: how an ensemble combines, from `rcpipe ensemble`'s
metrics, and from a champion.json read from outside (checked, one reason when not one)."""

from __future__ import annotations

from typing import Any

import pytest

from rcpipe.inference.combination import Combination


def test_the_ensemble_metrics_name_the_method_its_weights_and_threshold() -> None:
    result = {"method": "selected", "f1": 60.0, "methods": {
        "vote": {"f1": 55.0}, "mean": {"f1": 58.0, "weights": {"bidaf": 1, "qanet": 1}},
        "selected": {"f1": 60.0, "weights": {"bidaf": 3, "qanet": 0}, "na_threshold": 0.4}}}
    how = Combination.of(result)
    assert how == Combination("selected", {"bidaf": 3.0, "qanet": 0.0}, 0.4)
    assert how.members(["bidaf", "rnet", "qanet"]) == ([0], [3.0])  # qanet weighs nothing
    assert Combination.parse(how.as_dict()) == how  # what champion.json carries reads back
    # metrics from before ensemble.method: the vote
    assert Combination.of({"f1": 50.0}) == Combination() == Combination.parse(None)


@pytest.mark.parametrize("record, says", [
    ([1, 2], "expected {method, weights, na_threshold}"),
    ({"method": "mean", "extra": 1}, "expected {method"),
    ({"method": "median"}, "method 'median' is none of vote, mean, selected"),
    ({"method": "mean", "weights": {"bidaf": "x"}}, "weights: expected member -> a number"),
    ({"method": "mean", "weights": {"bidaf": -1}}, "weights: expected member -> a number"),
    ({"method": "mean", "weights": {"bidaf": 0}}, "method mean with no member weighted"),
    ({"method": "vote", "na_threshold": "high"}, "na_threshold: expected a number or null"),
])
def test_a_forged_record_is_one_reason(record: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("{", r"\{").replace("(", r"\(")):
        Combination.parse(record)
