"""A trained model's forward as an ONNX graph (`rcpipe export`), and onnxruntime running it
in the model's place (`rcpipe serve --runtime onnx`, `rcpipe predict --runtime onnx`).

The graph is the forward alone: plain tensors in (``cw``, ``cc``, ``qw``, ``qc``: word and
char ids; ``words``, ``word_ids``, ``cu``, ``qu``: the batch's distinct words as collate lists
them, so the embedding runs once per distinct word as in eager inference; batch, lengths and
the number of distinct words dynamic), the span logits out (``start``, ``end`` and, SQuAD
v2.0, ``na``). A graph exported before the distinct words (four inputs) still runs: the
session is fed the inputs it names. ``OnnxForward`` wraps a session as an nn.Module taking
a Batch and returning ``SpanLogits``, so decoding, thresholds and the length prior stay
inference/reading.py's one path: the graph replaces ``model(batch)``, nothing after it.

    export_graph   torch.onnx.export (torch.export underneath) with dynamic axes; the fused
                   GRU/LSTM that torch.export sees as the custom op ``rcpipe::rnn``
                   (models/rnn.py) is written as ONNX's own GRU/LSTM (``rnn_to_onnx``)
    compare        the graph against the eager model on a dataset: the largest difference
                   of the start/end probabilities decoding reads
    model.onnx     beside the weights it came from (models/<V>/ or a package directory),
    export.json    with what it was made from and checked against (``export_record``);
                   ``load_onnx`` refuses a changed file or one exported from other weights

torch.onnx and onnxscript are imported to export only, onnxruntime to run: serving an
exported model needs neither the exporter nor any training code.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rcpipe import layout, reads
from rcpipe.config import TRAINED
from rcpipe.data.dataset import SquadDataset
from rcpipe.errors import InputError
from rcpipe.models.batch import Batch
from rcpipe.models.layers import SpanLogits

FORMAT = "rcpipe-onnx/1"
ONNX, RECORD = "model.onnx", "export.json"
TOKENS = ("cw", "cc", "qw", "qc")
WORDS = ("words", "word_ids", "cu", "qu")  # Batch's distinct words, where collate gave them
# each input's axes that vary from request to request; the char axis is the longest word's
AXES = {"cw": ("batch", "context"), "cc": ("batch", "context", "chars"),
        "qw": ("batch", "question"), "qc": ("batch", "question", "chars"),
        "words": ("distinct", "chars"), "word_ids": ("distinct",),
        "cu": ("batch", "context"), "qu": ("batch", "question")}


def graph_inputs(batch: Batch) -> tuple[str, ...]:
    """The Batch fields a graph traced on ``batch`` takes: the distinct words too where the
    batch lists them (collate's batches do)."""
    return TOKENS + (WORDS if batch.lists_words else ())


class SpanGraph(nn.Module):
    """A model's forward over plain tensors, what the graph holds: ``names`` the Batch fields
    they are, the masks the ids' non-padding (as data/dataset.py's collate makes them), the
    outputs SpanLogits' fields."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        given = dict(zip(self.names, tensors, strict=True))
        cw, qw = given["cw"], given["qw"]
        none = cw.new_full(cw.shape[:1], -1)  # (B,) labels the forward does not read
        batch = Batch([], cw, given["cc"], qw, given["qc"], cw != 0, qw != 0, none, none,
                      none != -1, **{k: given[k] for k in WORDS if k in given})
        out = self.model(batch)
        return (out.start, out.end) if out.na is None else (out.start, out.end, out.na)


def rnn_to_onnx(x: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, cell: str) -> Any:
    """``rcpipe::rnn`` (one direction, batch first, zero state) as ONNX's GRU or LSTM op:
    PyTorch's gate blocks (GRU r z n, LSTM i f g o) reordered to ONNX's (z r h, i o f c),
    a GRU resetting after its recurrent linear as PyTorch's does."""
    from onnxscript import opset18 as op

    order = {"gru": (1, 0, 2), "lstm": (0, 3, 1, 2)}[cell]
    h = w_hh.shape[1]

    def gates(w: Any) -> Any:
        return op.Concat(*(op.Slice(w, [i * h], [(i + 1) * h], [0]) for i in order), axis=0)

    w = op.Unsqueeze(gates(w_ih), [0])  # (1, G*H, D)
    r = op.Unsqueeze(gates(w_hh), [0])  # (1, G*H, H)
    b = op.Unsqueeze(op.Concat(gates(b_ih), gates(b_hh), axis=0), [0])  # (1, 2*G*H)
    steps = op.Transpose(x, perm=[1, 0, 2])  # (L, B, D)
    if cell == "gru":
        y = op.GRU(steps, w, r, b, hidden_size=h, linear_before_reset=1)[0]
    else:
        y = op.LSTM(steps, w, r, b, hidden_size=h)[0]  # (L, 1, B, H)
    return op.Transpose(op.Squeeze(y, [1]), perm=[1, 0, 2])  # (B, L, H)


class FixedAxis(ValueError):
    """The exported graph fixed an axis that must stay dynamic (a Python loop over it)."""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter's progress prints, warnings and log lines kept off the console."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo",
                                               "torch.fx", "onnxscript")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def export_graph(model: nn.Module, example: Batch) -> bytes:
    """The ONNX model of ``model``'s forward (eval mode), traced on ``example`` (at least two
    questions, two tokens, two chars: torch.export fixes an axis it sees at 1) with every
    axis of AXES dynamic; FixedAxis if the trace fixed one anyway."""
    from torch.export import Dim

    import rcpipe.models.rnn  # noqa: F401 - registers rcpipe::rnn, translated below

    looping = [n for n, m in model.named_modules() if getattr(m, "steps_in_python", False)]
    if looping:
        raise FixedAxis(f"{looping[0]} steps through the passage in a Python loop, which a "
                        "trace unrolls for one passage length")
    names = graph_inputs(example)
    dims = {name: Dim(name) for name in ("batch", "context", "question", "chars", "distinct")}
    # *tensors: one tuple of each positional input's dynamic axes
    shapes = (tuple({i: dims[a] for i, a in enumerate(AXES[k])} for k in names),)
    args = tuple(getattr(example, k).cpu() for k in names)
    graph = SpanGraph(model, names).eval()
    outputs = ["start", "end", "na"][: len(graph(*args))]
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            graph, args, dynamo=True, dynamic_shapes=shapes, input_names=list(names),
            output_names=outputs, verbose=False,
            custom_translation_table={torch.ops.rcpipe.rnn.default: rnn_to_onnx})
    proto = program.model_proto
    for value in proto.graph.input:
        if value.name not in AXES:
            continue
        for i, d in enumerate(value.type.tensor_type.shape.dim):
            if not d.dim_param:
                raise FixedAxis(f"the trace fixed {value.name}'s {AXES[value.name][i]} axis "
                                f"at {d.dim_value} (the model loops over it in Python)")
    return proto.SerializeToString()


