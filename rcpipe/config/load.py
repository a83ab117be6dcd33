"""A Config from params files laid over each other and ``--set dotted.key=value`` on top;
its errors located to one line; the effective configuration printed back as YAML."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rcpipe import reads
from rcpipe.config.limits import PARAMS_BYTES, ReadLimits
from rcpipe.config.root import Config
from rcpipe.config.section import merge_over
from rcpipe.errors import InputError

DEFAULTS = "params defaults"  # where a config without a params file says it came from
# the params file a command's errors and records name, when it was handed a copy of another
# (a Ray job runs the submitter's params from a file of the head's own: rcpipe/cluster/jobs_api)
NAMED_AS_ENV = "RCPIPE_PARAMS_NAMED_AS"


def located(e: ValidationError) -> tuple[str, str]:
    """pydantic's first error as one line's (place, what): ``train.lr``, ``Input should be
    greater than 0`` (its own rendering spans lines)."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    what = "unknown key" if err["type"] == "extra_forbidden" else "expected a mapping" \
        if err["type"] in ("model_type", "dict_type") else \
        " ".join(err["msg"].removeprefix("Value error, ").split())
    return where, what


def safe_yaml(text: str, name: str | Path, depth: int = ReadLimits().depth,
              where: str = "") -> Any:
    """YAML ``text`` loaded by safe_load, refused when nested deeper than ``depth``."""
    found = reads.yaml_depth_over(text, depth)
    if found is not None:
        raise InputError(name, where, f"nested over {depth} deep (limits.depth)")
    return yaml.safe_load(text)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as a YAML scalar)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise InputError("--set", item, "expected dotted.key=value")
    if len(key) > 1000 or key.count(".") > ReadLimits().depth:
        raise InputError("--set", item[:80], "the key is nested over "
                         f"{ReadLimits().depth} deep (limits.depth)")
    if any(not part.strip() for part in key.strip().split(".")):
        # `..=1` would lay a value at the key "" (params.yaml then blamed for it)
        raise InputError("--set", key.strip(), "a dotted key with an empty part")
    try:
        value = safe_yaml(raw, "--set", where=key) if raw.strip() else None
    except yaml.YAMLError:
        raise InputError("--set", item, "value is not valid YAML") from None
    return key.strip().split("."), value


def _apply(raw: dict[str, Any], keys: list[str], value: Any, item: str) -> None:
    node = raw
    for k in keys[:-1]:
        child = node.get(k, {})
        if not isinstance(child, dict):
            raise InputError("--set", item, f"{k} is not a section")
        # a copy on the way down: a YAML alias (`qanet: *base`) shares its mapping with the
        # anchor, and the override must change only the section it names
        node[k] = dict(child)
        node = node[k]
    node[keys[-1]] = value


def _read_layer(params: Path) -> dict[str, Any]:
    """One params file as a mapping; a file that cannot be read or parsed is a located error."""
    text = reads.read_text(params, PARAMS_BYTES, "a params file's cap")
    try:
        raw = safe_yaml(text, params) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise InputError(params, where, "not valid YAML") from None
    if not isinstance(raw, dict):
        raise InputError(params, "", "expected a mapping at the top level")
    return raw


def _holds(raw: Any, keys: list[str]) -> bool:
    """Whether the mapping ``raw`` names the dotted key ``keys`` (a search space's own keys
    are dotted: ``tune.bidaf.space.optim.lr`` is ``space: {optim.lr: ...}``)."""
    if not keys:
        return True
    if not isinstance(raw, dict):
        return False
    return any(".".join(keys[:n]) in raw and _holds(raw[".".join(keys[:n])], keys[n:])
               for n in range(1, len(keys) + 1))


Layers = Path | str | Sequence[Path | str]


def load_config(params: Layers | None = "params.yaml", overrides: list[str] | None = None,
                named_as: str | None = None) -> Config:
    """The config of one params file, or of several laid over each other in order (a later
    file's keys win, key by key at any depth, as ``models.<variant>`` over its paper), with
    the ``--set`` values on top. An error names the last file that holds the key at fault.
    ``params`` None: no file, the defaults (data.train_file and data.dev_file, which have
    none, empty): for a command given only package directories, which carry their own.
    ``named_as``: the file its errors and records name instead of the first one read."""
    if params is None:
        files = [Path(DEFAULTS)]
        layers = [(files[0], {"data": {"train_file": "", "dev_file": ""}})]
    else:
        files = [Path(params)] if isinstance(params, str | Path) else [Path(p) for p in params]
        files = files or [Path("params.yaml")]
        layers = [(f, _read_layer(f)) for f in files]
    raw: dict[str, Any] = {}
    for _, layer in layers:
        raw = merge_over(raw, layer)
    set_keys = []
    for item in overrides or []:
        keys, value = parse_override(item)
        _apply(raw, keys, value, item)
        set_keys.append(keys)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        where, what = located(e)
        if not where:  # a check across sections (Config's validators) names its key first
            where, _, what = what.removeprefix("Value error, ").partition(": ")
        at = where.split(".")
        if any(at[:len(k)] == k or k[:len(at)] == at for k in set_keys):
            raise InputError("--set", where, what) from None  # the value at fault is --set's
        held = [f for f, layer in layers if _holds(layer, at)]
        raise InputError((held or files)[-1 if held else 0], where, what) from None
    cfg._source = named_as or str(files[0])
    return cfg


def effective_yaml(cfg: Config, key: str | None = None) -> str:
    """The configuration that will run, as YAML with every key filled in (`rcpipe config`).

    ``key`` (dotted, e.g. ``models.qanet``) prints that section or value alone. The output is
    itself a valid params file: loading it gives the same configuration.
    """
    node: Any = cfg.model_dump(mode="json")
    for part in key.split(".") if key else []:
        if not isinstance(node, dict) or part not in node:
            raise InputError("KEY", key, "unknown key") from None
        node = node[part]
    if not isinstance(node, dict):  # one value: as YAML, without the end-of-document mark
        return yaml.safe_dump(node).removesuffix("...\n")
    return yaml.safe_dump(node, sort_keys=False, default_flow_style=False)

