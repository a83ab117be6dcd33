"""prepare's tokenizing as Ray tasks spread over a cluster's nodes (data.on_ray).

spaCy is the slow part of preparing real text, and the only part whose cost grows with a
night's new articles; labelling, indexing and writing the Parquet parts stay in the driver,
which reads the inputs article by article. Each job of about 512 texts (token_cache.py's
runs of articles) is one task, ``spans_chunk`` on whichever node Ray's SPREAD strategy
picks; the driver keeps at most ``ahead`` tasks a cluster CPU in flight and takes their
offsets back in order (tokenize.in_order, as the local process pool does), so the prepared
folder equals one process's row for row: the same function on the same texts, in the same
order.

Plain tasks, not a Ray Data pipeline: the articles come from a streaming parser in the
driver (SQuAD JSON or JSON Lines, validated there first), in order, and each job's answer
must come back to its place; a task per job, a bounded window, is that with nothing
materialized. The workers need rcpipe and spaCy installed (the image has both), as Ray Train's
do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from typing import Any, TypeVar

import numpy as np

from rcpipe.cluster.ray_runtime import ray_cluster
from rcpipe.data.tokenize import in_order, spans_chunk

T = TypeVar("T")
log = logging.getLogger(__name__)


def _spans_on_a_node(texts: list[str]) -> tuple[list[np.ndarray], str]:
    """A job's offsets and the node that tokenized it (said in prepare's log)."""
    import ray

    return spans_chunk(texts), ray.get_runtime_context().get_node_id()


class RayTokenizer:
    """Tokenizer's contract (``spans``, a context) on the Ray cluster at ``address``
    (train.ray_address; RAY_ADDRESS; else a local Ray), joined for prepare's passes."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        self.nodes: set[str] = set()  # those that tokenized a job
        self._stack = ExitStack()

    def __enter__(self) -> RayTokenizer:
        import ray

        self._stack.enter_context(ray_cluster(self.address))
        self._task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_spans_on_a_node)
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        return self

    def __exit__(self, *_: Any) -> None:
        if self.nodes:
            log.info(f"prepare: tokenized on {len(self.nodes)} Ray node(s)")
        self._stack.close()

    def spans(self, jobs: Iterable[tuple[T, list[str]]], ahead: int = 2
              ) -> Iterator[tuple[T, list[np.ndarray]]]:
        """Each job's texts' (T, 2) token offsets, in order, ``ahead`` tasks a CPU of the
        cluster in flight."""
        import ray

        def get(ref: Any) -> list[np.ndarray]:
            spans, node = ray.get(ref)
            self.nodes.add(node)
            return spans

        yield from in_order(jobs, self._task.remote, get, self.cpus * ahead)

    def described(self) -> str:
        return f"Ray tasks over {self.cpus} CPU(s)"
