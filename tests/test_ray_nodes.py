"""tests/ray_nodes.py, the cluster tests' own helper: a `ray start` that fails is tried again
and, failing every time, says what Ray printed (CI once showed only "exit status 1")."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests import ray_nodes


@pytest.mark.integration
def test_a_start_that_keeps_failing_is_tried_again_and_names_what_ray_printed() -> None:
    short = Path(tempfile.mkdtemp(prefix="rn-", dir="/tmp"))
    tries = []

    def bad_args() -> list[str]:  # a flag `ray start` refuses before starting anything
        tries.append(1)
        return ["--no-such-flag"]

    with pytest.raises(RuntimeError, match=r"failed 3 times, exit 2; its last lines:\n"
                                           r"(.|\n)*no-such-flag"):
        ray_nodes.started(short / "head", ray_nodes.node_env({}), bad_args)
    assert len(tries) == 3
    assert not (short / "head").exists()  # each failed start cleared away
