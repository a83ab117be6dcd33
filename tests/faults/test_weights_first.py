"""Issue 43: a package's weights are checked against its config.json before anything is
allocated. A config.json asking for hidden 2048 and 6 layers beside 1.1 MB of weights
allocated 4.1 GB (within limits.parameters) before load_state_dict refused the weights;
the weights' names and shapes are now compared with the model described on torch's meta
device first. Run as a real process in 1 GiB of address space."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.faults.test_abuse import PKG, _config, _limited, assert_one_line
from tests.faults.test_abuse import here as here  # noqa: F401 - the fixtures, shared
from tests.faults.test_abuse import run_dir as run_dir  # noqa: F401


def test_a_config_asking_for_a_far_larger_model_is_refused_before_allocating(
        here: Path) -> None:  # noqa: F811
    big = "pkg_big"
    shutil.rmtree(here / big, ignore_errors=True)
    shutil.copytree(here / PKG, here / big)
    _config(model_config__hidden=2048, model_config__layers=6)(here / big)
    out = subprocess.run([sys.executable, "-m", "rcpipe", "predict", "--model", big,
                          "--question", "who?", "--context", "a b c"], cwd=here,
                         capture_output=True, text=True, timeout=120, preexec_fn=_limited,
                         env={**os.environ, "TERM": "dumb", "NO_COLOR": "1"})
    assert_one_line(out.returncode, out.stderr, out.stderr.strip())
    assert re.fullmatch(rf"error: {big}/model.safetensors: state_dict: \S+ is \[[\d, ]+\] in "
                        r"the weights, \[[\d, ]+\] in the model described: not the model "
                        r"config.json describes", out.stderr.strip()), out.stderr
