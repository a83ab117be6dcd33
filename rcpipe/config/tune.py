"""The ``tune`` section: `rcpipe tune`'s ASHA search and each variant's search space."""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from rcpipe.config.section import VARIANTS, Section
from rcpipe.variants import REGISTRY

# A search space's dimensions (`rcpipe tune`): each key a dotted path under models.<variant>
# (or train.* when it starts with "train."), each value one of these, as Ray Tune samples it
SPACE_KINDS = ("choice", "uniform", "loguniform", "randint")


def space_values(spec: dict[str, Any]) -> list[Any]:
    """The values that bound a dimension: each choice, or a range's two ends (what the
    config check tries, so a bad key or value fails before any trial starts)."""
    kind, arg = next(iter(spec.items()))
    return list(arg) if kind == "choice" else [arg[0], arg[1]]


class VariantSearch(Section):
    """One variant's search: its space, laid over the registry's default space key by key
    (a key set to null leaves that dimension out)."""

    space: dict[str, Any] = Field(default_factory=dict, description="dotted key under "
                                  "models.<variant> (or train.*) -> {choice: [...]} | "
                                  "{uniform: [lo, hi]} | {loguniform: [lo, hi]} | "
                                  "{randint: [lo, hi]}; a choice may be a mapping, laid over "
                                  "that section (optim: {choice: [{name: adam, lr: 0.001}]}),"
                                  " before any deeper key")

    @field_validator("space")
    @classmethod
    def _specs(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, spec in v.items():
            if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in \
                    SPACE_KINDS:
                raise ValueError(f"{key}: expected one of {', '.join(SPACE_KINDS)}: "
                                 "{choice: [a, b]} or {uniform: [lo, hi]}")
            kind, arg = next(iter(spec.items()))
            if kind == "choice":
                if not isinstance(arg, list) or not arg:
                    raise ValueError(f"{key}: choice takes a non-empty list")
                continue
            if not (isinstance(arg, list) and len(arg) == 2 and all(
                    isinstance(a, int | float) and not isinstance(a, bool) for a in arg)
                    and arg[0] < arg[1]):
                raise ValueError(f"{key}: {kind} takes [lo, hi], two numbers, lo < hi")
            if kind == "loguniform" and arg[0] <= 0:
                raise ValueError(f"{key}: loguniform needs lo > 0")
        return v


class _Search(Section):
    """`rcpipe tune`: an ASHA search on Ray Tune, each trial one Ray Train job; a
    ``<variant>`` section per registered variant holds its space."""

    trials: int = Field(8, ge=1, description="settings sampled (Tune's num_samples)")
    seed: int = Field(0, ge=0, description="the random search's seed: the same trials again")
    max_steps: int = Field(0, ge=0, description="a trial's steps at most (ASHA's max_t); "
                           "0: the variant's own step limit (models.<v>.max_steps, else "
                           "train.max_steps)")
    max_minutes: float = Field(0, ge=0, description="a trial's training minutes at most, "
                               "instead of steps (ASHA on the minutes each trial reports): "
                               "settings compared at the time a run will have, a smaller "
                               "model's extra steps counted; 0: a step budget")
    eval_every: int = Field(0, ge=0, description="steps between a trial's scores (ASHA "
                            "decides at them); 0: train.eval_every, else max_steps / 8")
    grace_steps: int = Field(0, ge=0, description="steps every trial gets before ASHA may "
                             "stop it; 0: a quarter of max_steps")
    grace_minutes: float = Field(0, ge=0, description="with max_minutes: the minutes every "
                                 "trial gets before ASHA may stop it; 0: a quarter of them")
    reduction_factor: float = Field(3, gt=1, description="ASHA: 1 / this of the trials "
                                    "at a rung go on to the next")
    cpus_per_trial: float = Field(0, ge=0, description="Ray CPUs of a trial's Train workers "
                                  "together; 0: train.cpus_per_worker x num_workers, else 1 "
                                  "per worker (trials share the machine's CPUs)")
    gpus_per_trial: float = Field(0, ge=0, description="GPUs of a trial, fractions allowed "
                                  "(0.5: two trials a GPU); 0: CPU trials")
    max_concurrent: int = Field(0, ge=0, description="trials at once; 0: as many as the "
                                "cluster's CPUs (GPUs) hold")

    @model_validator(mode="before")
    @classmethod
    def _over_the_defaults(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        merged: dict[str, Any] = dict(data)
        for variant in VARIANTS:
            own = data.get(variant) or {}
            if not isinstance(own, dict):
                continue  # pydantic names the type error
            # a key names a whole dimension: the params' replaces the default's
            space = dict(REGISTRY[variant].space) | (own.get("space") or {})
            merged[variant] = own | {"space": {k: s for k, s in space.items()
                                               if s is not None}}
        return merged

    def of(self, variant: str) -> VariantSearch:
        result: VariantSearch = getattr(self, variant)
        return result

    @model_serializer(mode="wrap")
    def _left_out_stays_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A default dimension the params left out is written as null, so that a dumped
        config (`rcpipe config`, the params a Ray job runs) loads as the same search
        rather than with the default's dimension back."""
        data: dict[str, Any] = handler(self)
        for variant in VARIANTS:
            if "space" in data.get(variant, {}):  # (a dump may leave sections out)
                space = data[variant]["space"]
                data[variant]["space"] = space | {k: None for k in REGISTRY[variant].space
                                                  if k not in space}
        return data


SearchConfig = create_model(
    "SearchConfig", __base__=_Search, __doc__=_Search.__doc__,
    **{v: (VariantSearch, VariantSearch()) for v in VARIANTS})
