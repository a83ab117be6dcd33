"""Does the kit's slimmed Ray run? ray.init, a task and a Ray Train V2 run with one worker,
then which of the parts the kit cuts (box.RAY_MODULES_LEFT_OUT) got imported (none should).

    PYTHONPATH=UNPACKED_ARCHIVE python3.12 bench/gpu/ray_probe.py

Run in a Python 3.12 beside Ray's needs at uv.lock's versions (bench/gpu/README.md says
how); the dry run checks the same imports on this machine's Ray with those parts refused.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import ray
import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu.box import RAY_MODULES_LEFT_OUT as LEFT_OUT  # noqa: E402 - standard library only


@ray.remote
def double(x: int) -> int:
    return 2 * x


def loop(config: dict) -> None:
    ray.train.report({"ok": 1})


def main() -> None:
    t0 = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False)
    print("task:", ray.get(double.remote(21)), f"({time.monotonic() - t0:.1f} s)")
    with tempfile.TemporaryDirectory() as tmp:
        result = DataParallelTrainer(
            loop, scaling_config=ray.train.ScalingConfig(num_workers=1),
            run_config=ray.train.RunConfig(storage_path=tmp, name="probe")).fit()
    print("train:", "error " + str(result.error) if result.error else "done")
    loaded = sorted(m for m in sys.modules if m.startswith(LEFT_OUT))
    print("left-out parts imported:", loaded or "none")
    ray.shutdown()
    sys.exit(1 if result.error or loaded else 0)


if __name__ == "__main__":
    main()
