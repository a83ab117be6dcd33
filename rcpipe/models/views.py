"""What an attention view is: where `rcpipe explain` finds a model's attention weights.

Each family module declares ``VIEWS: dict[variant, tuple[ViewSpec, ...]]`` next to the layers
it names (models.views_of looks them up); render/attention_pass.py runs the model and reads them. No
torch here, so the report can name views without importing a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["question", "passage", "passage_weights"]

C2Q = "passage-question attention"  # the views' titles, alike across families
SELF = "passage self-attention"


@dataclass(frozen=True)
class ViewSpec:
    """Where a view's weights come from: ``keep_attention(module, name, ...)``, call ``call``."""

    module: str  # submodule path in the model
    name: str
    call: int  # a shared module runs several times per forward (QANet's encoders)
    kind: Kind  # question: (Lc, Lq) rows over the question; passage: (Lc, Lc); or (Lc,)
    title: str
    note: str
