"""The variants are named alike everywhere a list of them lives, and a new one needs three
places: its family module, its registry entry with its paper's settings, its test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest
import yaml

from rcpipe.config import VARIANTS, ModelConfig, ModelsConfig
from rcpipe.models import builder_of, views_of
from rcpipe.models.views import ViewSpec
from rcpipe.variants import REGISTRY, Variant, register
from tests.conftest import Prepared, questions_of

ROOT = Path(__file__).resolve().parents[1]


def test_every_list_of_variants_is_the_registry() -> None:
    from flows.train_all import Variant as FlowVariant

    names = tuple(REGISTRY)
    assert VARIANTS == names
    assert tuple(ModelsConfig.model_fields) == names  # the params sections
    assert typing.get_args(FlowVariant) == names  # the flow's parameter type
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in ("train", "evaluate"):
        assert stages[stage]["foreach"] == list(names)
    for name in names:
        assert callable(builder_of(name))
        views = views_of(name)  # the attention views of `rcpipe explain`, beside the family
        assert views and all(isinstance(v, ViewSpec) for v in views)
        ModelConfig.model_validate(REGISTRY[name].paper)  # the paper names real keys


def test_a_variant_registers_before_the_config_is_built() -> None:
    late = Variant("late", "rcpipe.models.bidaf", "build_bidaf", {})
    try:
        register(late)
    except RuntimeError as e:
        assert "before rcpipe.config is imported" in str(e)
    else:
        raise AssertionError("registered after the config was built")
    assert "late" not in REGISTRY


# The worked example of docs/architecture.md: tests/models/attentive_reader.py is the family
# module; this entry is its registry line; a fresh interpreter trains, evaluates and explains
# it with nothing else changed.
EXAMPLE = """
    from rcpipe.variants import Variant, register
    register(Variant("attentive_reader", "tests.models.attentive_reader",
                     "build_attentive_reader",
                     paper={{"hidden": 128, "layers": 3, "dropout": 0.3}}))  # Chen et al. 2017

    import json
    from pathlib import Path
    from rcpipe import cli
    from rcpipe.config import load_config
    from rcpipe.train.local import train_local
    sets = {sets!r}
    cfg = load_config("params.yaml", sets)
    print(json.dumps(cfg.models.attentive_reader.model_dump()))
    train_local(cfg, "attentive_reader", Path("models/attentive_reader"))
    for command in (["evaluate", "attentive_reader"],
                    ["explain", "--model", "attentive_reader", "--qid", {qid!r}]):
        try:
            cli.main([*command, *(a for s in sets for a in ("--set", s))])
        except SystemExit as done:
            assert done.code == 0, command
"""


@pytest.mark.trains
def test_a_sixth_variant_needs_its_module_its_entry_and_its_test(
        prepared: Prepared, tmp_path: Path) -> None:
    (tmp_path / "params.yaml").write_text(Path(prepared.cfg.source).read_text())
    sets = [f"data.out_dir={prepared.out_dir}", "train.max_steps=3", "train.batch_size=8",
            "train.num_workers=1", "models.attentive_reader.hidden=8",
            "models.attentive_reader.layers=1"]
    qid = questions_of(json.loads(prepared.data.dev.read_text()))[0]["id"]
    script = textwrap.dedent(EXAMPLE.format(sets=sets, qid=qid))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    settings = json.loads(out.stdout.splitlines()[0])
    assert (settings["hidden"], settings["layers"], settings["dropout"]) == (8, 1, 0.3)
    metrics = json.loads((tmp_path / "metrics" / "attentive_reader.json").read_text())
    assert 0 <= metrics["f1"] <= 100
    assert (tmp_path / "predictions" / "attentive_reader.json").is_file()
    page = (tmp_path / "explanations" / f"attentive_reader-{qid}.html").read_text()
    assert "aligned question embedding" in page

