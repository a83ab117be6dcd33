"""models/seed_mean.py: a variant of several runs (models.<variant>.seeds) answers with the
mean of its runs' distributions, its weights one payload that loads back as it was."""

from __future__ import annotations

import pytest
import torch

from rcpipe.config import ModelConfig
from rcpipe.models import build_model
from rcpipe.models.seed_mean import SeedMean
from rcpipe.trained.model_file import (
    PayloadMismatch,
    Unbuildable,
    model_from_payload,
    model_payload,
    side_by_side,
)
from tests.models.conftest import inputs, make_batch

CFG = ModelConfig(hidden=8, char_dim=4, char_hidden=8, layers=1, heads=2)


def runs(variant: str, no_answer: bool, n: int = 3) -> list[torch.nn.Module]:
    out = []
    for seed in range(n):
        torch.manual_seed(seed)
        out.append(build_model(variant, CFG, inputs(no_answer)).eval())
    return out


@pytest.mark.parametrize(("variant", "no_answer"), [("bidaf", False), ("qanet", True)])
def test_its_distributions_are_the_mean_of_its_runs(variant: str, no_answer: bool) -> None:
    members, batch = runs(variant, no_answer), make_batch(impossible=no_answer)
    with torch.no_grad():
        start, end = SeedMean(members)(batch).log_probs()  # (B, 1 + Lc) each
        each = [m(batch).log_probs() for m in members]
    for got, k in ((start, 0), (end, 1)):
        want = torch.stack([e[k].exp() for e in each]).mean(0)  # (B, 1 + Lc)
        torch.testing.assert_close(got.exp(), want, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got.exp().sum(1), torch.ones(len(batch.ids)))
        assert torch.isfinite(got).all()  # padding stays finite, as one model's
        assert (got.exp()[:, 1:][~batch.c_mask] == 0).all()
    if not no_answer:  # v1.1: no probability on the no-answer position
        assert (start.exp()[:, 0] == 0).all()


def test_its_runs_side_by_side_load_back_as_one_model_of_that_many_seeds() -> None:
    members = runs("bidaf", False, 2)
    payloads = [model_payload("bidaf", CFG, inputs(), m.state_dict(), "v" * 64)
                for m in members]
    saved = side_by_side(payloads)
    assert saved["model_config"]["seeds"] == 2
    model, _ = model_from_payload(saved, "bidaf", "v" * 64, CFG.model_copy(update={"seeds": 2}))
    assert isinstance(model, SeedMean) and len(model.replicas) == 2
    for got, want in zip(model.replicas, members, strict=True):
        for (name, a), b in zip(got.state_dict().items(), want.state_dict().values(),
                                strict=True):
            assert torch.equal(a, b), name
    # the params' seeds is architecture: a model of 2 runs is not the model of 1
    with pytest.raises(PayloadMismatch, match="2 in the file, 1 in models.bidaf") as e:
        model_from_payload(saved, "bidaf", "v" * 64, CFG)
    assert e.value.field == "model_config.seeds"
    # and its weights count against limits.parameters, every run's
    one = sum(t.numel() for t in members[0].state_dict().values())
    with pytest.raises(Unbuildable, match="limits.parameters"):
        model_from_payload(saved, "bidaf", "v" * 64, max_parameters=2 * one - 1)
    model_from_payload(saved, "bidaf", "v" * 64, max_parameters=2 * one)


def test_explain_shows_the_first_runs_attention_beside_the_means_answer() -> None:
    from rcpipe.render.attention_pass import attention_maps

    members, batch = runs("bidaf", False, 2), make_batch(b=1)
    maps, log_p1, _ = attention_maps(SeedMean(members), "bidaf", batch)
    first, own_p1, _ = attention_maps(members[0], "bidaf", batch)
    assert [m.spec for m in maps] == [m.spec for m in first] and maps
    for got, want in zip(maps, first, strict=True):
        assert (got.weights == want.weights).all()
    assert not torch.allclose(log_p1, own_p1)  # the answer is the mean's, not the first's
