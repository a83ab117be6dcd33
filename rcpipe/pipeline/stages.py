"""The pipeline written down once: its stages in order, each an `rcpipe` command with the
params keys it reads, the files it reads and writes (layout.py's names) and the module it
runs. dvc.yaml is generated from this table (rcpipe/pipeline/dvc_yaml.py), the train-all
flow walks it (flows/train_all.py), and tests/test_dvc_pipeline.py checks it.

A stage that runs per variant is written once with ``VARIANT`` where the variant's name
goes (dvc.yaml's ``${item}`` of a ``foreach`` over the pipeline's variants: the registry's
names, or the ones `python -m rcpipe.pipeline.dvc_yaml --variants` is given); a stage that
reads every variant's outputs names them once in ``each``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rcpipe import layout
from rcpipe.config.train import UNKEYED, TrainConfig
from rcpipe.variants import REGISTRY

VARIANT = "${item}"  # a per-variant stage's variant, as dvc.yaml's foreach names it
CACHE, PREPARED = "${data.cache_dir}", "${data.out_dir}"  # params-named folders
VARIANTS = tuple(REGISTRY)

# where the data comes from and how it is cut, read by every stage that reads the dev set
DEV = ("data.dev_file", "data.cache_dir")
# the params that name a data source: in a stage's key a local file counts by its content, a
# URL by itself (the download cache, ``CACHE``, holds one version per URL: a key counts the
# cache by these, not by every file in it; rcpipe/fingerprints.py `of_stage`)
SOURCES = ("data.train_file", "data.dev_file", "data.word_vectors", "data.heldout.file")
WINDOW = ("data.window.length", "data.window.stride")  # a longer context read as windows
DECODE = ("eval.max_answer_len", "eval.na_threshold", "eval.length_prior")
# every train.* key a training run's key holds (config/train.py's UNKEYED: the others)
TRAIN = tuple(f"train.{k}" for k in TrainConfig.model_fields if k not in UNKEYED)
DISTILL = ("distill.student", "distill.temperature", "distill.alpha")
STUDENT = layout.STUDENT


@dataclass(frozen=True)
class Stage:
    """One stage: ``rcpipe <name>`` (and the variant), what it reads and writes.

    No ``--force``: a stage skips its work only when its key (rcpipe/fingerprints.py: what
    it reads, its params, its code as dvc.yaml lists it) is its outputs' and they are all
    there, and DVC removes a stage's outputs before it runs it; docs/architecture.md."""

    name: str  # the rcpipe command, and the stage's name in dvc.yaml
    entry: str  # the module the command runs: its import closure is the stage's code
    desc: str  # what it does, for a reader of dvc.yaml
    params: tuple[str, ...]  # the params keys its outputs depend on
    deps: Callable[[str], list[str]]  # the files it reads, for a variant (or "")
    outs: Callable[[str], list[str]]  # the files it writes
    per_variant: bool = False
    metrics: Callable[[str], list[str]] = lambda v: []  # outputs that are metrics files
    persist: tuple[str, ...] = ()  # outputs DVC keeps when the stage runs again
    notes: dict[str, str] = field(default_factory=dict)  # path -> why it is there
    # the files it reads of each model before it (every variant, then the ensemble where
    # ``each_ensemble``, then the student where ``each_student`` and the pipeline distills
    # one), listed before ``deps``
    each: Callable[[str], list[str]] = lambda m: []
    each_ensemble: bool = False
    each_student: bool = False
    # files it reads when they are there that no stage makes, so no DVC dep (DVC refuses a
    # missing one): in the CLI's key only (a search's trials: `rcpipe tune` is no stage)
    unstaged: Callable[[], list[str]] = lambda: []

    def reads(self, variants: Sequence[str], variant: str = "", student: bool = False
              ) -> list[str]:
        """Every file it reads in a pipeline of ``variants`` (and a student where
        ``student``): ``each`` model's, kind by kind (every model's first file, then every
        model's second, ...), then ``deps``."""
        models = [*variants, *([layout.ENSEMBLE] if self.each_ensemble else []),
                  *([STUDENT] if self.each_student and student else [])]
        per_model = [self.each(m) for m in models]
        kinds = len(per_model[0]) if per_model else 0
        return [files[k] for k in range(kinds) for files in per_model] + self.deps(variant)

    def keys(self) -> list[str]:
        """The params keys it reads: a per-variant stage's model section, then ``params``."""
        return [*([f"models.{VARIANT}"] if self.per_variant else []), *self.params]

    def cmd(self, variant: str = "") -> str:
        return " ".join(["rcpipe", self.name, *([variant] if variant else [])])

    @property
    def module(self) -> str:
        """The entry module's name, where the command's function (named as the stage) is."""
        return self.entry.removesuffix(".py").replace("/", ".")


def _p(*paths: object) -> list[str]:
    return [str(p) for p in paths]


