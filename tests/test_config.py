"""Typed, frozen config: params file + repeated --set; every mistake is a located InputError."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from rcpipe.config import Config, effective_yaml, load_config, parse_override
from rcpipe.errors import InputError
from tests.conftest import write_params


def _minimal(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "params.yaml"
    path.write_text("data:\n  train_file: t.json\n  dev_file: d.json\n" + extra)
    return path


def _error(params: Path | list[Path], sets: list[str] | None = None) -> InputError:
    with pytest.raises(InputError) as info:
        load_config(params, sets)
    return info.value


def test_defaults(tmp_path: Path) -> None:
    cfg = load_config(_minimal(tmp_path))
    assert cfg.data.train_file == "t.json" and cfg.data.dev_file == "d.json"
    assert cfg.data.out_dir == Path("data/prepared")
    assert cfg.data.cache_dir == Path("data/cache")
    assert cfg.data.word_vectors is None
    assert cfg.data.workers == 2
    assert (cfg.data.limits.para, cfg.data.limits.question, cfg.data.limits.answer,
            cfg.data.limits.char) == (400, 50, 30, 16)
    assert cfg.synth.version == "1.1" and cfg.synth.seed == 13
    assert cfg.train.num_workers == 1 and cfg.train.epochs == 1
    assert cfg.train.device == "auto"
    assert cfg.eval.max_answer_len == 15 and cfg.eval.na_threshold is None


def test_relative_paths_stay_relative(tmp_path: Path) -> None:
    # they resolve against the current directory when used, not against the params file
    cfg = load_config(_minimal(tmp_path, "  out_dir: out/here\n"))
    assert cfg.data.out_dir == Path("out/here") and not cfg.data.out_dir.is_absolute()


def test_params_file_values(tmp_path: Path) -> None:
    params = write_params(tmp_path / "p.yaml", train={"epochs": 7}, eval={"na_threshold": 0.4})
    cfg = load_config(params)
    assert cfg.train.epochs == 7 and cfg.train.batch_size == 8
    assert cfg.eval.na_threshold == pytest.approx(0.4)
    assert cfg.data.workers == 1 and cfg.synth.train_articles == 4


def test_repeated_set_overrides_file(tmp_path: Path) -> None:
    params = write_params(tmp_path / "p.yaml", data={"word_vectors": "glove.txt"})
    cfg = load_config(params, [
        "train.epochs=5",  # int
        "synth.unanswerable_fraction=0.25",  # float
        "data.word_vectors=null",  # null
        "data.train_file=other.json",  # plain string
        "train.device='cuda'",  # quoted string
        "eval.na_threshold=0.5",
        "data.limits.para=123",  # nested section
        "train.epochs=6",  # the last --set of a key wins
    ])
    assert cfg.train.epochs == 6
    assert cfg.synth.unanswerable_fraction == pytest.approx(0.25)
    assert cfg.data.word_vectors is None
    assert cfg.data.train_file == "other.json"
    assert cfg.train.device == "cuda"
    assert cfg.eval.na_threshold == pytest.approx(0.5)
    assert cfg.data.limits.para == 123 and cfg.data.limits.question == 50


def test_set_creates_a_missing_section(tmp_path: Path) -> None:
    cfg = load_config(_minimal(tmp_path), ["eval.max_answer_len=7", "synth.version=2.0"])
    assert cfg.eval.max_answer_len == 7 and cfg.synth.version == "2.0"


def test_set_empty_value_is_null(tmp_path: Path) -> None:
    cfg = load_config(_minimal(tmp_path, "  word_vectors: g.txt\n"), ["data.word_vectors="])
    assert cfg.data.word_vectors is None


@pytest.mark.parametrize(
    ("item", "keys", "value"),
    [
        ("a.b=3", ["a", "b"], 3),
        ("a=-2.5", ["a"], -2.5),
        ("a.b=1e3", ["a", "b"], "1e3"),  # YAML 1.1: no dot, so a string
        ("a=null", ["a"], None),
        ("a=~", ["a"], None),
        ("a=true", ["a"], True),
        ("a=False", ["a"], False),
        ("a=hello world", ["a"], "hello world"),
        ("a='3'", ["a"], "3"),
        ("a=x=y", ["a"], "x=y"),  # only the first '=' splits
        (" a.b = 4", ["a", "b"], 4),
    ],
)
def test_parse_override_yaml_scalars(item: str, keys: list[str], value: object) -> None:
    assert parse_override(item) == (keys, value)


def test_set_bool_into_a_string_field_is_rejected(tmp_path: Path) -> None:
    err = _error(_minimal(tmp_path), ["data.train_file=true"])
    assert err.location == "data.train_file"


@pytest.mark.parametrize(
    ("extra", "sets", "location"),
    [
        ("", ["bogus=1"], "bogus"),
        ("", ["data.bogus=1"], "data.bogus"),
        ("", ["data.limits.nope=3"], "data.limits.nope"),
        ("", ["train.epoch=3"], "train.epoch"),
        ("bogus: 1\n", [], "bogus"),
        ("  limits:\n    paragraph: 3\n", [], "data.limits.paragraph"),
        ("eval:\n  max_answer_length: 9\n", [], "eval.max_answer_length"),
    ],
)
def test_unknown_key_is_named(tmp_path: Path, extra: str, sets: list[str], location: str) -> None:
    params = _minimal(tmp_path, extra)
    err = _error(params, sets)
    blamed = "--set" if sets else str(params)  # a --set key is --set's mistake
    assert err.file == blamed
    assert err.location == location
    assert err.what == "unknown key"
    assert err.line() == f"error: {blamed}: {location}: unknown key"


@pytest.mark.parametrize(
    ("sets", "location"),
    [
        (["train.epochs=abc"], "train.epochs"),
        (["train.epochs=2.5"], "train.epochs"),
        (["data.workers=0"], "data.workers"),  # constraint: at least 1
        (["data.limits.para=-1"], "data.limits.para"),
        (["synth.version=3.0"], "synth.version"),
        (["synth.unanswerable_fraction=1.0"], "synth.unanswerable_fraction"),
        (["train.device=gpu"], "train.device"),
        (["data.train_file=123"], "data.train_file"),
        (["data.dev_file=null"], "data.dev_file"),
        (["data.limits=3"], "data.limits"),
        (["train.epochs=true"], "train.epochs"),  # YAML booleans are not numbers
        (["models.bidaf.optim.lr=yes"], "models.bidaf.optim.lr"),
        (["data.limits.para=false"], "data.limits.para"),
        (["models.qanet.optim.ema_decay=true"], "models.qanet.optim.ema_decay"),
    ],
)
def test_bad_type_is_located(tmp_path: Path, sets: list[str], location: str) -> None:
    params = _minimal(tmp_path)
    err = _error(params, sets)
    assert err.file == "--set" and err.location == location and err.what  # --set's value


def test_missing_required_key(tmp_path: Path) -> None:
    params = tmp_path / "p.yaml"
    params.write_text("data:\n  train_file: t.json\n")
    err = _error(params)
    assert err.location == "data.dev_file"


@pytest.mark.parametrize("item", ["train.epochs", "=3", "  =3"])
def test_set_without_key_or_equals(tmp_path: Path, item: str) -> None:
    err = _error(_minimal(tmp_path), [item])
    assert err.file == "--set" and err.location == item
    assert "dotted.key=value" in err.what


def test_set_value_not_yaml(tmp_path: Path) -> None:
    err = _error(_minimal(tmp_path), ["data.train_file=[unclosed"])
    assert err.file == "--set" and err.location == "data.train_file=[unclosed"


def test_set_through_a_scalar(tmp_path: Path) -> None:
    err = _error(_minimal(tmp_path, "  workers: 2\n"), ["data.workers.x=1"])
    assert err.file == "--set" and "workers is not a section" in err.what


def test_missing_params_file(tmp_path: Path) -> None:
    params = tmp_path / "nope.yaml"
    err = _error(params)
    assert err.file == str(params) and err.location == ""
    assert err.line().startswith(f"error: {params}: ")


def test_invalid_yaml_located_by_line(tmp_path: Path) -> None:
    params = tmp_path / "p.yaml"
    params.write_text("data:\n  train_file: t.json\n  dev_file: d.json\n bad: [\n")
    err = _error(params)
    assert err.location == "line 4"
    assert err.what == "not valid YAML"


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    params = tmp_path / "p.yaml"
    params.write_text("- a\n- b\n")
    err = _error(params)
    assert "mapping" in err.what


def test_empty_file_lacks_data(tmp_path: Path) -> None:
    params = tmp_path / "p.yaml"
    params.write_text("# nothing\n")
    assert _error(params).location == "data"


def test_frozen(tmp_path: Path) -> None:
    cfg = load_config(_minimal(tmp_path))
    with pytest.raises(pydantic.ValidationError):
        cfg.train.epochs = 5  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        cfg.data.limits.para = 5  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        cfg.data = cfg.data  # type: ignore[misc]
    assert cfg.train.epochs == 1


@pytest.mark.parametrize(
    ("source", "expected"),
    [("set:2.0", "2.0"), ("set:1.1", "1.1"), ("set:'2.0'", "2.0"), ("file:2.0", "2.0"),
     ("file:1.1", "1.1"), ("file:'1.1'", "1.1")],
)
def test_synth_version_float_or_string(tmp_path: Path, source: str, expected: str) -> None:
    kind, value = source.split(":", 1)
    if kind == "set":
        cfg = load_config(_minimal(tmp_path), [f"synth.version={value}"])
    else:
        cfg = load_config(_minimal(tmp_path, f"synth:\n  version: {value}\n"))
    assert cfg.synth.version == expected


def test_demo_and_full_params_files_load() -> None:
    root = Path(__file__).resolve().parents[1]
    for name in ("params.yaml", "params.demo.yaml"):
        assert isinstance(load_config(root / name), Config)


def test_a_variant_may_have_its_own_time_limit(tmp_path: Path) -> None:
    cfg = load_config(write_params(tmp_path / "p.yaml"),
                      ["train.max_minutes=3", "models.rnet.max_minutes=4.5"])
    assert cfg.models.minutes("rnet", cfg.train.max_minutes) == 4.5
    assert cfg.models.minutes("bidaf", cfg.train.max_minutes) == 3


def test_a_variant_may_have_its_own_step_limit(tmp_path: Path) -> None:
    cfg = load_config(write_params(tmp_path / "p.yaml"),
                      ["train.max_steps=300", "models.rnet.max_steps=450"])
    assert cfg.models.steps("rnet", cfg.train.max_steps) == 450
    assert cfg.models.steps("bidaf", cfg.train.max_steps) == 300


def test_set_changes_only_the_section_it_names_under_yaml_aliases(tmp_path: Path) -> None:
    params = tmp_path / "p.yaml"
    params.write_text("data: {train_file: t.json, dev_file: d.json}\n"
                      "models:\n  bidaf: &small {hidden: 8}\n  qanet: *small\n")
    cfg = load_config(params, ["models.qanet.hidden=16"])
    assert cfg.models.qanet.hidden == 16 and cfg.models.bidaf.hidden == 8


# ------------------------------------------------------------ the papers' presets

ROOT = Path(__file__).resolve().parents[1]
# The papers' settings, written out here independently of rcpipe/variants.py's registry.
BIDAF = {"hidden": 100, "layers": 2, "dropout": 0.2, "char_dim": 8, "char_hidden": 100,
         "char_kernel": 5, "highway_layers": 2,
         "optim": {"name": "adadelta", "lr": 0.5, "ema_decay": 0.999}}
RNET = {"hidden": 75, "layers": 3, "dropout": 0.2, "char_hidden": 75,
        "optim": {"name": "adadelta", "lr": 1.0, "rho": 0.95, "eps": 1e-6, "ema_decay": None}}
PAPER_TABLE = {
    "bidaf": BIDAF, "bidaf_selfattn": BIDAF, "rnet": RNET, "rnet_mult": RNET,
    "qanet": {"hidden": 128, "heads": 8, "emb_convs": 4, "conv_kernel": 7, "model_blocks": 7,
              "model_convs": 2, "model_kernel": 5, "char_dim": 200, "char_hidden": 200,
              "dropout": 0.1, "char_dropout": 0.05, "stochastic_depth": 0.1,
              "optim": {"name": "adam", "beta1": 0.8, "beta2": 0.999, "eps": 1e-7, "lr": 1e-3,
                        "warmup_steps": 1000, "weight_decay": 3e-7, "ema_decay": 0.9999}},
}


def _assert_has(actual: dict, expected: dict, where: str) -> None:
    for k, v in expected.items():
        if isinstance(v, dict):
            _assert_has(actual[k], v, f"{where}.{k}")
        else:
            assert actual[k] == pytest.approx(v), f"{where}.{k}: {actual[k]} != {v}"


@pytest.mark.parametrize("variant", list(PAPER_TABLE))
def test_the_shipped_params_yaml_trains_each_papers_model(variant: str) -> None:
    cfg = load_config(ROOT / "params.yaml")
    _assert_has(cfg.models.of(variant).model_dump(), PAPER_TABLE[variant], f"models.{variant}")


def test_a_partial_section_keeps_the_rest_of_the_paper(tmp_path: Path) -> None:
    params = _minimal(tmp_path, "models:\n  qanet:\n    optim: {lr: 0.3}\n  bidaf:\n"
                      "    hidden: 64\n  rnet:\n")  # `rnet:` alone is an empty (null) section
    cfg = load_config(params, ["models.rnet_mult.optim.rho=0.9"])
    qanet = cfg.models.qanet.model_dump()
    assert qanet["optim"]["lr"] == 0.3
    _assert_has(qanet, {**PAPER_TABLE["qanet"], "optim": {
        **PAPER_TABLE["qanet"]["optim"], "lr": 0.3}}, "models.qanet")
    assert cfg.models.bidaf.hidden == 64
    _assert_has(cfg.models.bidaf.model_dump(), {**BIDAF, "hidden": 64}, "models.bidaf")
    _assert_has(cfg.models.rnet.model_dump(), RNET, "models.rnet")
    assert cfg.models.rnet_mult.optim.rho == 0.9 and cfg.models.rnet_mult.optim.lr == 1.0
    # the papers' tables are shared, never changed by one variant's keys
    assert load_config(_minimal(tmp_path)).models.qanet.optim.lr == 1e-3


def test_a_variant_section_of_the_wrong_type_is_located(tmp_path: Path) -> None:
    err = _error(_minimal(tmp_path, "models:\n  qanet: 3\n"))
    assert err.location == "models.qanet"
    err = _error(_minimal(tmp_path), ["models.qanet.optim.nme=adam"])
    assert err.location == "models.qanet.optim.nme" and err.what == "unknown key"


def test_the_demo_preset_names_what_differs_from_the_papers() -> None:
    cfg = load_config(ROOT / "params.demo.yaml")
    # Adam with its own eps (not Adadelta's 1e-6) and no EMA where the demo had none
    for v in ("bidaf", "bidaf_selfattn", "rnet", "rnet_mult"):
        optim = cfg.models.of(v).optim
        assert (optim.name, optim.eps, optim.ema_decay) == ("adam", 1e-7, None), v
    assert cfg.models.qanet.optim.weight_decay == 0 and cfg.models.qanet.char_dim == 8


def test_rcpipe_config_prints_the_effective_configuration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from rcpipe import cli

    params = write_params(tmp_path / "p.yaml")
    with pytest.raises(SystemExit) as done:
        cli.main(["config", "--params", str(params), "--set", "models.qanet.optim.lr=0.01"])
    assert done.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["models"]["qanet"]["optim"] == {
        **load_config(ROOT / "params.yaml").models.qanet.optim.model_dump(), "lr": 0.01}
    # every key filled in, and itself a params file that loads to the same configuration
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(printed))
    assert load_config(again).model_dump() == load_config(
        params, ["models.qanet.optim.lr=0.01"]).model_dump()
    with pytest.raises(SystemExit):
        cli.main(["config", "models.rnet.hidden", "--params", str(params)])
    assert capsys.readouterr().out == "75\n"


def test_rcpipe_config_with_an_unknown_key_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rcpipe import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["config", "models.nope", "--params", str(write_params(tmp_path / "p.yaml"))])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: KEY: models.nope: unknown key\n"


# ------------------------------------------------------------------ params layers (--params x N)


def test_later_layers_override_earlier_ones_key_by_key(tmp_path: Path) -> None:
    base = _minimal(tmp_path, "train:\n  epochs: 3\n  batch_size: 8\n"
                              "models:\n  bidaf:\n    optim: {lr: 0.3, rho: 0.9}\n")
    layer = tmp_path / "tune.yaml"
    layer.write_text("train:\n  epochs: 5\nmodels:\n  bidaf:\n    optim: {lr: 0.002}\n")
    cfg = load_config([base, layer], ["train.batch_size=4"])
    assert (cfg.train.epochs, cfg.train.batch_size) == (5, 4)  # the layer, then --set
    optim = cfg.models.bidaf.optim
    assert (optim.lr, optim.rho, optim.name) == (0.002, 0.9, "adadelta")  # deep: rho kept
    assert cfg.source == str(base)
    assert load_config([base]).model_dump() == load_config(base).model_dump()


def test_a_layers_mistake_names_that_layer(tmp_path: Path) -> None:
    base = _minimal(tmp_path, "train:\n  epochs: 3\n")
    layer = tmp_path / "tune.yaml"
    layer.write_text("models:\n  bidaf:\n    optim: {lrr: 0.002}\n")
    err = _error([base, layer])
    assert (err.file, err.location) == (str(layer), "models.bidaf.optim.lrr")
    assert err.what == "unknown key"
    layer.write_text("train:\n  epochs: 0\n")
    assert _error([base, layer]).line().startswith(
        f"error: {layer}: train.epochs: ")
    # a key that came from --set is --set's mistake (issue 43: it named the first file)
    layer.write_text("train:\n  epochs: 2\n")
    assert _error([base, layer], ["eval.bogus=1"]).file == "--set"
    layer.write_text("- a list\n")
    assert _error([base, layer]).line() == \
        f"error: {layer}: expected a mapping at the top level"


# ------------------------------------------------------------------ search spaces (rcpipe tune)


def test_a_search_space_lays_the_params_over_the_variants_default(tmp_path: Path) -> None:
    from rcpipe.variants import REGISTRY

    cfg = load_config(_minimal(tmp_path), [
        "tune.bidaf.space={dropout: {choice: [0.1, 0.2]}, hidden: null}"])
    space = cfg.tune.of("bidaf").space
    assert space["dropout"] == {"choice": [0.1, 0.2]} and "hidden" not in space
    assert space["optim"] == REGISTRY["bidaf"].space["optim"]  # the default's other keys
    assert cfg.tune.of("qanet").space == dict(REGISTRY["qanet"].space)
    for variant in REGISTRY:  # every default names the asked-for dimensions
        assert {"dropout", "word_dropout", "optim.ema_decay"} <= set(
            cfg.tune.of(variant).space)


def test_a_left_out_dimension_stays_out_of_the_dumped_config(tmp_path: Path) -> None:
    """The params a Ray job runs (and `rcpipe config` prints) are the dump: loaded again
    they are the same search, not the default's dimension back."""
    cfg = load_config(_minimal(tmp_path), ["tune.bidaf.space={hidden: null}"])
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(effective_yaml(cfg))
    again = load_config(dumped)
    assert "hidden" not in again.tune.of("bidaf").space
    assert again.tune == cfg.tune


@pytest.mark.parametrize(("space", "location", "what"), [
    ("{optim.lrr: {choice: [0.1]}}", "tune.bidaf.space.optim.lrr", "unknown key"),
    ("{train.epochz: {choice: [1]}}", "tune.bidaf.space.train.epochz", "unknown key"),
    ("{dropout: {choice: [1.5]}}", "tune.bidaf.space.dropout", "1.5: Input should be less"),
    ("{optim: {choice: [{name: sgd}]}}", "tune.bidaf.space.optim", "{'name': 'sgd'}: "),
    ("{dropout: {uniform: [0.3, 0.1]}}", "tune.bidaf.space", "dropout: uniform takes"),
    ("{dropout: {normal: [0, 1]}}", "tune.bidaf.space", "dropout: expected one of"),
])
def test_a_bad_search_space_is_one_located_line(tmp_path: Path, space: str, location: str,
                                                what: str) -> None:
    err = _error(_minimal(tmp_path), [f"tune.bidaf.space={space}"])
    assert err.location == location and err.what.startswith(what), err.line()
