"""Typed, frozen run configuration: params.yaml plus repeated ``--set dotted.key=value``.

Every section rejects unknown keys, so a typo in params.yaml is an error, not a silent default.
A module per params section (data, synth, train, eval, ensemble, distill, models, tune,
version, serve, limits), Config over them (root), and the loading and printing (load);
every name is here, so callers import from ``rcpipe.config`` alone.
"""

from rcpipe.config.data import DataConfig, Heldout, Limits, Window
from rcpipe.config.distill import DistillConfig
from rcpipe.config.ensemble import EnsembleConfig
from rcpipe.config.eval import EvalConfig
from rcpipe.config.limits import PARAMS_BYTES, ReadLimits
from rcpipe.config.load import (
    DEFAULTS,
    NAMED_AS_ENV,
    Layers,
    effective_yaml,
    load_config,
    located,
    parse_override,
    safe_yaml,
)
from rcpipe.config.models import Arch, ModelConfig, ModelsConfig, OptimConfig
from rcpipe.config.root import Config
from rcpipe.config.section import TRAINED, VARIANTS, Section, lay, merge_over
from rcpipe.config.serve import Autoscaling, ServeConfig
from rcpipe.config.synth import SynthConfig
from rcpipe.config.train import Buckets, TrainConfig
from rcpipe.config.tune import SPACE_KINDS, SearchConfig, VariantSearch, space_values
from rcpipe.config.version import VersionConfig

__all__ = [
    "DEFAULTS", "NAMED_AS_ENV", "PARAMS_BYTES", "SPACE_KINDS", "TRAINED", "VARIANTS", "Arch",
    "Autoscaling", "Buckets",
    "Config", "DataConfig", "DistillConfig", "EnsembleConfig", "EvalConfig", "Heldout",
    "Layers", "Limits", "ModelConfig",
    "ModelsConfig", "OptimConfig", "ReadLimits", "SearchConfig", "Section", "ServeConfig",
    "SynthConfig", "TrainConfig", "VariantSearch", "VersionConfig", "Window", "effective_yaml",
    "lay", "load_config", "located", "merge_over", "parse_override", "safe_yaml",
    "space_values",
]
