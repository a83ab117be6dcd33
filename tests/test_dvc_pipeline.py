"""dvc.yaml, checked offline against the stage table it is made from
(rcpipe/pipeline/stages.py), against DVC itself and against the code it runs.

The checked-in file is what the table makes; DVC's own schema (dvc/schema.py) and DVC's own
resolution of the stages with params.yaml; the stages run in the table's order, each reading
what an earlier one writes; each stage's code deps cover every rcpipe module its entry module
imports (transitively); each variant's stages track that variant's params only; and the
nightly deployment's overrides touch no tracked key, so `rcpipe version` can record what it
ran.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from rcpipe.config import VARIANTS, load_config
from rcpipe.pipeline import dvc_yaml
from rcpipe.pipeline.code import closure
from rcpipe.pipeline.stages import STAGES
from rcpipe.pipeline.stages import stage as table_row
from rcpipe.release.rules import untracked_overrides
from tests.conftest import SynthData

REPO = Path(__file__).resolve().parents[1]
DVC_YAML = REPO / "dvc.yaml"


@pytest.fixture(scope="module")
def stages() -> dict[str, Any]:
    """DVC's own resolution of dvc.yaml with params.yaml: address -> Stage."""
    from dvc.repo import Repo

    with Repo(str(REPO)) as repo:
        return {stage.addressing: stage for stage in repo.index.stages}


def test_dvc_yaml_is_the_one_the_table_makes() -> None:
    """A hand edit (or a table change without regenerating) fails here."""
    assert DVC_YAML.read_text() == dvc_yaml.render(), \
        "dvc.yaml is stale: .venv/bin/python -m rcpipe.pipeline.dvc_yaml"


def test_the_stale_check_can_fail(tmp_path: Path) -> None:
    stale = tmp_path / "dvc.yaml"
    stale.write_text(dvc_yaml.render().replace("rcpipe report", "rcpipe report --force"))
    with pytest.raises(SystemExit) as ended:
        dvc_yaml.main(["--check", "--out", str(stale)])
    assert ended.value.code == 1


def test_a_pipeline_of_some_variants_is_the_same_rows_with_fewer_names() -> None:
    """`--variants bidaf,qanet` (a workspace that trains two: tests/integration/test_nights.py
    runs one): every line of it is one of the whole pipeline's, the ensemble and the report
    read those two alone, and its plots draw those two alone."""
    from dvc.schema import COMPILED_MULTI_STAGE_SCHEMA

    two = dvc_yaml.render(dvc_yaml.pipeline_variants("qanet, bidaf"))  # the registry's order
    assert set(two.splitlines()) <= set(dvc_yaml.render().splitlines())
    doc = yaml.safe_load(two)
    COMPILED_MULTI_STAGE_SCHEMA(doc)
    assert doc["stages"]["train"]["foreach"] == doc["stages"]["evaluate"]["foreach"] == \
        ["bidaf", "qanet"]
    # the ensemble reads the two; the report those, the ensemble and the student
    models = {"bidaf", "qanet", "ensemble", "student"}
    for name, reads in (("ensemble", {"bidaf", "qanet"}), ("report", models)):
        read = {Path(d).name.split(".")[0] for d in doc["stages"][name]["deps"]
                if d.startswith(("predictions/", "metrics/"))}
        assert read == reads, (name, read)
    drawn = {Path(f).name.split(".")[0] if "by_type" in f else Path(f).parts[1]
             for p in doc["plots"] if isinstance(p, dict)
             for f, y in next(iter(p.values()))["y"].items() if not f.endswith(".csv")}
    assert drawn == models


@pytest.mark.parametrize("names, what", [
    ("bidaf,bert", "unknown variant(s) bert; choose from bidaf, "),
    ("qanet", "two or more variants: the ensemble stage combines them")])