STAGES: tuple[Stage, ...] = (
    Stage("fetch", "rcpipe/stages/fetch.py",
          "SQuAD and GloVe from the URLs in params.yaml, checked against data.sha256; the "
          "downloads and sources.json (every source's sha256) are this stage's output",
          ("data.train_file", "data.dev_file", "data.word_vectors", "data.cache_dir",
           "data.sha256"),
          deps=lambda v: [], outs=lambda v: [CACHE], persist=(CACHE,),
          notes={CACHE: "a new SQuAD URL must not download the 2 GB of GloVe again"}),
    Stage("prepare", "rcpipe/stages/data.py",
          "spaCy tokenization and character indexing into Parquet, the vocabularies, the "
          "held-out slice of the training articles (data.heldout) and report.json",
          ("data.train_file", "data.dev_file", "data.word_vectors", "data.cache_dir",
           "data.sha256", "data.out_dir", "data.word_dim", "data.min_word_count",
           "data.missing_vectors", "data.min_char_count", "data.answer_search_window",
           "data.limits", "data.heldout", "data.window.train_stride"),
          deps=lambda v: [CACHE], outs=lambda v: [PREPARED]),
    Stage("train", "rcpipe/stages/train.py",
          "one Ray Train job per variant (rcpipe/cluster/train_job.py); the run lives under "
          "models/<variant>/runs/ (or train.storage_path), the chosen model is the output",
          (*TRAIN, *DECODE, "data.word_dim", *WINDOW, "data.out_dir", *DEV),
          deps=lambda v: [PREPARED, CACHE],
          outs=lambda v: _p(layout.model_file(v), layout.summary_file(v),
                            layout.model_dir(v) / layout.CURVE, layout.live_dir(v)),
          per_variant=True),
    Stage("evaluate", "rcpipe/stages/evaluate.py",
          "the variant's answers to the dev set, scored by the official SQuAD EM/F1; on "
          "v2.0 at the no-answer threshold chosen on the held-out questions",
          (*WINDOW, *DECODE, "data.out_dir", *DEV),
          deps=lambda v: [str(layout.model_file(v)), PREPARED, CACHE],
          # the by-type breakdown an output, not a metric: `dvc metrics show` is EM/F1 (and
          # v2.0's HasAns/NoAns), the breakdown dvc.yaml's plots draw from report's rows
          outs=lambda v: _p(layout.predictions(v), layout.nbest(v), layout.dists(v),
                            layout.na_threshold_file(v), layout.by_type(v)),
          metrics=lambda v: _p(layout.metrics(v)),
          per_variant=True),
    Stage("ensemble", "rcpipe/stages/ensemble.py",
          "every variant's answers combined by ensemble.method: the majority vote (a tie: "
          "the likeliest text), the mean of their distributions, or the mean weighted on the "
          "held-out questions; every method scored",
          (*DEV, "data.out_dir", "eval.max_answer_len", "ensemble.method", "ensemble.rounds"),
          each=lambda m: _p(layout.nbest(m), layout.dists(m)),
          deps=lambda v: [PREPARED, CACHE],
          # every method's scores and the chosen weights an output beside the metrics file,
          # which holds the chosen method's EM/F1 alone: `dvc metrics show` is one row each
          outs=lambda v: _p(layout.predictions(layout.ENSEMBLE), layout.nbest(layout.ENSEMBLE),
                            layout.by_type(layout.ENSEMBLE), layout.methods(layout.ENSEMBLE)),
          metrics=lambda v: _p(layout.metrics(layout.ENSEMBLE))),
    Stage("distill", "rcpipe/stages/distill.py",
          "one network (distill.student) trained as a Ray Train job on the gold spans and on "
          "the ensemble's start/end distributions over every training row (the teacher: its "
          "members as ensemble.method combines them), then evaluated as a variant is; "
          "models/student/ is a model like the variants'",
          # the whole models section: the student's own (models.<distill.student>) and the
          # members' settings, as their model files are read
          (*DISTILL, "models", *TRAIN, *DECODE, "data.word_dim", *WINDOW, "data.out_dir",
           *DEV),
          each=lambda m: _p(layout.model_file(m)),
          deps=lambda v: [str(layout.methods(layout.ENSEMBLE)), PREPARED, CACHE],
          outs=lambda v: _p(layout.model_file(STUDENT), layout.summary_file(STUDENT),
                            layout.model_dir(STUDENT) / layout.CURVE, layout.live_dir(STUDENT),
                            layout.predictions(STUDENT), layout.nbest(STUDENT),
                            layout.dists(STUDENT), layout.na_threshold_file(STUDENT),
                            layout.by_type(STUDENT)),
          metrics=lambda v: _p(layout.metrics(STUDENT))),
    Stage("report", "rcpipe/stages/report.py",
          "the evaluation report: report.html, a PNG per chart and the charts' data (CSV, "
          "by_type/<model>.json rows) that dvc.yaml's plots draw", DEV,
          each=lambda m: _p(layout.predictions(m), layout.metrics(m)), each_ensemble=True,
          each_student=True, deps=lambda v: [str(layout.methods(layout.ENSEMBLE)), CACHE],
          unstaged=lambda: _p(*(layout.tune_trials(v) for v in VARIANTS)),
          outs=lambda v: [str(layout.REPORTS)]),
)


def stage(name: str) -> Stage:
    return next(s for s in STAGES if s.name == name)
