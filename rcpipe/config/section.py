"""The base every params section derives from, and the laying of one mapping over another
(a variant's keys over its paper, a params file over the one before, a ``--set`` on top);
flattening a mapping back into the dotted keys ``--set`` takes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import UnionType
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from rcpipe.variants import REGISTRY, STUDENT

# every variant rcpipe knows, in registry order (rcpipe/variants.py)
VARIANTS: tuple[str, ...] = tuple(REGISTRY)
# the names a workspace's trained model goes by (models/<name>/): each variant, and the
# student `rcpipe distill` trains (its network one of the variants: Config.network_of)
TRAINED: tuple[str, ...] = (*VARIANTS, STUDENT)


def _is_number(annotation: object) -> bool:
    """int, float, or an optional one (``float | None``); bool is not a number here."""
    if annotation in (int, float):
        return True
    args = get_args(annotation)
    return isinstance(annotation, UnionType) and any(a in (int, float) for a in args) and \
        all(a in (int, float, type(None)) for a in args)


# the most any number of the params may be: a count, size, step, seed or time of rcpipe
# reaches torch, numpy, Ray or a socket as a C int or a double that must stay exact
# (torch.set_num_threads, numpy's seeds, settimeout); a setting's own bound may be tighter
NUMBER_MAX = 2**31 - 1


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's share), the bound of a
    count of processes or threads (data.workers, the served champion's threads); never
    below 2, the defaults' own, so the shipped params load on a one-CPU machine."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(cpus or 1, 2)


class Section(BaseModel):
    # inf and nan are no setting's value: `serve.timeout_s: .inf` never fires, nan compares
    # false with everything
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: object, info: ValidationInfo) -> object:
        # pydantic's lax mode reads true as 1: `train.epochs: yes` is a typo, not one epoch
        if isinstance(v, bool) and _is_number(cls.model_fields[info.field_name].annotation):
            raise ValueError("expected a number, got a boolean")
        return v

    @field_validator("*", mode="after")
    @classmethod
    def _within_use(cls, v: object) -> object:
        # a number of any size passes Python, then overflows where it is used (a seed of 29
        # digits was `ValueError: Overflow` inside a Ray worker): refused here, in one line
        for x in v if isinstance(v, tuple) else (v,):
            if isinstance(x, int | float) and not isinstance(x, bool) and abs(x) > NUMBER_MAX:
                said = f"{x:,}" if isinstance(x, int) and abs(x) < 10**40 else f"{x:.4g}"
                raise ValueError(f"{said} is out of the range its use takes (at most "
                                 f"{NUMBER_MAX:,} in size)")
        return v


def merge_over(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid on ``base`` key by key, at any depth (a new dict; neither is changed)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_over(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) \
            else v
    return out


def lay(base: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """``value`` set at the dotted key of ``base`` (a mapping value is laid over the section
    there, key by key); a new dict, ``base`` unchanged."""
    keys = dotted.split(".")
    for k in reversed(keys):
        value = {k: value}
    return merge_over(base, value)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: settings as the dotted keys `--set` takes."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat
