"""The prepared Parquet's columns: written by features.py, read by dataset.py.

Apart from features.py so that reading prepared data (dataset.py, a training worker, a GPU
box with only PyTorch, numpy and pyarrow) never imports the tokenizer's spaCy.
"""

from __future__ import annotations

import pyarrow as pa

IDS = pa.list_(pa.int32())  # a list of token or char ids
SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("context", pa.string()),
        pa.field("question", pa.string()),
        pa.field("context_word_ids", IDS),  # (Lc,)
        pa.field("context_char_ids", pa.list_(IDS)),  # (Lc, <=char_limit)
        pa.field("context_starts", IDS),  # (Lc,) char offset of each token
        pa.field("context_ends", IDS),  # (Lc,) one past its last char
        pa.field("question_word_ids", IDS),  # (Lq,)
        pa.field("question_char_ids", pa.list_(IDS)),  # (Lq, <=char_limit)
        pa.field("y1", pa.int32()),  # answer start token, -1 when none
        pa.field("y2", pa.int32()),  # answer end token (inclusive), -1 when none
        pa.field("is_impossible", pa.bool_()),
        pa.field("answers", pa.list_(pa.string())),  # gold texts, for inspection
    ],
    metadata={"rcpipe": "prepared SQuAD split, one row per question"},
)
