"""Typed, frozen run configuration: params.yaml plus repeated ``--set dotted.key=value``.

Every section rejects unknown keys, so a typo in params.yaml is an error, not a silent default.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import UnionType
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from rcpipe import reads
from rcpipe.errors import InputError
from rcpipe.variants import REGISTRY

# every variant rcpipe knows, in registry order (rcpipe/variants.py)
VARIANTS: tuple[str, ...] = tuple(REGISTRY)
DEFAULTS = "params defaults"  # where a config without a params file says it came from


def _is_number(annotation: object) -> bool:
    """int, float, or an optional one (``float | None``); bool is not a number here."""
    if annotation in (int, float):
        return True
    args = get_args(annotation)
    return isinstance(annotation, UnionType) and any(a in (int, float) for a in args) and \
        all(a in (int, float, type(None)) for a in args)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: object, info: ValidationInfo) -> object:
        # pydantic's lax mode reads true as 1: `train.epochs: yes` is a typo, not one epoch
        if isinstance(v, bool) and _is_number(cls.model_fields[info.field_name].annotation):
            raise ValueError("expected a number, got a boolean")
        return v


class Limits(Section):
    """Length limits, in tokens, applied to the training split only (dev keeps everything)."""

    para: int = Field(400, gt=0, description="context tokens")
    question: int = Field(50, gt=0, description="question tokens")
    answer: int = Field(30, gt=0, description="answer tokens")
    char: int = Field(16, gt=0, description="characters kept per word")


class Heldout(Section):
    """Training questions held out to choose the v2.0 no-answer threshold and rank
    checkpoints on (never on dev, which reports): a seeded share of the training file's
    articles, never trained on, or a SQuAD file of the user's."""

    fraction: float = Field(0.05, ge=0, lt=1, description="share of the training articles "
                            "held out (at least one when there are two or more); 0: none")
    seed: int = Field(0, description="which articles: the same seed, the same slice")
    file: str | None = Field(None, description="a SQuAD JSON (path, URL, s3://) held out "
                             "instead of a slice: then every training article trains")


class Window(Section):
    """A context longer than a model reads at once is read as overlapping windows.

    Answering (evaluate, predict, serve, explain): windows of ``length`` tokens, ``stride``
    apart, the last one ending at the context's end; each window is answered and the best
    span across them is the answer (README, "Long documents: windows"). Training (prepare):
    a context over data.limits.para is windows of that many tokens, ``train_stride`` apart.
    An answer of k tokens cut by a window's end is whole in the next window when the
    windows share at least 2k - 1 tokens.
    """

    # 1,000: the papers' test-time limit (QANet's code; the old train.dev_para_limit), so
    # no SQuAD paragraph is read differently from before windows
    length: int = Field(1000, gt=0, description="answering: context tokens a model reads "
                        "at once; a longer context is read as windows of this many")
    # half the window: every token but the first and last 250 is read twice, and the
    # window it is answered from has at least 250 tokens of context on each side of it
    stride: int = Field(500, gt=0, description="answering: tokens from one window's start "
                        "to the next's (each shares length - stride with the next)")
    train_stride: int | None = Field(None, gt=0, description="training: tokens from one "
                                     "window's start to the next's in a context over "
                                     "data.limits.para; None: half of data.limits.para")
    max_tokens: int = Field(20_000, gt=0, description="predict and serve refuse a context "
                            "over this many tokens with one error (never a cut): it bounds "
                            "what a request costs (20,000 tokens: 39 windows at 1,000/500)")

    @model_validator(mode="after")
    def _windows_overlap(self) -> Window:
        if self.stride >= self.length:
            raise ValueError(f"stride {self.stride} must be below length {self.length}: "
                             "windows that do not overlap cut answers in two")
        return self


