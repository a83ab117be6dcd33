"""The benches import each other by name (``from common import write``): run as scripts
(``python bench/NAME.py``) their folder is first on sys.path; imported as ``bench.NAME`` (the
tests, the GPU kit, ``python -m bench.peers``) this puts it there."""

import sys
from pathlib import Path

if (_here := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.append(_here)
