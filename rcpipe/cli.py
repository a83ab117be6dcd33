"""The `rcpipe` command: each command loads the config and makes one call into rcpipe.stages."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from rcpipe import layout, stages
from rcpipe.config import NAMED_AS_ENV, VARIANTS, Config, effective_yaml, load_config
from rcpipe.errors import InputError
from rcpipe.logs import setup as setup_logging
from rcpipe.safe_open import disk_full, is_disk_full

app = typer.Typer(
    help="Train and evaluate extractive QA models (BiDAF, R-Net, QANet) on SQuAD.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

Params = Annotated[list[Path] | None, typer.Option(
    "--params", help="params file (YAML), default params.yaml; repeatable: each later file "
                     "is laid over the earlier ones, key by key (tune/<variant>.yaml)")]
Sets = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a param: dotted.key=value (value parsed as YAML)"),
]


# one run at a time per output (rcpipe/locks.py): without --wait a second run is refused
Wait = Annotated[bool, typer.Option(
    "--wait", help="wait for a run writing the same outputs (default: say who and exit 2)")]


def _config(params: list[Path] | None, sets: list[str] | None) -> Config:
    # a Ray job's params are a copy of the submitter's: its lines name the submitter's file
    return load_config(params or [Path("params.yaml")], sets or [],
                       named_as=os.environ.get(NAMED_AS_ENV))


def _config_or_defaults(params: list[Path] | None, sets: list[str] | None) -> Config:
    """params.yaml (or --params) where there is one, else the params' defaults: a command
    that needs only limits (`rcpipe champion`) runs in any DVC workspace."""
    if not params and not Path("params.yaml").exists():
        return load_config(None, sets or [])
    return _config(params, sets)


def _config_for(models: list[str], params: list[Path] | None, sets: list[str] | None
                ) -> Config:
    """A package directory carries its own settings: given only packages, no --params and no
    params.yaml here, the params' defaults (and --set) stand in for it."""
    from rcpipe.stages.predict import packages_only

    if not params and not Path("params.yaml").exists() and packages_only(models):
        return load_config(None, sets or [])
    return _config(params, sets)


@app.command()
def synth(params: Params = None, set_: Sets = None) -> None:
    """Write synthetic SQuAD-format train/dev files to data.train_file and data.dev_file."""
    stages.synth(_config(params, set_))


@app.command()
def prepare(params: Params = None, set_: Sets = None, wait: Wait = False) -> None:
    """Tokenize and index SQuAD into Parquet under data.out_dir, with report.json."""
    stages.prepare(_config(params, set_), wait=wait)


@app.command("config")
def config_(
    key: Annotated[str | None, typer.Argument(
        help="a dotted section or key (models.qanet, train.epochs); default: all")] = None,
    params: Params = None,
    set_: Sets = None,
) -> None:
    """Print the effective configuration as YAML: every key, the papers' values filled in."""
    print(effective_yaml(_config(params, set_), key), end="")


Variant = Annotated[str, typer.Argument(help=", ".join(VARIANTS))]
# a trained model: a variant, or the student `rcpipe distill` trains
TrainedModel = Annotated[str, typer.Argument(help=", ".join((*VARIANTS, layout.STUDENT)))]


@app.command()
def train(variant: Variant, params: Params = None, set_: Sets = None,
          force: Annotated[bool, typer.Option(help="train anew even if the model in place "
                                                   "was trained from these inputs")] = False,
          run_name: Annotated[str | None, typer.Option(
              help="Jobs API: the run whose Ray job this is; the same name follows its "
                   "unfinished job instead of submitting another (default: the directory "
                   "and storage trained into)")] = None,
          detach: Annotated[bool, typer.Option(
              help="Jobs API: an interrupted command leaves the Ray job running (default: "
                   "it stops the job)")] = False,
          wait: Wait = False,
          ) -> None:
    """Train one variant; checkpoints and summary.json under models/<variant>/."""
    stages.train(_config(params, set_), variant, force=force, run=run_name, detach=detach,
                 wait=wait)


@app.command()
def tune(variant: Variant, params: Params = None, set_: Sets = None,
         force: Annotated[bool, typer.Option(help="search again from the start")] = False,
         run_name: Annotated[str | None, typer.Option(
             help="Jobs API: the run whose Ray job this is (as train's)")] = None,
         detach: Annotated[bool, typer.Option(
             help="Jobs API: an interrupted command leaves the Ray job running")] = False,
         ) -> None:
    """Search one variant's settings (ASHA on Ray Tune, each trial a Ray Train job); the best
    as the params layer tune/<variant>.yaml, every trial in tune/<variant>.trials.json."""
    stages.tune(_config(params, set_), variant, force=force, run=run_name, detach=detach)


