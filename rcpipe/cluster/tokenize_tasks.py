"""prepare's spaCy and labelling as Ray tasks spread over a cluster's nodes (data.on_ray).

The driver reads the inputs article by article (a streaming parser: SQuAD JSON or JSON
Lines, validated there first) and writes the Parquet parts; what costs CPU in between runs
as tasks on whichever node Ray's SPREAD strategy picks: pass (b)'s jobs of about 512 texts
(token_cache.py's runs of articles, ``spans_chunk``) and pass (d)'s batches of about 1,024
questions (stages/data.py's ``labelled``: an Arrow table back). The driver keeps
at most ``ahead`` tasks a cluster CPU in flight and takes their answers back in order
(tokenize.in_order, as the local process pool does), so the prepared folder equals one
process's row for row: the same functions on the same inputs, in the same order.

Plain tasks, not a Ray Data pipeline: the articles come in order from the driver's parser
and each answer must go back to its place; a task per job in a bounded window is that, with
nothing materialized. The workers need rcpipe and spaCy installed (the image has both), as
Ray Train's do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from typing import Any, TypeVar

import numpy as np

from rcpipe.cluster.ray_runtime import ray_cluster
from rcpipe.data.tokenize import in_order, spans_chunk

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")
log = logging.getLogger(__name__)


def _work_on_a_node(work: Callable[[A], R], arg: A) -> tuple[R, str]:
    """``work(arg)`` and the node that ran it."""
    import ray

    return work(arg), ray.get_runtime_context().get_node_id()


class RayTokenizer:
    """Tokenizer's contract (``spans``, ``mapped``, a context) on the Ray cluster at ``address``
    (train.ray_address; RAY_ADDRESS; else a local Ray), joined for prepare's passes."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        # the nodes that ran a task of each pass
        self.nodes: dict[str, set[str]] = {"tokenized": set(), "labelled": set()}
        self._stack = ExitStack()

    def __enter__(self) -> RayTokenizer:
        import ray

        self._stack.enter_context(ray_cluster(self.address))
        self._work = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_work_on_a_node)
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        return self

    def __exit__(self, *_: Any) -> None:
        if any(self.nodes.values()):
            log.info("prepare: " + ", ".join(f"{did} on {len(nodes)} Ray node(s)"
                                             for did, nodes in self.nodes.items()))
        self._stack.close()

    def spans(self, jobs: Iterable[tuple[T, list[str]]], ahead: int = 2
              ) -> Iterator[tuple[T, list[np.ndarray]]]:
        """Each job's texts' (T, 2) token offsets, in order, ``ahead`` tasks a CPU of the
        cluster in flight."""
        yield from self._in_tasks(jobs, spans_chunk, "tokenized", ahead)

    def mapped(self, jobs: Iterable[tuple[T, A]], work: Callable[[A], R], ahead: int = 2
               ) -> Iterator[tuple[T, R]]:
        """``work(arg)`` of each job in a task (pass (d): a batch labelled and indexed), in
        order."""
        yield from self._in_tasks(jobs, work, "labelled", ahead)

    def _in_tasks(self, jobs: Iterable[tuple[T, Any]], work: Callable[[Any], Any], did: str,
                  ahead: int) -> Iterator[tuple[T, Any]]:
        """``work(arg)`` of each job as a task, answers in order, ``work`` (the vocabularies
        with pass (d)'s) sent to the cluster once. An empty job (its articles all in the
        token cache) is no task: its answer is []."""
        import ray

        shared = ray.put(work)

        def get(ref: Any) -> Any:
            if ref is None:
                return []
            done, node = ray.get(ref)
            self.nodes[did].add(node)
            return done

        yield from in_order(jobs, lambda arg: self._work.remote(shared, arg) if arg else None,
                            get, self.cpus * ahead)

    def described(self) -> str:
        return f"Ray tasks over {self.cpus} CPU(s)"