class OnnxForward(nn.Module):
    """An exported graph run by onnxruntime, in a model's place: ``forward(batch)`` returns
    the SpanLogits the eager model would (CPU; ``threads`` intra-op threads, one inter-op)."""

    def __init__(self, graph: bytes, threads: int = 1, profile: str | None = None) -> None:
        super().__init__()
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0: onnxruntime's default (every core)
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only
        if profile:  # each node's time, in a JSON file under this prefix (docs/results/export.md)
            options.enable_profiling, options.profile_file_prefix = True, profile
        self.session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        # an input the forward never reads is not in the graph
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def forward(self, batch: Batch) -> SpanLogits:
        feeds = {k: getattr(batch, k).cpu().numpy() for k in self.inputs}
        out = dict(zip(self.outputs, self.session.run(self.outputs, feeds), strict=True))
        na = out.get("na")
        return SpanLogits(torch.from_numpy(out["start"]), torch.from_numpy(out["end"]),
                          None if na is None else torch.from_numpy(na))


def _probs(out: SpanLogits) -> torch.Tensor:
    p1, p2 = out.log_probs()  # (B, 1 + Lc) each
    return torch.stack([p1.exp(), p2.exp()])  # (2, B, 1 + Lc)


@torch.no_grad()
def compare(model: nn.Module, graph: nn.Module, dataset: SquadDataset,
            batches: Sequence[list[int]]) -> dict[str, Any]:
    """How far ``graph`` is from ``model`` on ``batches`` of ``dataset``: the largest
    absolute difference of p_start and p_end (over the no-answer slot and every context
    token, what decoding reads), and the batch shapes it saw."""
    model.eval()
    worst, shapes = 0.0, set()
    for indices in batches:
        batch = dataset.collate(indices)
        eager, onnx = _probs(model(batch)), _probs(graph(batch))
        worst = max(worst, float((eager - onnx).abs().max()))
        shapes.add(tuple(batch.cc.shape))
    return {"questions": sum(len(b) for b in batches), "max_abs_diff": worst,
            "shapes": [list(s) for s in sorted(shapes)]}


