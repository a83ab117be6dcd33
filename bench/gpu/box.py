"""The GPU box's Python, as the kit sees it: what its image holds, what the kit adds, and a
stand-in for it here (a Python that cannot import anything else) for the CPU dry run.

The image's packages (bench/gpu/image.txt) were read off a machine running it on 2026-11-17
(/work/.library/device/KINDS.md): Python 3.12 with torch, numpy, pyarrow, PyYAML, rich and
typer, and no spaCy, Prefect, DVC, boto3, Ray or pydantic.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

# the image's distributions, one a line (bench/gpu/image.txt: data read off a machine)
IMAGE = frozenset(line for line in (Path(__file__).with_name("image.txt").read_text()
                                    .splitlines()) if line and not line.startswith("#"))

# what `import rcpipe.train.local` and `import ray.train.torch` need that the image lacks:
# pydantic and its parts, Ray's jsonschema and its parts (dvclive, for the live curve, is
# left out: it pulls in DVC; without it the curve is written at the end only). The image
# has typing-extensions, but pydantic-core wants a recent one: the lock's travels too
WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection",
          "typing-extensions", "jsonschema", "jsonschema-specifications", "referencing",
          "rpds-py")
RAY = "ray"  # its own part of the kit: one wheel larger than a call carries, slimmed
# what Ray Train on one node never loads, cut from Ray's wheel before it is packed (the Java
# workers' jars alone are 33 MB that xz cannot shrink): the dry run imports with these
# packages missing (RAY_MODULES_LEFT_OUT), so a Ray upgrade that starts to need one fails here
RAY_MODULES_LEFT_OUT = ("ray.rllib", "ray.serve", "ray.llm")
RAY_LEFT_OUT = ("ray/jars", "ray/dashboard/client",
                *(m.replace(".", "/") for m in RAY_MODULES_LEFT_OUT))

# bench/peers.py's two peers, carried in the base (gpu-kit/base/peers/<dir>/): from each
# checkout outside the repo, a `git archive` of the commit bench/peers.py is measured at,
# only the files its import reaches (and the licence), nothing of them committed here; with
# them the real-text batch both sides read, tokenized here (the box has no spaCy)
PEERS = {  # rcpipe variant: (repository, commit, directory in the kit, files)
    "bidaf": ("chrischute/squad", "85623ad", "chrischute-squad",
              ("LICENSE", "models.py", "layers.py", "util.py")),
    "qanet": ("BangLiu/QANet-PyTorch", "0ce11ca", "BangLiu-QANet-PyTorch",
              ("LICENSE", "model/__init__.py", "model/QANet.py", "model/modules/__init__.py",
               "model/modules/cnn.py", "model/modules/attention.py",
               "model/modules/position.py")),
}
PEER_TEXT = "text.pt"  # bench/peer_text.save_text_batch's file, beside the peers


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_modules() -> set[str]:
    """The top-level modules installed here whose distributions the box would not have (in
    neither its image nor the kit; rcpipe itself travels as the working tree)."""
    there = {_norm(n) for n in (*IMAGE, *WHEELS, RAY, "rcpipe")}
    return {module for module, dists in importlib.metadata.packages_distributions().items()
            if module.isidentifier() and not any(_norm(d) in there for d in dists)}


BLOCKER = '''"""Imports as on the GPU box: what it would lack is not found (bench/gpu/box.py)."""
import importlib.abc
import sys

MISSING = frozenset({missing!r})
LEFT_OUT = {left_out!r}  # the parts of Ray the kit cuts from its wheel
UNDER = tuple(m + "." for m in LEFT_OUT)


class _Box(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in MISSING or name in LEFT_OUT or name.startswith(UNDER):
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU box)",
                                      name=name)


sys.meta_path.insert(0, _Box())
'''


def stand_in(folder: Path) -> Path:
    """A sitecustomize.py in ``folder``: a Python with ``folder`` first on PYTHONPATH (and
    each child started with that environment) imports only what the box would have."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sitecustomize.py"
    path.write_text(BLOCKER.format(missing=sorted(missing_modules()),
                                   left_out=RAY_MODULES_LEFT_OUT))
    return path
