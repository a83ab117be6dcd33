"""What a checkpoint directory holds, in one place (written by rank 0, read by the driver).

    state.pt    everything a resumed run needs: model, optimizer, scheduler, EMA, the
                sampler position (epoch, batch within it), every rank's RNG state, the
                best dev score so far, the evaluation history, elapsed seconds
    model.pt    the servable model: variant, model config, data-side inputs, vocab digest
                and the weights (EMA weights where the variant keeps an EMA)
    meta.json   step, epoch, dev scores and history, for people and the driver

Both .pt files hold only tensors and plain containers, so they load with
``torch.load(weights_only=True)``: loading never unpickles arbitrary objects.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from rcpipe.config import ModelConfig
from rcpipe.models import ModelInputs, build_model

STATE, MODEL, META = "state.pt", "model.pt", "meta.json"


def model_payload(variant: str, model_config: ModelConfig, inputs: ModelInputs,
                  weights: dict[str, torch.Tensor], vocab_sha256: str) -> dict[str, Any]:
    return {"variant": variant, "model_config": model_config.model_dump(),
            "inputs": asdict(inputs) | {"vectors": None}, "vocab_sha256": vocab_sha256,
            "state_dict": {k: v.detach().cpu() for k, v in weights.items()}}


class PayloadMismatch(ValueError):
    """A saved model that does not fit what the caller asked for; ``field`` says where."""

    def __init__(self, field: str, what: str) -> None:
        super().__init__(what)
        self.field = field


def model_from_payload(saved: dict[str, Any], variant: str, vocab_sha256: str,
                       model_config: ModelConfig | None = None
                       ) -> tuple[nn.Module, ModelInputs]:
    """The model a payload holds, refusing another variant, vocabulary or (when
    ``model_config`` is given) another architecture than the params describe."""
    if saved.get("variant") != variant:
        raise PayloadMismatch("variant", f"holds {saved.get('variant')!r}, not {variant!r}")
    if saved.get("vocab_sha256") != vocab_sha256:
        raise PayloadMismatch("vocab_sha256", "trained on another vocabulary")
    if model_config is not None:
        # a field the file lacks came after it was written: the file was built with the
        # field's default, which building from the file uses again
        have = saved["model_config"]
        want = model_config.architecture()  # training-only fields may differ
        for k in want:
            if k in have and have[k] != want[k]:
                raise PayloadMismatch(f"model_config.{k}", f"{have[k]!r} in the file, "
                                      f"{want[k]!r} in models.{variant} of the params")
    inputs = ModelInputs(**{**saved["inputs"], "vectors": None})
    model = build_model(variant, ModelConfig.model_validate(saved["model_config"]), inputs)
    try:
        model.load_state_dict(saved["state_dict"])
    except RuntimeError as e:
        raise PayloadMismatch("state_dict", f"does not fit the model: {str(e)[:200]}") from None
    return model, inputs