Redo = Annotated[bool, typer.Option(
    "--force", help="do it again even if its inputs are those its outputs were made from")]


@app.command()
def evaluate(variant: TrainedModel, params: Params = None, set_: Sets = None,
             force: Redo = False, wait: Wait = False) -> None:
    """Predict the dev split with a trained variant (or the student); predictions/ and
    metrics/ files."""
    stages.evaluate(_config(params, set_), variant, force=force, wait=wait)


@app.command()
def score(
    dataset: Annotated[str, typer.Argument(help="SQuAD JSON (path, URL or s3:// URI)")],
    predictions: Annotated[Path, typer.Argument(help="predictions JSON: id -> answer text")],
    na_prob_file: Annotated[Path | None, typer.Option(help="v2.0: id -> P(no answer)")] = None,
    na_prob_thresh: Annotated[float, typer.Option(help="v2.0: answer '' above this")] = 1.0,
) -> None:
    """Score predictions exactly as the official SQuAD v1.1 / v2.0 script does (JSON out)."""
    result = stages.score(dataset, predictions, na_prob_file, na_prob_thresh)
    print(json.dumps(result))


@app.command()
def ensemble(
    inputs: Annotated[list[Path] | None, typer.Option(
        help="nbest files to combine (each with its .dists.parquet beside it for the mean "
        "and selected methods)")] = None,
    out: Annotated[Path, typer.Option(help="ensemble predictions")] = layout.predictions(
        layout.ENSEMBLE),
    params: Params = None,
    set_: Sets = None,
    force: Redo = False,
    wait: Wait = False,
) -> None:
    """Combine the models' answers by ensemble.method (vote, mean or selected); every method scored.

    vote: majority vote on the answer text (a tie: the highest single-voter prob); mean:
    their start/end distributions averaged, then the best span; selected: the mean weighted
    on the held-out questions."""
    stages.ensemble(_config(params, set_), inputs, out, force=force, wait=wait)


@app.command()
def distill(params: Params = None, set_: Sets = None,
            force: Annotated[bool, typer.Option(help="train the student anew even if it was "
                                                     "trained from these inputs")] = False,
            wait: Wait = False) -> None:
    """Train one student (distill.student) on the ensemble's answers, then evaluate it;
    models/student/, and predictions/ and metrics/ files named student."""
    stages.distill(_config(params, set_), force=force, wait=wait)


# ------------------------------------------------------- DVC: fetch, version (dvc.yaml)


@app.command()
def fetch(params: Params = None, set_: Sets = None) -> None:
    """Download the SQuAD files and word vectors into data.cache_dir, checked by data.sha256."""
    from rcpipe.stages.fetch import fetch as fetch_sources

    fetch_sources(_config(params, set_))


@app.command()
def version(
    variant: Annotated[list[str] | None, typer.Option(
        help="a variant the run trained (repeatable); default: every variant dvc.yaml "
             "trains")] = None,
    promote: Annotated[bool, typer.Option(
        help="the champion gate: move the champion to this run's best model on the gate "
             "set if its paired F1 gain's 95% interval lies above version.min_gain")] = False,
    min_gain: Annotated[float | None, typer.Option(
        help="F1 points the interval's lower end must clear (default: version.min_gain)")
                        ] = None,
    remote: Annotated[str | None, typer.Option(help="DVC remote (default: core.remote)")
                      ] = None,
    tries: Annotated[int, typer.Option(min=1, help="dvc push attempts")] = 3,
    params: Params = None,
    set_: Sets = None,
) -> None:
    """Commit the run's DVC state (dvc.lock), push it to the remote; the champion gate."""
    from rcpipe.stages.version import version as version_run

    files = params or [Path("params.yaml")]
    if len(files) > 1:  # dvc.lock records params.yaml's values, and no layer over it
        raise InputError(files[1], "", "dvc.yaml records params.yaml alone: a run with a "
                         "params layer over it cannot be versioned (merge the layer into "
                         "params.yaml)")
    record = version_run(_config(files, set_), variant or None, params=files[0],
                         overrides=set_ or [], remote=remote, promote=promote,
                         min_gain=min_gain, tries=tries)
    print(json.dumps(record))


champion_app = typer.Typer(help="The champion record on the DVC remote (the registry the "
                           "gate, `rcpipe serve`'s champion app and this command share).",
                           no_args_is_help=False)
app.add_typer(champion_app, name="champion")
Remote_ = Annotated[str | None, typer.Option("--remote", help="DVC remote (default: "
                                                               "core.remote)")]
Reason = Annotated[str, typer.Option("--reason", help="why: kept in the record's history")]
By = Annotated[str | None, typer.Option("--by", help="who (default: git's user, else the "
                                                     "login name)")]


