"""Issue 43: every numeric setting has the range its use can take, checked when the config
loads (`rcpipe config`), not where it overflows: `--set train.seed=99999999999999999999999999999`
passed `rcpipe config` and ended `train` in `ValueError: Overflow` inside a Ray worker. And a
`--set` value at fault is blamed on `--set`, not on params.yaml."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import UnionType
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from rcpipe import cli
from rcpipe.config import Config, load_config
from rcpipe.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


def _numbers(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, type]]:
    """(dotted key, int or float) of every numeric setting under ``model``."""
    for name, field in model.model_fields.items():
        kinds = get_args(field.annotation) if isinstance(field.annotation, UnionType) \
            else (field.annotation,)
        for kind in kinds:
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                yield from _numbers(kind, f"{prefix}{name}.")
            elif kind in (int, float):
                yield f"{prefix}{name}", kind
                break


def _keys() -> list[tuple[str, type]]:
    found = list(_numbers(Config))
    assert len(found) > 60 and ("train.seed", int) in found  # the walk reaches them all
    return found


def _loaded(key: str, value: str) -> None:
    """``key`` set to ``value`` by --set; inside a section params.yaml leaves null
    (serve.autoscaling), that section set as a mapping holding the key."""
    try:
        load_config(ROOT / "params.yaml", [f"{key}={value}"])
    except InputError as e:
        if not e.what.endswith("is not a section"):
            raise
        parent, _, leaf = key.rpartition(".")
        load_config(ROOT / "params.yaml", [f"{parent}={{{leaf}: {value}}}"])


@pytest.mark.parametrize(("key", "kind"), _keys(), ids=lambda k: str(k))
def test_a_number_past_its_use_is_refused_when_the_config_loads(key: str, kind: Any) -> None:
    for value in ("-99999999999999999999999999999", *([".nan"] if kind is float else [])):
        with pytest.raises(InputError) as e:
            _loaded(key, value)
        assert e.value.file == "--set" and e.value.location == key, e.value.line()
        assert e.value.exit_code == 2


def test_the_audits_seed_is_one_line_at_rcpipe_config(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(["config", "--set", "train.seed=99999999999999999999999999999"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.splitlines() == [
        "error: --set: train.seed: 99,999,999,999,999,999,999,999,999,999 is out of the "
        "range its use takes (at most 2,147,483,647 in size)"], err


def test_a_seed_numpy_refuses_is_refused_too() -> None:
    with pytest.raises(InputError) as e:
        load_config(ROOT / "params.yaml", ["train.seed=-1"])
    assert e.value.line() == ("error: --set: train.seed: Input should be greater than or "
                              "equal to 0")


def test_the_shipped_params_load() -> None:
    for params in ("params.yaml", "params.demo.yaml"):
        load_config(ROOT / params)


@pytest.mark.parametrize(("item", "key"), [("..=1", ".."), (".data=x", ".data"),
                                           ("data..workers=2", "data..workers")])
def test_a_set_key_with_an_empty_part_is_blamed_on_set(
        item: str, key: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 56: it was "params.yaml: unknown key: " (an empty key, the file blamed)
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(["config", "--set", item])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.splitlines() == [f"error: --set: {key}: a dotted key with an empty part"], err


# issue 56: a number within NUMBER_MAX may still be more than the machine can use


@pytest.mark.parametrize(("item", "expected"), [
    ("data.workers=100000", "data.workers: 100,000 tokenizer processes, over the {cpus} CPUs "
     "this machine gives rcpipe"),
    ("synth.train_articles=1000000000", "synth: train_articles 1,000,000,000 makes "
     "5,000,000,000 paragraphs a split, over the bound of 100,000"),
    ("synth.questions_per_paragraph=10000", "synth: train_articles 60 makes 3,000,000 "
     "questions a split, over the bound of 1,000,000"),
    ("synth.facts_per_paragraph=[5, 100000]", "synth.facts_per_paragraph: must be [min, max] "
     "with 1 <= min <= max <= 20"),
], ids=["workers", "train_articles", "questions", "facts"])
def test_a_count_past_what_the_machine_can_use_is_refused(item: str, expected: str) -> None:
    from rcpipe.config.section import usable_cpus

    with pytest.raises(InputError) as e:
        load_config(ROOT / "params.yaml", [item])
    assert e.value.line() == f"error: --set: {expected.format(cpus=usable_cpus())}"


def test_as_many_workers_as_cpus_load() -> None:
    from rcpipe.config.section import usable_cpus

    assert load_config(ROOT / "params.yaml",
                       [f"data.workers={usable_cpus()}"]).data.workers == usable_cpus()


def _no_dvc(tmp_path: Path) -> dict[str, Any]:
    return {"workspace": str(tmp_path), "params": str(ROOT / "params.yaml")}


@pytest.mark.parametrize(("args", "expected"), [
    (lambda t: {"threads": "two"}, "champion_app args: threads: Input should be a valid "
     "integer, unable to parse string as an integer"),
    (lambda t: {"threads": 10**9}, "champion_app args: threads: 1,000,000,000 threads, over "
     "the {cpus} CPUs this machine gives rcpipe"),
    (lambda t: {"threads": 0}, "champion_app args: threads: Input should be greater than or "
     "equal to 1"),
    (lambda t: {"thread": 2}, "champion_app args: thread: unknown key"),
    (lambda t: ["threads"], "champion_app args: expected a mapping"),
    (_no_dvc, "{tmp}: not a DVC workspace (no .dvc): its .dvc/config names the remote; run "
     "there, or `dvc init` and `dvc remote add`"),
], ids=["threads_two", "threads_1e9", "threads_0", "unknown_key", "a_list", "no_dvc"])
def test_the_serve_configs_args_are_checked_as_params_are(
        tmp_path: Path, args: Any, expected: str) -> None:
    from rcpipe.champion.app import champion_app
    from rcpipe.config.section import usable_cpus

    with pytest.raises(InputError) as e:
        champion_app(args(tmp_path))
    assert e.value.line() == "error: " + expected.format(cpus=usable_cpus(), tmp=tmp_path)
    assert e.value.exit_code == 2