# --------------------------------------------------------------------- files and loading


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def locations(name: str) -> tuple[Path, Path]:
    """(the weights file ``name`` is exported from, the directory its model.onnx goes in):
    models/<V>/model.pt and models/<V>/ for a variant, DIR/model.safetensors and DIR for a
    package directory (the student's as a variant's)."""
    if name in TRAINED:
        return layout.model_file(name), layout.model_dir(name)
    from rcpipe.trained.package_dir import WEIGHTS

    return Path(name) / WEIGHTS, Path(name)


def export_record(name: str, variant: str, source: Path, graph: bytes,
                  check: dict[str, Any]) -> dict[str, Any]:
    """export.json: what the graph was made from and how it compared with the eager model."""
    import onnx
    import onnxruntime

    proto = onnx.load_model_from_string(graph)
    return {"format": FORMAT, "model": name, "variant": variant, "source": str(source),
            "source_sha256": sha256(source.read_bytes()), "onnx_sha256": sha256(graph),
            "opset": max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
            "inputs": {i.name: list(AXES[i.name]) for i in proto.graph.input},
            "outputs": [o.name for o in proto.graph.output], "check": check,
            "versions": {"torch": torch.__version__, "onnx": onnx.__version__,
                         "onnxruntime": onnxruntime.__version__}}


def load_onnx(name: str, threads: int = 1, profile: str | None = None) -> OnnxForward:
    """The exported graph of ``name`` (a variant or a package directory), refused unless
    model.onnx is the file export.json records and was exported from the weights there now."""
    source, where = locations(name)
    graph_file, record_file = where / ONNX, where / RECORD
    export = f"`rcpipe export --model {name}`"
    if not graph_file.is_file() or not record_file.is_file():
        missing = graph_file if not graph_file.is_file() else record_file
        raise InputError(missing, "", f"no such file: no exported model; run {export} first")
    record = reads.read_json(record_file)  # capped and depth bounded: one line
    try:
        graph = graph_file.read_bytes()
    except OSError as e:
        raise InputError(graph_file, "", f"cannot read ({e})"[:200]) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise InputError(record_file, "format", f"not {FORMAT!r}; run {export} again")
    if sha256(graph) != record.get("onnx_sha256"):
        raise InputError(graph_file, "", f"refused: its sha256 is not the one {RECORD} "
                         f"records (changed after export); run {export} again")
    if not source.is_file() or sha256(source.read_bytes()) != record.get("source_sha256"):
        raise InputError(graph_file, "", f"refused: exported from other weights than "
                         f"{source}; run {export} again")
    try:
        return OnnxForward(graph, threads, profile)
    except Exception as e:  # noqa: BLE001 - whatever onnxruntime cannot load, one refusal
        reason = " ".join(str(e).split())[:160]
        raise InputError(graph_file, "", f"refused: onnxruntime cannot load it ({reason})"
                         ) from None