@champion_app.callback(invoke_without_command=True)
def champion(
    ctx: typer.Context,
    remote: Remote_ = None,
    ref: Annotated[bool, typer.Option(
        "--ref", help="print only the champion's git commit or GTO version tag, to "
                      "`git checkout`")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="the record and history as JSON")
                       ] = False,
    params: Params = None,
    set_: Sets = None,
) -> None:
    """The champion record: every change (promotion, rollback, set), newest first, the
    current one marked *; a note when this clone's GTO tags (a mirror) name another."""
    if ctx.invoked_subcommand is not None:
        return
    from rcpipe.stages.registry import lines, show
    from rcpipe.stages.registry import ref as ref_of

    found = show(Path.cwd(), remote, _config_or_defaults(params, set_).limits)
    if found["head"] is None:
        raise InputError("champion.json", "", "no champion yet: no night promoted")
    if ref:
        print(ref_of(found))
        return
    print(json.dumps(found, indent=1) if as_json else "\n".join(lines(found)))


@champion_app.command("set")
def champion_set(
    run: Annotated[str, typer.Argument(help="a night versioned on the remote "
                                            "(versions/<run>/)")],
    reason: Reason,
    model: Annotated[str | None, typer.Option(
        "--model", help="its model (default: the night's gate candidate)")] = None,
    remote: Remote_ = None,
    by: By = None,
    params: Params = None,
    set_: Sets = None,
) -> None:
    """Make a night's model the champion by hand (its packages checked against their pins)."""
    from rcpipe.stages.registry import set_champion, who

    entry = set_champion(Path.cwd(), remote, run, model, reason, by or who(Path.cwd()),
                         _config_or_defaults(params, set_).limits)
    print(json.dumps({"seq": entry["seq"], "champion": entry["score"],
                      "change": entry["change"]}))


@champion_app.command("rollback")
def champion_rollback(
    reason: Reason = "",
    to: Annotated[int | None, typer.Option(
        "--to", min=1, help="the history entry to go back to (default: the one before)")
                  ] = None,
    remote: Remote_ = None,
    by: By = None,
    params: Params = None,
    set_: Sets = None,
) -> None:
    """The champion before the current one answers again (a new entry in the record)."""
    from rcpipe.stages.registry import rollback, who

    entry = rollback(Path.cwd(), remote, to, reason, by or who(Path.cwd()),
                     _config_or_defaults(params, set_).limits)
    print(json.dumps({"seq": entry["seq"], "champion": entry["score"],
                      "change": entry["change"]}))


@app.command()
def explain(
    model: Annotated[str, typer.Option("--model", help="the variant to explain, or a "
                                                        "package directory")],
    qid: Annotated[str, typer.Option("--qid", help="a dev question id")],
    out: Annotated[Path | None, typer.Option(
        help="HTML page (the PNG goes beside it); default explanations/<V>-<qid>.html")
    ] = None,
    params: Params = None,
    set_: Sets = None,
) -> None:
    """Attention views of one dev question: passage-question, self-attention, pointers."""
    stages.explain(_config_for([model], params, set_), model, qid, out)


@app.command()
def report(
    out: Annotated[Path, typer.Option(help="report directory")] = Path("reports"),
    params: Params = None,
    set_: Sets = None,
    force: Redo = False,
    wait: Wait = False,
) -> None:
    """Evaluation report of the run (HTML, PNG, CSV) from predictions/, metrics/, the dev set."""
    stages.report(_config(params, set_), out, force=force, wait=wait)


@app.command()
def package(
    variant: Variant,
    out: Annotated[Path | None, typer.Option(help="the package directory (default "
                                             "packages/<variant>)")] = None,
    params: Params = None,
    set_: Sets = None,
    wait: Wait = False,
) -> None:
    """A trained, evaluated variant as a directory to take away: model.safetensors,
    config.json, vocab.json, the model card; `--model DIR` of predict/serve/explain loads it."""
    print(stages.package(_config(params, set_), variant, out, wait=wait))


@app.command()
def export(
    model: Annotated[str, typer.Option("--model", help="a trained variant, the student or a "
                                                        "package directory")],
    questions: Annotated[int, typer.Option(
        help="check against the eager model on this many dev questions")] = 256,
    tolerance: Annotated[float, typer.Option(
        help="the largest difference of p_start / p_end allowed")] = 1e-4,
    params: Params = None,
    set_: Sets = None,
    wait: Wait = False,
) -> None:
    """The model's forward as ONNX (dynamic batch and lengths), checked against the eager
    model on data.dev_file; model.onnx + export.json beside the weights (JSON on stdout)."""
    record = stages.export(_config_for([model], params, set_), model, questions, tolerance,
                           wait=wait)
    print(json.dumps({"model": model, "onnx_sha256": record["onnx_sha256"]} | record["check"]))