def test_a_pipeline_of_unknown_or_one_variant_is_one_line(
        names: str, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        dvc_yaml.main(["--variants", names, "--out", str(tmp_path / "dvc.yaml")])
    assert ended.value.code == 2 and not (tmp_path / "dvc.yaml").exists()
    err = capsys.readouterr().err
    assert err.startswith(f"error: --variants: {names}: {what}") and err.count("\n") == 1


def test_dvc_yaml_matches_dvcs_schema() -> None:
    from dvc.schema import COMPILED_MULTI_STAGE_SCHEMA

    COMPILED_MULTI_STAGE_SCHEMA(yaml.safe_load(DVC_YAML.read_text()))


def test_the_schema_check_can_fail() -> None:
    import voluptuous
    from dvc.schema import COMPILED_MULTI_STAGE_SCHEMA

    broken = copy.deepcopy(yaml.safe_load(DVC_YAML.read_text()))
    broken["stages"]["prepare"]["dep"] = broken["stages"]["prepare"].pop("deps")
    with pytest.raises(voluptuous.Invalid):
        COMPILED_MULTI_STAGE_SCHEMA(broken)


def test_the_pipeline_runs_rcpipe_in_order(stages: dict[str, Any]) -> None:
    """DVC resolves the table's stages, each an rcpipe command, each reading what the one
    before it in the table writes."""
    expected = [f"{s.name}@{v}" if s.per_variant else s.name for s in STAGES
                for v in (VARIANTS if s.per_variant else [""])]
    assert sorted(stages) == sorted(expected)
    from rcpipe.cli import app

    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    for address, st in stages.items():
        program, command, *args = st.cmd.split()
        assert program == "rcpipe" and command in commands, st.cmd
        assert command == address.partition("@")[0]
    outs = {str(o.def_path): a.partition("@")[0] for a, s in stages.items() for o in s.outs}
    names = [s.name for s in STAGES]
    for address, st in stages.items():  # each reads what earlier stages write, and some
        here = names.index(address.partition("@")[0])
        read = {outs[str(d.def_path)] for d in st.deps if str(d.def_path) in outs}
        assert here == 0 or read, (address, read)
        assert all(names.index(r) < here for r in read), (address, read)
    for variant in VARIANTS:
        assert f"predictions/{variant}.nbest.json" in \
            {str(d.def_path) for d in stages["ensemble"].deps}
    report_deps = {str(d.def_path) for d in stages["report"].deps}
    # the report reads every model's answers, the student's beside the ensemble's
    for model in (*VARIANTS, "ensemble", "student"):
        assert {f"predictions/{model}.json", f"metrics/{model}.json"} <= report_deps
    assert stages["fetch"].outs[0].persist


def test_every_tracked_key_is_in_params_yaml_and_rcpipes_config(stages: dict[str, Any]
                                                                  ) -> None:
    from dvc.dependency.param import ParamsDependency

    from tests.dvc_project import tiny_params

    load_config(REPO / "params.yaml")
    # params.yaml, and the tests' projects' params (DVC refuses a tracked key it lacks)
    for params in (yaml.safe_load((REPO / "params.yaml").read_text()), tiny_params("0")):
        for address, stage in stages.items():
            for dep in stage.deps:
                if isinstance(dep, ParamsDependency):
                    for key in dep.params:
                        node = params
                        for part in key.split("."):
                            assert isinstance(node, dict) and part in node, \
                                f"{address}: {key}"
                            node = node[part]


def _tracked(stages: dict[str, Any]) -> dict[str, list[str]]:
    from dvc.dependency.param import ParamsDependency

    return {a: [k for d in s.deps if isinstance(d, ParamsDependency) for k in d.params]
            for a, s in stages.items()}


def test_a_variants_stages_track_its_own_model_params_only(stages: dict[str, Any]) -> None:
    tracked = _tracked(stages)
    for address, keys in tracked.items():
        models = {k for k in keys if k.startswith("models.")}
        variant = address.partition("@")[2]
        assert models == ({f"models.{variant}"} if variant else set()), address


def test_the_nightly_deployment_can_be_versioned(stages: dict[str, Any]) -> None:
    """Its --set overrides (and ray_address, storage_path) leave dvc.lock truthful."""
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    nightly = next(d for d in deployments if d["name"] == "nightly")["parameters"]
    sets = list(nightly.get("overrides", []))
    sets += [f"train.ray_address={nightly['ray_address']}",
             f"train.storage_path={nightly['storage_path']}"]
    assert untracked_overrides(sets, _tracked(stages)) == []
    assert nightly["params"] == "params.yaml"  # the file dvc.yaml records
    assert nightly.get("version") is True


def test_code_deps_cover_exactly_the_code_each_stage_runs(stages: dict[str, Any]) -> None:
    for address, stage in stages.items():
        code = {str(d.def_path) for d in stage.deps if str(d.def_path).startswith("rcpipe/")}
        needed = closure(table_row(address.partition("@")[0]).entry)
        covered = {f for f in needed if any(f == c or f.startswith(c + "/") for c in code)}
        assert covered == needed, f"{address}: missing code deps {sorted(needed - covered)}"
        unused = {c for c in code if not any(f == c or f.startswith(c + "/") for f in needed)}
        assert not unused, f"{address}: code deps it never imports {sorted(unused)}"


def test_metrics_and_plots_are_declared(stages: dict[str, Any]) -> None:
    doc = yaml.safe_load(DVC_YAML.read_text())
    metrics = {str(o.def_path) for s in stages.values() for o in s.outs if o.metric}
    written = {str(o.def_path) for s in stages.values() for o in s.outs}
    # each model's scores are the metrics (`dvc metrics show`: EM/F1, one row a model); the
    # by-type breakdown is an output beside them, drawn by the plots below
    models = (*VARIANTS, "ensemble", "student")  # the student: distill evaluates it
    assert metrics == {f"metrics/{m}.json" for m in models}
    assert {f"metrics/{m}.by_type.json" for m in models} <= written - metrics
    assert "metrics/ensemble.methods.json" in written - metrics  # every method, the weights
    data_plots = [p for p in doc["plots"] if isinstance(p, dict)]
    files = {f for plot in data_plots for spec in plot.values() for f in spec["y"]}
    images = {p for p in doc["plots"] if isinstance(p, str)}
    # the dev curve as training writes it (rcpipe/train/progress.py's dvclive files)
    assert {f"models/{v}/live/plots/metrics/{m}.tsv" for v in VARIANTS
            for m in ("dev/f1", "dev/em", "train/loss")} <= files
    assert {f"reports/by_type/{m}.json" for m in models} <= files
    assert {"reports/f1_by_answer_length.csv", "reports/f1_by_context_length.csv"} <= files
    assert {"reports/scores.png", "reports/agreement.png"} <= images
    for plot in data_plots:  # a CSV plot draws one line per model: every column declared
        for f, columns in next(iter(plot.values()))["y"].items():
            if f.endswith(".csv"):
                assert columns == list(models), f
    outs = {str(o.def_path) for s in stages.values() for o in s.outs}
    for f in files | images:  # every plotted file is some stage's output
        assert f in outs or any(f.startswith(o + "/") for o in outs), f


def test_the_report_writes_every_file_the_plots_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synth_v1: SynthData) -> None:
    """dvc.yaml's report plots against what `rcpipe report` really writes (v1.1)."""
    import json

    from rcpipe import stages as rc_stages

    dev = json.loads(synth_v1.dev.read_text())
    qids = [qa["id"] for a in dev["data"] for p in a["paragraphs"] for qa in p["qas"]]
    monkeypatch.chdir(tmp_path)
    for model in (*VARIANTS, "ensemble", "student"):
        answers = {q: "" for q in qids}
        Path("predictions").mkdir(exist_ok=True)
        Path("metrics").mkdir(exist_ok=True)
        Path(f"predictions/{model}.json").write_text(json.dumps(answers))
        Path(f"metrics/{model}.json").write_text(json.dumps({"exact_match": 0.0, "f1": 0.0}))
    cfg = load_config(REPO / "params.yaml", [f"data.dev_file={synth_v1.dev}",
                                             f"data.cache_dir={tmp_path / 'cache'}"])
    rc_stages.report(cfg)
    doc = yaml.safe_load(DVC_YAML.read_text())
    for plot in doc["plots"]:
        for f in [plot] if isinstance(plot, str) else next(iter(plot.values()))["y"]:
            if f.startswith("reports/"):
                assert Path(f).is_file(), f


def test_a_pipeline_without_a_student_has_no_distill_stage() -> None:
    """params whose distill.student is null: `dvc_yaml --no-student` leaves the stage out,
    and every other row is the full pipeline's."""
    full, none = dvc_yaml.render(), dvc_yaml.render(student=False)
    assert "rcpipe distill" in full and "rcpipe distill" not in none
    # every other line is the full pipeline's, but the header's order of the stages
    assert {line for line in none.splitlines() if " -> " not in line} <= set(full.splitlines())
