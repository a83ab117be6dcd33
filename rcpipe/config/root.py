"""Config: the whole params tree, a field per section, and the checks that span sections."""

from __future__ import annotations

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from rcpipe.config.data import DataConfig
from rcpipe.config.distill import DistillConfig
from rcpipe.config.ensemble import EnsembleConfig
from rcpipe.config.eval import EvalConfig
from rcpipe.config.limits import ReadLimits
from rcpipe.config.models import ModelConfig, ModelsConfig
from rcpipe.config.section import VARIANTS, Section, lay
from rcpipe.config.serve import ServeConfig
from rcpipe.config.synth import SynthConfig
from rcpipe.config.train import TrainConfig
from rcpipe.config.tune import SearchConfig, space_values
from rcpipe.config.version import VersionConfig


class Config(Section):
    data: DataConfig
    synth: SynthConfig = SynthConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    ensemble: EnsembleConfig = EnsembleConfig()
    distill: DistillConfig = DistillConfig()
    models: ModelsConfig = Field(default_factory=ModelsConfig)
    tune: SearchConfig = Field(default_factory=SearchConfig)
    version: VersionConfig = VersionConfig()
    serve: ServeConfig = ServeConfig()
    limits: ReadLimits = ReadLimits()
    _source: str = PrivateAttr("params")

    @model_validator(mode="after")
    def _buckets_hold_the_limits(self) -> Config:
        b, limits = self.train.buckets, self.data.limits
        if b is not None:
            for name, edges, limit in (("context", b.context, limits.para),
                                       ("question", b.question, limits.question)):
                if edges[-1] < limit:
                    key = "para" if name == "context" else name
                    raise ValueError(f"train.buckets.{name}: the last edge {edges[-1]} is "
                                     f"below data.limits.{key} {limit}, so the longest "
                                     "training batches would fit no bucket")
        return self

    @model_validator(mode="after")
    def _workers_share_each_batch(self) -> Config:
        """Each of train.num_workers streams batch_size // num_workers rows a step
        (data/stream.py): a batch smaller than the workers leaves one without a row."""
        workers = self.train.num_workers
        for variant in VARIANTS:
            size = self.models.of(variant).batch_size or self.train.batch_size
            if size < workers:
                key = f"models.{variant}.batch_size" if self.models.of(variant).batch_size \
                    else "train.batch_size"
                raise ValueError(f"{key}: {size} rows a step cannot be shared by "
                                 f"{workers} workers (train.num_workers)")
        return self

    @model_validator(mode="after")
    def _spaces_name_settings(self) -> Config:
        """Every value a search may try is a valid setting of its key: a misspelt key or
        an out-of-range bound fails now, not in a trial."""
        for variant in VARIANTS:
            own = self.models.of(variant).model_dump()
            train = self.train.model_dump()
            for key, spec in self.tune.of(variant).space.items():
                for value in space_values(spec):
                    section, model, path = ("train", TrainConfig, key[6:]) \
                        if key.startswith("train.") else ("models", ModelConfig, key)
                    try:
                        model.model_validate(lay(own if section == "models" else train,
                                                 path, value))
                    except ValidationError as e:
                        err = e.errors()[0]
                        what = "unknown key" if err["type"] == "extra_forbidden" \
                            else f"{value!r}: {err['msg']}"
                        raise ValueError(f"tune.{variant}.space.{key}: {what}") from None
        return self

    def model_of(self, name: str) -> ModelConfig:
        """The settings of the network model ``name`` is: models.<name> for a variant, and
        for the student (variants.STUDENT) models.<distill.student>."""
        return self.models.of(self.network_of(name))

    def network_of(self, name: str) -> str:
        """The variant model ``name`` is: itself, or distill.student for the student (an
        InputError naming the key when distill.student is null)."""
        from rcpipe.errors import InputError
        from rcpipe.variants import STUDENT

        if name != STUDENT:
            return name
        if self.distill.student is None:
            raise InputError(self.source, "distill.student", "null: there is no student; "
                             "set it to a variant to distill one")
        return self.distill.student

    @property
    def source(self) -> str:
        """The params file this was loaded from, for errors that name a key of it."""
        return self._source
