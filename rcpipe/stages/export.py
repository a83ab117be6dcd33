"""`rcpipe export --model M`: a trained variant (models/<V>/model.pt) or a package directory as
an ONNX graph with dynamic batch and length axes (trained/onnx.py), written only once it
matches the eager model to ``tolerance`` on the first ``questions`` questions of
data.dev_file, encoded as `rcpipe predict` encodes them.

Reads what `rcpipe predict --model MODEL` reads, and data.dev_file; writes model.onnx and
export.json beside the weights (models/<V>/ or the package directory), which `rcpipe serve
--runtime onnx` and `rcpipe predict --runtime onnx` load. No training code is imported.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rcpipe import layout, reads
from rcpipe.config import TRAINED, Config
from rcpipe.errors import InputError, RunError
from rcpipe.locks import hold
from rcpipe.outputs import output_set, settle
from rcpipe.trained import package_dir

log = logging.getLogger(__name__)


def export(cfg: Config, model: str, questions: int = 256, tolerance: float = 1e-4,
           wait: bool = False) -> dict[str, Any]:
    """Export ``model`` (a variant, the student or a package directory), check it, write it;
    returns export.json's record. Under the lock of the folder it writes in (models/<V>/ or the
    package's; ``wait``: for its holder); model.onnx and export.json are one set
    (rcpipe/outputs.py): a kill never leaves a graph beside another graph's record."""
    if model == layout.ENSEMBLE:
        raise InputError("export", model, "export one variant or package directory at a time")
    where = layout.model_dir(model) if model in TRAINED else Path(model)
    if not where.is_dir():  # nothing to export: _export's refusal says so, nothing locked
        return _export(cfg, model, questions, tolerance)
    with hold(where, f"{model} is being exported", wait):
        settle(where)
        return _export(cfg, model, questions, tolerance)


def _export(cfg: Config, model: str, questions: int, tolerance: float) -> dict[str, Any]:
    from rcpipe.data.dataset import bucket_batches
    from rcpipe.data.squad import load_squad
    from rcpipe.inference.reading import EVAL_BATCH
    from rcpipe.stages.predict import load_reader
    from rcpipe.trained.onnx import (
        ONNX,
        RECORD,
        FixedAxis,
        OnnxForward,
        compare,
        export_graph,
        export_record,
        locations,
    )

    if questions < 2:
        raise InputError("--questions", str(questions), "must be at least 2")
    if not cfg.data.dev_file:
        raise InputError("--set", "data.dev_file", "name the SQuAD file to check the export "
                         "against")
    reader = load_reader(cfg, [model])  # predict's refusals, its encoding
    eager = reader.models[model].cpu()
    source, where = locations(model)
    variant = cfg.network_of(model) if model in TRAINED else \
        reads.read_json(Path(model) / package_dir.CONFIG)["variant"]
    dev = load_squad(cfg.data.dev_file, cfg.data.cache_dir, require_answers=False,
                     limits=cfg.limits)
    pairs = [(dev.contexts[q.context_index], q.question) for q in dev.questions[:questions]]
    if len(pairs) < 2:
        raise InputError(cfg.data.dev_file, "", "fewer than 2 questions to check against")
    data = reader.encoder.pairs(pairs, reader.para_limit)
    try:  # traced on the first three questions: each axis seen above 1, as it must be
        graph = export_graph(eager, data.collate(list(range(min(3, len(data))))))
    except FixedAxis as e:
        raise InputError(model, "", f"cannot be exported with a dynamic passage length: "
                         f"{e}") from None
    batches = bucket_batches(data.context_lengths(), EVAL_BATCH, shuffle=False)
    check = compare(eager, OnnxForward(graph), data, batches) | {
        "tolerance": tolerance, "data": cfg.data.dev_file}
    if not check["max_abs_diff"] <= tolerance:  # NaN fails too
        raise RunError(where / ONNX, "check", f"max abs difference {check['max_abs_diff']:.3g}"
                       f" from the eager model over {tolerance:g} on the first "
                       f"{check['questions']} questions of {cfg.data.dev_file}; not written")
    record = export_record(model, variant, source, graph, check)
    with output_set("export", [where]) as files:
        files.write(where / ONNX, graph)
        files.write_json(where / RECORD, record)
    log.info(f"export {model}: {where / ONNX}, max abs difference {check['max_abs_diff']:.2g} "
             f"on {check['questions']} questions ({len(check['shapes'])} batch shapes)")
    return record
