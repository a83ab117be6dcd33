"""`rcpipe explain` on the session's trained tiny models (tests/conftest.py `trained`: bidaf
through Ray Train, qanet at its initial weights) and rnet_mult trained a few steps here."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from html import escape
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rcpipe import cli, stages
from rcpipe.config import Config, load_config
from rcpipe.models import views_of
from tests.conftest import TINY_MODEL, Prepared, Trained, questions_of, write_params

pytestmark = [pytest.mark.integration, pytest.mark.trains]

TRAINED = ("bidaf", "rnet_mult", "qanet")
SHARED = ("bidaf", "qanet")  # the session's `trained` models; rnet_mult is trained here


def _train_tiny(cfg: Config, variant: str, steps: int = 3) -> None:
    """A few optimisation steps in this process, saved as `rcpipe train` saves a model.

    Not through Ray Train (tests/stages/test_train.py covers that): explain only needs a
    model.pt of the variant (any weights give distributions), and a Ray job costs ~20 s.
    """
    import torch

    from rcpipe.cluster.opening import model_inputs
    from rcpipe.data.dataset import SquadDataset, bucket_batches
    from rcpipe.data.prepared import Prepared
    from rcpipe.layout import model_dir
    from rcpipe.models import build_model
    from rcpipe.train.loop import make_optimizer, train_step
    from rcpipe.trained.model_file import model_payload

    torch.manual_seed(0)
    inputs, model_cfg = model_inputs(cfg), cfg.models.of(variant)
    model = build_model(variant, model_cfg, inputs)
    optimizer, scheduler = make_optimizer(model, model_cfg.optim)
    data = SquadDataset.from_parquet(cfg.data.out_dir / "train")
    for indices in bucket_batches(data.context_lengths(), 8, shuffle=True)[:steps]:
        train_step(model, data.collate(indices), optimizer, scheduler, grad_clip=5.0)
    model_dir(variant).mkdir(parents=True)
    torch.save(model_payload(variant, model_cfg, inputs, model.state_dict(),
                             Prepared(cfg.data.out_dir).vocab_digest()),
               model_dir(variant) / "model.pt")


@pytest.fixture(scope="module")
def trained(trained: Trained, prepared: Prepared, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[Config, Path]]:
    """TRAINED under a module cwd: the session's trained bidaf and qanet (copied, on the data
    they were prepared with), rnet_mult trained a few steps on it."""
    assert trained.data == prepared.data  # the questions the tests ask are its dev set's
    root = tmp_path_factory.mktemp("explain")
    params = write_params(
        root / "params.yaml",
        data={"train_file": str(trained.data.train), "dev_file": str(trained.data.dev),
              "out_dir": str(trained.cfg.data.out_dir), "cache_dir": str(root / "cache")},
        models=dict.fromkeys(TRAINED, TINY_MODEL))
    cfg = load_config(params)
    for v in SHARED:
        (root / "models" / v).mkdir(parents=True)
        shutil.copy(trained.root / "models" / v / "model.pt", root / "models" / v)
    before = os.getcwd()
    os.chdir(root)
    try:
        for v in (v for v in TRAINED if v not in SHARED):
            _train_tiny(cfg, v)
        yield cfg, params
    finally:
        os.chdir(before)


def _a_question(prepared: Prepared) -> dict:
    return next(qa for qa in questions_of(prepared.data.dev_doc) if qa["answers"])


def _assert_png(path: Path) -> None:
    with Image.open(path) as im:
        im.verify()
        assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 300


@pytest.mark.parametrize("variant", TRAINED)
def test_explain_writes_the_views_of_one_question(
        variant: str, trained: tuple[Config, Path], prepared: Prepared) -> None:
    cfg, _ = trained
    qa = _a_question(prepared)
    ex, html_path = stages.explain(cfg, variant, qa["id"])
    assert html_path == Path(f"explanations/{variant}-{qa['id']}.html")
    lc, lq = len(ex.passage), len(ex.question_tokens)
    assert ex.question == qa["question"] and ex.gold == [a["text"] for a in qa["answers"]]
    assert [m.spec for m in ex.maps] == list(views_of(variant))
    for m in ex.maps:  # every row a distribution over the real (here: all) positions
        shape = {"question": (lc, lq), "passage": (lc, lc), "passage_weights": (lc,)}
        assert m.weights.shape == shape[m.spec.kind]
        sums = m.weights.sum(axis=-1)
        np.testing.assert_allclose(sums, np.ones_like(sums), atol=1e-6)
        assert (m.weights >= 0).all()
    # the pointers: a softmax over [no answer, tokens]; a v1.1 model never says "no answer"
    for p, na in ((ex.p_start, ex.p_start_na), (ex.p_end, ex.p_end_na)):
        assert p.shape == (lc,) and na == 0.0
        assert p.sum() + na == pytest.approx(1.0, abs=1e-6)
    assert 0 <= ex.start <= ex.end < lc and ex.answer in ex.context

    html = html_path.read_text()
    assert html.startswith("<!doctype html>") and "data:image/png;base64," in html
    assert "http://" not in html and "https://" not in html and "<script" not in html
    for spec in views_of(variant):
        assert escape(spec.note) in html
    assert 'class="answer' in html
    _assert_png(html_path.with_suffix(".png"))


def test_bidaf_shows_q2c_instead_of_self_attention(trained: tuple[Config, Path],
                                                    prepared: Prepared) -> None:
    ex, _ = stages.explain(trained[0], "bidaf", _a_question(prepared)["id"],
                           Path("elsewhere/b.html"))
    assert [m.spec.kind for m in ex.maps] == ["question", "passage_weights"]
    assert ex.of("passage") is None
    assert Path("elsewhere/b.html").is_file() and Path("elsewhere/b.png").is_file()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(list(argv))
    return int(exit_info.value.code or 0), capsys.readouterr().err


def test_cli_explain_and_its_one_line_errors(trained: tuple[Config, Path], prepared: Prepared,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg, params = trained
    qid = _a_question(prepared)["id"]
    code, _ = _cli(capsys, "explain", "--model", "qanet", "--qid", qid, "--params", str(params),
                   "--out", "cli/q.html")
    assert code == 0 and Path("cli/q.html").is_file() and Path("cli/q.png").is_file()

    dev = cfg.data.out_dir / "dev"
    code, err = _cli(capsys, "explain", "--model", "qanet", "--qid", "nope", "--params",
                     str(params))
    assert code == 2
    assert err.strip().splitlines() == [f"error: {dev}: id: no dev question with id 'nope'"]
    code, err = _cli(capsys, "explain", "--model", "rnet", "--qid", qid, "--params", str(params))
    assert code == 2
    assert err.strip().splitlines() == [
        "error: models/rnet/model.pt: no trained model; run `rcpipe train rnet` first"]
    code, err = _cli(capsys, "explain", "--model", "lstm", "--qid", qid, "--params", str(params))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "unknown variant" in err
