"""A variant's start/end distributions over each question's context tokens, as `rcpipe
evaluate` writes them (predictions/<variant>.dists.parquet) for the mean and selected
ensembles (inference/ensemble.py): one row a question, of the held-out questions (to choose
on) and of dev (to answer).

Every variant reads the same prepared tokens (prepare tokenizes once), so the i-th entry of
two variants' p_start is the same token. A context read as windows has each token's
probabilities from the window that owns it (inference/reading.py's ``token_probs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rcpipe.errors import InputError

PARTS = ("heldout", "dev")
SCHEMA = pa.schema([("part", pa.string()), ("id", pa.string()),
                    ("p_start", pa.list_(pa.float32())), ("p_end", pa.list_(pa.float32())),
                    ("na_prob", pa.float64())])


@dataclass(frozen=True)
class Dist:
    p_start: np.ndarray  # (Lc,) float32
    p_end: np.ndarray  # (Lc,)
    na_prob: float  # p_start[0] * p_end[0] of the model's no-answer position


Dists = dict[str, dict[str, Dist]]  # part -> question id -> its distributions


def split_off(nbest: dict[str, dict[str, Any]]) -> dict[str, Dist]:
    """The distributions predict's ``token_probs`` added to ``nbest``'s entries, taken out
    of them (the n-best file keeps the answers only: a JSON list of floats a token would be
    ten times the Parquet)."""
    return {q: Dist(np.asarray(v.pop("p_start"), np.float32),
                    np.asarray(v.pop("p_end"), np.float32), float(v["na_prob"]))
            for q, v in nbest.items()}


def to_parquet(parts: Dists) -> bytes:
    rows = [(part, q, d) for part in PARTS for q, d in parts.get(part, {}).items()]
    table = pa.table({"part": [r[0] for r in rows], "id": [r[1] for r in rows],
                      "p_start": [r[2].p_start for r in rows],
                      "p_end": [r[2].p_end for r in rows],
                      "na_prob": [r[2].na_prob for r in rows]}, schema=SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def parse(data: bytes, name: Path | str) -> Dists:
    """A distributions file's bytes (read within limits.json_mb by the caller: reads.py);
    one located error, naming ``name``, for bytes that are not one."""
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as e:
        raise InputError(name, "", f"not a Parquet file ({e})") from None
    if not SCHEMA.equals(table.schema, check_metadata=False):
        raise InputError(name, "", f"not a distributions file: columns {table.schema.names}, "
                         f"expected {SCHEMA.names}")
    out: Dists = {part: {} for part in PARTS}
    cols = table.to_pydict()
    for i, (part, q) in enumerate(zip(cols["part"], cols["id"], strict=True)):
        p1, p2 = cols["p_start"][i], cols["p_end"][i]
        if part not in out or p1 is None or p2 is None or len(p1) != len(p2):
            raise InputError(name, f"row {i} ({q})", "unknown part or unequal distributions")
        out[part][q] = Dist(np.asarray(p1, np.float32), np.asarray(p2, np.float32),
                            float(cols["na_prob"][i]))
    return out