Model = Annotated[str, typer.Option("--model", help="a variant, the student, ensemble "
                                    "(majority vote of every trained variant) or a package "
                                    "directory")]
Runtime = Annotated[str, typer.Option(help="the model's forward: torch (eager) or onnx (the "
                                      "graph `rcpipe export` wrote, on onnxruntime)")]


@app.command()
def predict(
    model: Model = "ensemble",
    question: Annotated[str | None, typer.Option(help="the question")] = None,
    context: Annotated[str | None, typer.Option(help="the passage, as text")] = None,
    context_file: Annotated[Path | None, typer.Option(help="the passage, from a file")] = None,
    input_file: Annotated[str | None, typer.Option(
        "--input", help="answer every question of a SQuAD-format file instead")] = None,
    out: Annotated[Path | None, typer.Option(help="--input: predictions file (default "
                                             "predictions/<model>.predict.json)")] = None,
    runtime: Runtime = "torch",
    params: Params = None,
    set_: Sets = None,
) -> None:
    """Answer a question about a passage (JSON on stdout: answer, char span, prob, na_prob)."""
    result = stages.predict(_config_for([model], params, set_), model, question, context,
                            context_file, input_file, out, runtime)
    if input_file is None:
        print(json.dumps(result, ensure_ascii=False))


@app.command()
def serve(
    model: Annotated[list[str] | None, typer.Option(
        "--model", help="a model to serve (repeatable): a variant, the student, ensemble or "
                        "a package directory; default: ensemble and every trained variant")
    ] = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8000,
    replicas: Annotated[int | None, typer.Option(
        min=1, help="Reader replicas per model (default serve.replicas; autoscaling off)")
    ] = None,
    max_batch: Annotated[int | None, typer.Option(
        min=1, help="requests per forward pass (default serve.max_batch)")] = None,
    batch_wait_ms: Annotated[float | None, typer.Option(
        min=0, help="wait for a batch to fill (default serve.batch_wait_ms)")] = None,
    timeout: Annotated[float | None, typer.Option(
        min=1e-3, help="seconds per request, else 504 (default serve.timeout_s)")] = None,
    max_context_chars: Annotated[int, typer.Option(min=1, help="longer: 413")] = 20_000,
    max_question_chars: Annotated[int, typer.Option(min=1, help="longer: 413")] = 1_000,
    threads: Annotated[int, typer.Option(min=0, help="torch CPU threads (onnxruntime's with "
                                         "--runtime onnx); 0: the library's default")] = 1,
    runtime: Runtime = "torch",
    params: Params = None,
    set_: Sets = None,
) -> None:
    """The answer service on Ray Serve: POST /answer, and a web page at / to ask a passage."""
    from rcpipe.stages.serving import sigterm_stops

    with sigterm_stops():  # first thing: a stop at any moment of the start-up ends with 0
        from rcpipe.serve.app import Limits

        cfg = _config_for(model or [], params, set_)
        s = cfg.serve
        limits = Limits(max_context_chars, max_question_chars, max_batch or s.max_batch,
                        s.batch_wait_ms if batch_wait_ms is None else batch_wait_ms,
                        timeout or s.timeout_s, s.max_pending, s.body_timeout_s)
        stages.serve(cfg, model, host, port, limits, threads, runtime, replicas)


def main(argv: list[str] | None = None) -> None:
    """Entry point: a user's mistake is one line on stderr and exit code 2, no traceback (a
    run stopped by its surroundings, RunError: one line, exit 1);
    the commands' log lines go to stderr too (rcpipe/logs.py)."""
    setup_logging()
    try:
        code = app(args=argv, prog_name="rcpipe", standalone_mode=False)
    except typer.Abort:  # Ctrl-C outside a command's own handling, as click says it
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    except typer.TyperException as e:  # an unknown option, a value out of its range: one line
        print(usage_line(e), file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 2))
    except InputError as e:  # RunError too, with its own exit code
        print(e.line(), file=sys.stderr)
        sys.exit(e.exit_code)
    except OSError as e:  # a full disk outside a set's writes (a lock's, a log's): one line
        if not is_disk_full(e):
            raise
        print(disk_full(e.filename or "the disk").line(), file=sys.stderr)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)  # --help and a command's Exit: theirs


def usage_line(e: Exception) -> str:
    """A command-line mistake typer found (click's usage errors) as rcpipe's one line:
    ``error: rcpipe serve: Invalid value for '--max-batch': ... (rcpipe serve --help)``."""
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None else "rcpipe"
    message = e.format_message() if hasattr(e, "format_message") else str(e)
    return f"error: {where}: {' '.join(message.split())} ({where} --help)"
