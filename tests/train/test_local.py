"""Training in one plain process (train/local.py): the Worker every Ray Train rank runs, at
world size 1, on a box with no Ray, spaCy or Prefect."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rcpipe.config import VARIANTS, load_config
from rcpipe.train.local import train_local
from tests.conftest import TINY_MODEL, Prepared
from tests.inference.readers import UnsureReader
from tests.planned_reads import planned_reads

ROOT = Path(__file__).resolve().parents[2]


def paper_overrides(prepared: Prepared, steps: int, device: str = "cpu") -> list[str]:
    """params.yaml as shipped, but for the data, the device, the workers and the steps, and
    a batch of 16: train.buckets keeps full batches only, and the synthetic split's 36
    questions make one batch of 32 an epoch but two of 16 (so 2 steps are one epoch)."""
    data = prepared.data
    return [f"data.train_file={data.train}", f"data.dev_file={data.dev}",
            f"data.out_dir={prepared.out_dir}", f"data.cache_dir={prepared.out_dir}/cache",
            "data.word_vectors=null", f"train.device={device}", "train.num_workers=1",
            f"train.max_steps={steps}", "train.batch_size=16"]


@pytest.mark.trains
@pytest.mark.slow
def test_every_variant_trains_from_params_yaml_without_ray_spacy_or_prefect(
        prepared: Prepared, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import json, sys
        for name in ("ray", "spacy", "prefect", "dvc"):
            sys.modules[name] = None  # importing any of them now fails
        from rcpipe.config import load_config
        from rcpipe.train.local import train_local
        cfg = load_config({str(ROOT / "params.yaml")!r}, {paper_overrides(prepared, 2)!r})
        for v in {list(VARIANTS)!r}:
            s = train_local(cfg, v, __import__("pathlib").Path({str(tmp_path)!r}) / v)
            print(json.dumps({{k: s[k] for k in ("variant", "steps", "device", "world_size")}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = [json.loads(line) for line in out.stdout.splitlines()]
    assert [s["variant"] for s in summaries] == list(VARIANTS)
    assert all(s["steps"] == 2 and s["device"] == "cpu" and s["world_size"] == 1
               for s in summaries)
    for v in VARIANTS:
        assert (tmp_path / v / "model.pt").is_file() and (tmp_path / v / "summary.json").is_file()
        assert len(list((tmp_path / v).glob("step-*"))) == 1
    # qanet once could not start from params.yaml (hidden 75 with 8 heads): the paper's now
    saved = torch.load(tmp_path / "qanet" / "model.pt", weights_only=True)
    assert saved["model_config"]["hidden"] == 128 and saved["model_config"]["heads"] == 8


@pytest.mark.trains
def test_a_local_run_resumes_from_its_latest_checkpoint_and_keeps_the_best(
        prepared: Prepared, tmp_path: Path) -> None:
    base = [f"data.out_dir={prepared.out_dir}", f"data.train_file={prepared.data.train}",
            f"data.dev_file={prepared.data.dev}", "train.batch_size=8", "train.eval_every=1",
            "train.keep_checkpoints=1", *(f"models.bidaf.{k}={v}" for k, v in TINY_MODEL.items())]
    params = prepared.cfg.source
    first = train_local(load_config(params, [*base, "train.max_steps=2"]), "bidaf", tmp_path)
    assert first["steps"] == 2 and first["resumed_from_step"] == 0
    again = train_local(load_config(params, [*base, "train.max_steps=4"]), "bidaf", tmp_path)
    assert again["steps"] == 4 and again["resumed_from_step"] == 2
    assert [h["step"] for h in again["history"]] == [1, 2, 3, 4]
    # its data stream went on at step 3: the rows of steps 1-4, each once (data/stream.py)
    assert again["reads"] == planned_reads(prepared.out_dir, 8, 42, 1, 4)
    kept = sorted(d.name for d in tmp_path.glob("step-*"))
    # ranked on the held-out articles, not on dev
    assert again["ranked_on"] == "heldout" and all("heldout_f1" in h for h in again["history"])
    best = max(again["history"], key=lambda h: h["heldout_f1"])["step"]
    assert kept == sorted({f"step-{best:08d}", "step-00000004"})  # the best and the latest
    assert again["best_heldout_f1"] == max(h["heldout_f1"] for h in again["history"])


@pytest.mark.trains
def test_a_run_resumed_from_an_epochs_last_step_does_not_save_that_step_again(
        prepared: Prepared, tmp_path: Path) -> None:
    """A checkpoint at an epoch's last step is written once; resumed from it, the run must
    not write it again at that epoch's end (a NaN loss, and two records of one folder that
    Ray Train then prunes from under itself)."""
    base = [f"data.out_dir={prepared.out_dir}", f"data.train_file={prepared.data.train}",
            f"data.dev_file={prepared.data.dev}", "train.batch_size=64", "train.eval_every=1",
            *(f"models.bidaf.{k}={v}" for k, v in TINY_MODEL.items())]
    params = prepared.cfg.source
    first = train_local(load_config(params, [*base, "train.epochs=1"]), "bidaf", tmp_path)
    end = first["steps"]  # the epoch's last step, checkpointed by eval_every and the epoch end
    again = train_local(load_config(params, [*base, "train.epochs=2",
                                             f"train.max_steps={end + 1}"]), "bidaf", tmp_path)
    steps = [h["step"] for h in again["history"]]
    assert again["resumed_from_step"] == end and steps == [*range(1, end + 2)]
    # the whole first epoch, each row once, then the second epoch's first batch
    assert again["reads"] == planned_reads(prepared.out_dir, 64, 42, 1, end + 1)
    assert again["reads"][0][0] == first["reads"][0][0] and first["reads"][0][0][0] > 64 * (end - 1)
    assert all(h["loss"] == h["loss"] for h in again["history"])  # no NaN


def test_one_process_trains_alone(prepared: Prepared, tmp_path: Path) -> None:
    from rcpipe.errors import InputError

    cfg = load_config(prepared.cfg.source, [f"data.out_dir={prepared.out_dir}",
                                            "train.num_workers=2"])
    with pytest.raises(InputError) as err:
        train_local(cfg, "bidaf", tmp_path)
    assert err.value.location == "train.num_workers"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_trains_under_bf16_on_cuda(prepared: Prepared, tmp_path: Path,
                                                variant: str) -> None:
    cfg = load_config(ROOT / "params.yaml", [*paper_overrides(prepared, 3, "cuda"),
                                             f"models.{variant}.bf16=true"])
    summary = train_local(cfg, variant, tmp_path)
    assert summary["steps"] == 3 and summary["device"].startswith("cuda")
    assert all(h["loss"] == h["loss"] for h in summary["history"])  # not NaN


@pytest.mark.trains
def test_early_stopping_ends_a_run_that_stopped_improving(prepared: Prepared,
                                                          tmp_path: Path) -> None:
    base = [f"data.out_dir={prepared.out_dir}", f"data.train_file={prepared.data.train}",
            f"data.dev_file={prepared.data.dev}", "train.batch_size=4", "train.eval_every=1",
            "train.epochs=50", "train.max_steps=60", "train.patience=2",
            "models.bidaf.optim.lr=1e-12",
            *(f"models.bidaf.{k}={v}" for k, v in TINY_MODEL.items())]
    # lr 1e-12 moves no float32 weight: the dev F1 never beats the first evaluation's
    summary = train_local(load_config(prepared.cfg.source, base), "bidaf", tmp_path)
    assert summary["steps"] == 3 and summary["best_step"] == 1


@pytest.mark.trains
def test_the_lr_decays_on_a_plateau_of_dev_f1(prepared: Prepared, tmp_path: Path) -> None:
    base = [f"data.out_dir={prepared.out_dir}", f"data.train_file={prepared.data.train}",
            f"data.dev_file={prepared.data.dev}", "train.batch_size=4", "train.eval_every=1",
            "train.epochs=50", "train.max_steps=4", "models.bidaf.optim.lr=1e-12",
            "models.bidaf.optim.plateau_factor=0.5", "models.bidaf.optim.plateau_patience=1",
            *(f"models.bidaf.{k}={v}" for k, v in TINY_MODEL.items())]
    train_local(load_config(prepared.cfg.source, base), "bidaf", tmp_path)
    state = torch.load(tmp_path / "step-00000004" / "state.pt", weights_only=True)
    # evaluations 2, 3 and 4 each found no better F1 than the first's: three halvings
    assert state["scheduler"]["base_lrs"] == [pytest.approx(1e-12 / 8)]


def test_checkpoints_are_ranked_on_the_heldout_questions_not_dev(v2_splits) -> None:  # noqa: ANN001
    from rcpipe.scoring.metrics import headline
    from rcpipe.train.evaluation import scores

    dev, heldout = v2_splits
    cfg = load_config(ROOT / "params.yaml")
    cpu = torch.device("cpu")
    s = scores(UnsureReader(), dev, heldout, "heldout", cfg, cpu)
    held, _ = headline(s.heldout)
    assert held != headline(s.dev)[1]  # the case: the two sets disagree
    assert s.rank == pytest.approx(held, abs=0.011)  # + 1e-4 * the spans' F1, a tie-break
    assert s.dev["na_threshold_source"] == "heldout"
    alone = scores(UnsureReader(), dev, None, None, cfg, cpu)  # nothing held out: dev
    assert alone.heldout is None and alone.rank == pytest.approx(headline(alone.dev)[1],
                                                                 abs=0.011)


def test_the_command_lays_params_files_over_each_other(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """`python -m rcpipe.train.local V --params A --params B` (bench/accuracy.py --tuned): B
    over A, and a bad key is one line naming the layer that holds it, exit 2."""
    from rcpipe.train import local

    base, layer = tmp_path / "base.yaml", tmp_path / "tuned.yaml"
    base.write_text((ROOT / "params.demo.yaml").read_text())
    layer.write_text("models:\n  bidaf:\n    dropout: 2.0\n")  # out of range
    with pytest.raises(SystemExit) as stop:
        local.main(["bidaf", "--params", str(base), "--params", str(layer)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {layer}: models.bidaf.dropout") and "\n" not in err