class DataConfig(Section):
    train_file: str = Field(description="SQuAD JSON: path, http(s) URL or s3:// URI; .json(.gz)")
    dev_file: str = Field(description="SQuAD JSON scored by evaluate; never filtered")
    out_dir: Path = Field(Path("data/prepared"), description="Parquet, vocab and report.json")
    cache_dir: Path = Field(Path("data/cache"), description="downloads, keyed by URL")
    word_vectors: str | None = Field(
        None, description="GloVe-format text (.txt/.txt.gz/.zip); None: trainable vectors"
    )
    word_dim: int = Field(300, gt=0, le=8192, description="word vector size (must match "
                          "word_vectors)")
    min_word_count: int = Field(1, ge=1, description="training count a word needs for the vocab")
    # unk by default: the QANet paper's, and the one setting under which the model's
    # trainable OOV vector learns. Each training occurrence of a word the vectors lack
    # trains it, and it is what a dev or served word outside the vocabulary gets, so
    # unknown words look the same in training and at test time. train (BiDAF's code) keeps
    # each such word's identity at the cost of a row per word; fixed is the behaviour
    # before the setting existed (prepared data and models from then match it).
    missing_vectors: Literal["unk", "train", "fixed"] = Field(
        "unk", description="with word_vectors, training words they lack: unk = out of "
        "vocabulary (the trainable OOV vector, QANet); train = a trainable row each, "
        "beside the frozen vectors; fixed = a frozen random row each. Without "
        "word_vectors every word trains anyway")
    min_char_count: int = Field(1, ge=1, description="training count a char needs for the vocab")
    answer_search_window: int = Field(
        64, ge=0, description="chars around answer_start searched for a misplaced answer text"
    )
    limits: Limits = Limits()
    heldout: Heldout = Heldout()
    window: Window = Window()
    workers: int = Field(2, ge=1, description="tokenizer processes (nlp.pipe n_process)")
    sha256: dict[str, str] = Field(
        default_factory=dict, description="source URI -> sha256 of its content: `rcpipe "
        "fetch` refuses a file that does not match (the official files' digests pinned)")

    @model_validator(mode="after")
    def _training_windows_overlap(self) -> DataConfig:
        if self.window.train_stride is not None and \
                self.window.train_stride >= self.limits.para:
            raise ValueError(f"window.train_stride {self.window.train_stride} must be below "
                             f"limits.para {self.limits.para}: training windows must overlap")
        return self

    def train_window(self) -> tuple[int, int]:
        """(length, stride) of the windows a training context over limits.para becomes."""
        return self.limits.para, self.window.train_stride or max(1, self.limits.para // 2)


class SynthConfig(Section):
    """Synthetic SQuAD-format data written by `rcpipe synth` to data.train_file/dev_file."""

    seed: int = 13
    version: Literal["1.1", "2.0"] = "1.1"
    train_articles: int = Field(60, gt=0)
    dev_articles: int = Field(10, gt=0)
    paragraphs_per_article: int = Field(5, gt=0)
    questions_per_paragraph: int = Field(5, gt=0)
    unanswerable_fraction: float = Field(0.33, ge=0.0, lt=1.0)
    facts_per_paragraph: tuple[int, int] = Field(
        (5, 7), description="[min, max] fact sentences per paragraph: the passages' length")

    @field_validator("facts_per_paragraph")
    @classmethod
    def _facts_range(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= v[0] <= v[1]:
            raise ValueError("must be [min, max] with 1 <= min <= max")
        return v

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, v: object) -> object:
        # `--set synth.version=2.0` arrives as the YAML float 2.0
        return f"{v:.1f}" if isinstance(v, float) else v


class Buckets(Section):
    """The lengths a training batch is padded to: its longest context (question) rounded up
    to the next edge. A few fixed shapes let torch.compile and CUDA graphs build one graph
    per shape (at most len(context) * len(question) of them) instead of one per batch."""

    context: tuple[int, ...] = Field(description="context edges in tokens, increasing; the "
                                     "last at least data.limits.para")
    question: tuple[int, ...] = Field(description="question edges, increasing; the last at "
                                      "least data.limits.question")

    @field_validator("context", "question")
    @classmethod
    def _increasing(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(e <= 0 for e in v) or list(v) != sorted(set(v)):
            raise ValueError("must be positive lengths in increasing order")
        return v


class TrainConfig(Section):
    num_workers: int = Field(1, ge=1, description="Ray Train workers (one per GPU on a cluster)")
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, gt=0, description="global batch, split across workers")
    seed: int = 42
    device: Literal["auto", "cpu", "cuda"] = "auto"
    eval_every: int = Field(0, ge=0, description="steps between dev evaluations and "
                            "checkpoints (also at every epoch end); 0: per epoch only")
    keep_checkpoints: int = Field(2, ge=1, description="best K checkpoints by dev F1 kept "
                                  "(the latest is always kept too, for resuming)")
    max_steps: int = Field(0, ge=0, description="stop after this many steps; 0: no limit")
    max_minutes: float = Field(0, ge=0, description="stop after this long; 0: no limit")
    threads: int = Field(0, ge=0, description="torch CPU threads per worker; 0: its CPU share")
    cpus_per_worker: float = Field(0, ge=0, description="Ray CPUs per worker; 0: the "
                                   "cluster's CPUs / num_workers on CPU, 1 with GPUs")
    ray_address: str | None = Field(None, description="a running Ray cluster: its "
                                    "dashboard http://head:8265 (each variant a Ray job, "
                                    "through the Jobs API), or 'auto' on one of its nodes; "
                                    "None: start a local one")
    storage_path: str | None = Field(None, description="checkpoint storage, a directory or "
                                     "s3://bucket/prefix; None: models/ here")
    max_failures: int = Field(2, ge=0, description="restarts of a run whose worker died")
    keep_runs: int = Field(2, ge=1, description="training runs of a variant whose "
                           "checkpoints are kept (the newest; each run is keyed on what "
                           "it was trained from: rcpipe/runs.py)")
    patience: int = Field(0, ge=0, description="early stopping: stop after this many dev "
                          "evaluations without a better F1; 0: never")
    tf32: bool = Field(True, description="TF32 matmuls and convolutions on CUDA (fp32 "
                       "weights and activations; models.<variant>.bf16 is mixed precision)")
    compile: Literal["off", "default", "reduce-overhead"] = Field(
        "off", description="torch.compile the training step: the model's forward and "
        "backward, and the optimiser step with the EMA; reduce-overhead adds CUDA graphs "
        "(one per input shape: set train.buckets)")
    compile_backend: Literal["inductor", "aot_eager"] = Field(
        "inductor", description="torch.compile's backend: inductor generates the kernels; "
        "aot_eager captures the same graphs (forward and backward) and runs them eagerly: "
        "a check that a model compiles, in seconds instead of minutes on a CPU")
    buckets: Buckets | None = Field(None, description="pad training batches to these "
                                    "lengths (a few fixed shapes); None: each batch to its "
                                    "own longest context and question")

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_words(cls, v: object) -> object:
        # YAML reads `off` and `false` as False, and older params files said `compile: true`
        return {False: "off", True: "default"}.get(v, v) if isinstance(v, bool) else v


class OptimConfig(Section):
    """The optimiser each paper used (Adadelta for BiDAF/R-Net, Adam + warm-up for QANet)."""

    name: Literal["adam", "adadelta"] = "adam"
    lr: float = Field(1e-3, gt=0)
    beta1: float = 0.8  # Adam; QANet: 0.8
    beta2: float = 0.999
    eps: float = 1e-7
    rho: float = 0.95  # Adadelta
    weight_decay: float = Field(0.0, ge=0, description="L2 on all weights (QANet: 3e-7)")
    warmup_steps: int = Field(0, ge=0, description="log warm-up of the lr (QANet: 1000)")
    grad_clip: float = Field(5.0, gt=0)
    plateau_factor: float = Field(1.0, gt=0, le=1, description="multiply the lr by this "
                                  "after plateau_patience dev evaluations without a better "
                                  "F1 (and again after as many more); 1: never")
    plateau_patience: int = Field(2, ge=1)
    ema_decay: float | None = Field(None, description="EMA of weights used for eval (0.9999)")


def Arch(default: Any, **kwargs: Any) -> Any:  # named like pydantic's Field, which it wraps
    """A field that shapes the weights: a saved model must match it (model_from_payload)."""
    return Field(default, json_schema_extra={"architecture": True}, **kwargs)


class ModelConfig(Section):
    """One variant: its architecture (``Arch`` fields: they shape the weights) and how it
    trains (the rest). Fields a family does not use are ignored by its builder."""

    # -- architecture; each bounded, so a model file or package naming a million layers is
    # refused before anything is built (limits.parameters bounds the whole)
    hidden: int = Arch(75, gt=0, le=8192, description="d: RNN state / model width")
    char_dim: int = Arch(8, gt=0, le=1024, description="char embedding size")
    char_hidden: int = Arch(100, gt=0, le=8192, description="char CNN filters / char GRU state")
    char_kernel: int = Arch(5, gt=0, le=64, description="char CNN width")
    layers: int = Arch(3, gt=0, le=64, description="R-Net encoder BiGRU layers; BiDAF modeling")
    highway_layers: int = Arch(2, ge=0, le=64)
    heads: int = Arch(8, gt=0, le=256, description="QANet self-attention heads")
    conv_kernel: int = Arch(7, gt=0, le=64, description="QANet embedding-encoder conv width")
    emb_convs: int = Arch(4, gt=0, le=64, description="QANet convs per embedding-encoder block")
    model_blocks: int = Arch(7, gt=0, le=64, description="QANet model-encoder blocks")
    model_convs: int = Arch(2, gt=0, le=64, description="QANet convs per model-encoder block")
    model_kernel: int = Arch(5, gt=0, le=64, description="QANet model-encoder conv width")
    position_encoding: bool = Arch(True, description="QANet: add the sinusoid at every "
                                   "encoder block (the paper); False: the convolutions "
                                   "alone carry word order")
    bidirectional_matching: bool = Arch(True, description="R-Net: question-passage "
                                        "matching reads the passage both ways (the "
                                        "report's section 4.1); False: forward only")
    # -- training
    dropout: float = Field(0.2, ge=0, lt=1)
    char_dropout: float = Field(0.05, ge=0, lt=1)
    stochastic_depth: float = Field(0.1, ge=0, lt=1, description="QANet p_L (1 - survival)")
    word_dropout: float = Field(0.0, ge=0, lt=1, description="training: a word becomes "
                                "out-of-vocabulary with this probability (a regulariser)")
    train_word_vectors: bool = Field(False, description="fine-tune pretrained vectors")
    batch_size: int | None = Field(None, gt=0, description="overrides train.batch_size")
    max_steps: int | None = Field(None, ge=0, description="overrides train.max_steps")
    max_minutes: float | None = Field(None, ge=0, description="overrides train.max_minutes")
    bf16: bool = Field(False, description="bf16 autocast on CUDA (recurrent layers stay "
                       "fp32; the CPU always trains in fp32). Off for every variant: on one "
                       "H100 each trained slower under bf16 than in fp32 (README, Speed)")
    optim: OptimConfig = OptimConfig()

    @classmethod
    def architecture_fields(cls) -> tuple[str, ...]:
        return tuple(name for name, f in cls.model_fields.items()
                     if isinstance(f.json_schema_extra, dict)
                     and f.json_schema_extra.get("architecture"))

    def architecture(self) -> dict[str, Any]:
        """The fields that shape the weights, and their values."""
        return {name: getattr(self, name) for name in self.architecture_fields()}


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


class _Models(Section):
    """Per-variant settings: each is its paper's (variants.REGISTRY) with the params file's
    keys on top. ModelsConfig below has one ModelConfig field per registered variant."""

    @model_validator(mode="before")
    @classmethod
    def _over_the_papers(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data  # pydantic names the type error
        merged: dict[str, Any] = dict(data)
        for variant in VARIANTS:
            own = data.get(variant)
            if own is None:  # absent, or an empty YAML section (`qanet:`): the paper
                own = {}
            paper = dict(REGISTRY[variant].paper)
            merged[variant] = merge_over(paper, own) if isinstance(own, dict) else own
        return merged

    def steps(self, variant: str, default: int) -> int:
        """The variant's step limit: its own max_steps, else ``default``."""
        own = self.of(variant).max_steps
        return default if own is None else own

    def minutes(self, variant: str, default: float) -> float:
        """The variant's training time limit: its own max_minutes, else ``default``."""
        own = self.of(variant).max_minutes
        return default if own is None else own

    def of(self, variant: str) -> ModelConfig:
        if variant not in VARIANTS:
            raise InputError("VARIANT", variant, f"unknown variant; choose from {VARIANTS}")
        result: ModelConfig = getattr(self, variant)
        return result


# `models.bidaf`, `models.qanet`, ...: a field per registered variant, in registry order
ModelsConfig = create_model(
    "ModelsConfig", __base__=_Models, __doc__=_Models.__doc__,
    **{v: (ModelConfig, ...) for v in VARIANTS})


class EvalConfig(Section):
    max_answer_len: int = Field(15, gt=0, description="longest span best_span may return")
    length_prior: bool = Field(False, description="weigh each span by how often training "
                               "answers have its length (add-one smoothed) when choosing it")
    na_threshold: float | None = Field(
        None, description="v2.0: answer '' when na_prob exceeds it; None: the threshold "
        "`rcpipe evaluate` chooses on the held-out questions (data.heldout)"
    )


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
    seed: int = Field(0, description="the random search's seed: the same trials again")
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


class VersionConfig(Section):
    """The champion gate of `rcpipe version --promote` (and the nightly flow): the run's best
    model on the gate set replaces the champion only when the paired interval of its F1
    minus the champion's, both answering the same questions, lies above ``min_gain``."""

    min_gain: float = Field(0.0, ge=0, description="F1 points the 95% interval's lower end "
                            "must clear (0: any gain beyond chance)")
    gate_file: str | None = Field(None, description="a SQuAD JSON (path, URL, s3://) the "
                                  "gate answers; None: the prepared held-out questions. "
                                  "Never data.dev_file, which reports")
    git_remote: str | None = Field("origin", description="the git remote each versioned "
                                   "night's dvc.lock commit (and the champion tag) is pushed "
                                   "to, when the workspace has it; None: kept local")


class Autoscaling(Section):
    """Ray Serve's autoscaling of each model's Reader: replicas between the bounds, as many
    as keep each one's requests in flight near the target."""

    min_replicas: int = Field(1, ge=0, description="replicas kept when idle (0: none)")
    max_replicas: int = Field(4, ge=1, description="replicas at the most")
    target_ongoing_requests: float = Field(
        16, gt=0, description="requests in flight a replica is sized for (a full batch)")

    @model_validator(mode="after")
    def _ordered(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} is over max_replicas "
                             f"{self.max_replicas}")
        return self


class ServeConfig(Section):
    """`rcpipe serve` on Ray Serve: each model a Reader deployment batching its requests,
    behind one ingress with the routes and the page (rcpipe/serve/deployments.py)."""

    replicas: int = Field(1, ge=1, le=64, description="each model's Reader replicas "
                          "(`--replicas`); ignored under autoscaling")
    autoscaling: Autoscaling | None = Field(None, description="replicas scaled with the "
                                            "load; None: a fixed `replicas`")
    replica_cpus: float = Field(1.0, ge=0, description="Ray CPUs a Reader replica holds "
                                "(0: placed anywhere; the service's threads are --threads)")
    max_batch: int = Field(16, ge=1, le=1024, description="requests per forward pass "
                           "(@serve.batch's max_batch_size)")
    batch_wait_ms: float = Field(5.0, ge=0, le=10_000, description="how long a batch "
                                 "waits to fill")
    timeout_s: float = Field(30.0, gt=0, description="from arrival to answer, else 504")
    max_pending: int = Field(1024, ge=1, description="requests a Reader replica holds "
                             "(its batch queue), and as many waiting for a replica, else 503")
    body_timeout_s: float = Field(10.0, gt=0, description="a request's body arrives whole "
                                  "within this, else 408 (a slow client)")
    keep_alive_s: int = Field(5, ge=1, description="an idle connection is closed after this")
    # uvicorn (Serve's proxy) has no deadline for a request's head: rcpipe/serve/guard.py
    # fronts it with these two, so a silent or trickling client cannot hold a descriptor
    header_timeout_s: float = Field(10.0, gt=0, description="a request's head arrives "
                                    "whole within this of its first byte (of the "
                                    "connection's opening, for the first), else 408 and "
                                    "close (rcpipe/serve/guard.py)")
    # a relayed connection is two descriptors (client, proxy): 4,096 of them fit the open-
    # file limits met in practice (20,000 here, 65,536 in many containers) with room to spare
    max_connections: int = Field(4096, ge=1, description="open client connections the "
                                 "guard holds; one more is answered 503 and closed")


class ReadLimits(Section):
    """Caps on what rcpipe reads (README, "Limits"): a file over its cap, a context over its
    length or a document nested too deep is one located error, found before it is read or
    parsed. A params file itself is held to PARAMS_BYTES (it cannot raise its own cap)."""

    # train-v2.0.json is 40 MB, dev 4 MB: the cap leaves room for a corpus ten times larger
    json_mb: float = Field(512, gt=0, description="a JSON file rcpipe reads: SQuAD files "
                           "(a .gz inflated), predictions, n-best and probability files, "
                           "vocab.json, a package's config")
    # the papers' models with 300-d vectors over SQuAD's words are ~120 MB of fp32
    weights_mb: float = Field(4096, gt=0, description="a package's model.safetensors and a "
                              "model file (models/<variant>/model.pt)")
    parameters: int = Field(1_000_000_000, gt=0, description="a model a package or model "
                            "file describes is refused above this many weights, counted "
                            "before any is allocated")
    # 20,000 tokens (data.window.max_tokens) of English are ~120,000 characters
    context_chars: int = Field(1_000_000, gt=0, description="one context of predict "
                               "(--context, --context-file, each of --input's), refused "
                               "before it is tokenized")
    depth: int = Field(64, gt=0, description="JSON and YAML nesting (SQuAD nests 7 deep)")
    download_minutes: float = Field(120, gt=0, description="a download's deadline, its "
                                    "retries included: a server that trickles is left")

    def json_bytes(self) -> int:
        return int(self.json_mb * reads.MB)

    def weights_bytes(self) -> int:
        return int(self.weights_mb * reads.MB)


PARAMS_BYTES = 1_000_000  # a params file (params.yaml's 12 KB, or a tune layer's 1 KB)


class Config(Section):
    data: DataConfig
    synth: SynthConfig = SynthConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
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

    @property
    def source(self) -> str:
        """The params file this was loaded from, for errors that name a key of it."""
        return self._source


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


def load_config(params: Layers | None = "params.yaml", overrides: list[str] | None = None
                ) -> Config:
    """The config of one params file, or of several laid over each other in order (a later
    file's keys win, key by key at any depth, as ``models.<variant>`` over its paper), with
    the ``--set`` values on top. An error names the last file that holds the key at fault.
    ``params`` None: no file, the defaults (data.train_file and data.dev_file, which have
    none, empty): for a command given only package directories, which carry their own."""
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
    for item in overrides or []:
        keys, value = parse_override(item)
        _apply(raw, keys, value, item)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        where, what = located(e)
        if not where:  # a check across sections (Config's validators) names its key first
            where, _, what = what.removeprefix("Value error, ").partition(": ")
        held = [f for f, layer in layers if _holds(layer, where.split("."))]
        raise InputError((held or files)[-1 if held else 0], where, what) from None
    cfg._source = str(files[0])
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

