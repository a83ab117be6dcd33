"""What keeps a training step from running at a GPU's speed, counted on any machine.

A GPU step at the papers' sizes is a few milliseconds of arithmetic; what makes it slow is
the host: a launch per small op (kernels), a new graph per input shape (shapes), code a
compiler cannot capture (graph breaks) and the host waiting for the device's values (host
syncs). Each is counted here on the CPU as well as on CUDA, so `bench/train_speed.py
--audit` and the tests (tests/train/test_gpu_ready.py) show GPU readiness without a GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rcpipe.data.dataset import SquadDataset
from rcpipe.models.batch import Batch

# ops that hand a tensor's value to the host (.item(), int(t), bool(t), if t: ...) or
# whose output's shape depends on the data (nonzero, boolean indexing, masked_select,
# unique): on a GPU each waits for every kernel queued before it
_SYNC_TAGS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)
_SYNC_OPS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)


class HostSyncs(TorchDispatchMode):
    """Counts, by op, every host synchronisation dispatched inside the block (forward,
    backward and the optimiser alike: the autograd engine runs under the same mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func in _SYNC_OPS or any(tag in func.tags for tag in _SYNC_TAGS):
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def graph_breaks(model: torch.nn.Module, batch: Batch) -> dict[str, Any]:
    """Graphs and graph breaks torch.compile makes of the training forward (as
    `train.compile` traces it: RNN modules inside the graph), with each break's reason."""
    import torch._dynamo

    model.train()
    torch._dynamo.reset()
    out = torch._dynamo.explain(model)(batch)
    torch._dynamo.reset()
    return {"graphs": out.graph_count, "graph_breaks": out.graph_break_count,
            "reasons": sorted({_reason(r) for r in out.break_reasons})}


def _reason(r: Any) -> str:
    where = r.user_stack[-1] if r.user_stack else None
    at = f" ({where.filename.rsplit('/', 1)[-1]}:{where.lineno} {where.name})" if where else ""
    return f"{r.reason.splitlines()[0][:160]}{at}"


def kernels(step: Callable[[], Any], device: torch.device) -> int:
    """Kernels one call of ``step`` launches: CUDA kernels on a GPU; on the CPU the leaf
    operators the profiler records (what would each be a kernel launch on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.events()
    if device.type == "cuda":
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in events if e.name.startswith("aten::") and not any(
        c.name.startswith("aten::") for c in e.cpu_children))


def epoch_shapes(dataset: SquadDataset, batches: Iterable[Sequence[int]]
                 ) -> Counter[tuple[int, int, int]]:
    """How many batches of an epoch have each input shape (B, Lc, Lq)."""
    return Counter((len(b), *dataset.padded_shape(b)) for b in batches)
