"""The ``train`` section: how every variant trains (workers, steps, devices, compile)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rcpipe.config.section import Section


class Buckets(Section):
    """The lengths a training batch is padded to: its longest context (question) rounded up
    to the next edge. A few fixed shapes let torch.compile and CUDA graphs build one graph
    per shape (at most len(context) * len(question) of them) instead of one per batch."""

    context: tuple[int, ...] = Field(description="context edges in tokens, increasing; the "
                                     "last at least data.limits.para")
    question: tuple[int, ...] = Field(description="question edges, increasing; the last at "
                                      "least data.limits.question")

    @field_validator("context", "question")
    @classmethod
    def _increasing(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(e <= 0 for e in v) or list(v) != sorted(set(v)):
            raise ValueError("must be positive lengths in increasing order")
        return v


# train.* keys that say where or how fast a run goes, not what it learns: no training key
# holds them (rcpipe/fingerprints.py) and dvc.yaml's train stage lists every other one
UNKEYED = frozenset({"device", "threads", "cpus_per_worker", "ray_address", "storage_path",
                     "max_failures", "keep_checkpoints", "keep_runs"})


class TrainConfig(Section):
    num_workers: int = Field(1, ge=1, description="Ray Train workers (one per GPU on a cluster)")
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, gt=0, description="global batch, split across workers")
    seed: int = Field(42, ge=0, description="torch's and numpy's seed (each rank adds "
                      "1000 * its rank; numpy takes no negative one)")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    eval_every: int = Field(0, ge=0, description="steps between dev evaluations and "
                            "checkpoints (also at every epoch end); 0: per epoch only")
    keep_checkpoints: int = Field(2, ge=1, description="best K checkpoints by dev F1 kept "
                                  "(the latest is always kept too, for resuming)")
    max_steps: int = Field(0, ge=0, description="stop after this many steps; 0: no limit")
    max_minutes: float = Field(0, ge=0, description="stop after this long; 0: no limit")
    threads: int = Field(0, ge=0, description="torch CPU threads per worker; 0: its CPU share")
    cpus_per_worker: float = Field(0, ge=0, description="Ray CPUs per worker; 0: the "
                                   "cluster's CPUs / num_workers on CPU, 1 with GPUs")
    ray_address: str | None = Field(None, description="a running Ray cluster: its "
                                    "dashboard http://head:8265 (each variant a Ray job, "
                                    "through the Jobs API), or 'auto' on one of its nodes; "
                                    "None: start a local one")
    storage_path: str | None = Field(None, description="checkpoint storage, a directory or "
                                     "s3://bucket/prefix; None: models/ here")
    max_failures: int = Field(2, ge=0, description="restarts of a run whose worker died")
    keep_runs: int = Field(2, ge=1, description="training runs of a variant whose "
                           "checkpoints are kept (the newest; each run is keyed on what "
                           "it was trained from: rcpipe/runs.py)")
    patience: int = Field(0, ge=0, description="early stopping: stop after this many dev "
                          "evaluations without a better F1; 0: never")
    tf32: bool = Field(True, description="TF32 matmuls and convolutions on CUDA (fp32 "
                       "weights and activations; models.<variant>.bf16 is mixed precision)")
    compile: Literal["off", "default", "reduce-overhead"] = Field(
        "off", description="torch.compile the training step: the model's forward and "
        "backward, and the optimiser step with the EMA; reduce-overhead adds CUDA graphs "
        "(one per input shape: set train.buckets)")
    compile_backend: Literal["inductor", "aot_eager"] = Field(
        "inductor", description="torch.compile's backend: inductor generates the kernels; "
        "aot_eager captures the same graphs (forward and backward) and runs them eagerly: "
        "a check that a model compiles, in seconds instead of minutes on a CPU")
    buckets: Buckets | None = Field(None, description="pad training batches to these "
                                    "lengths (a few fixed shapes); None: each batch to its "
                                    "own longest context and question")
    # ~5 KB a row held: 32,768 rows is ~160 MB a rank, whatever the split's size; a split
    # that fits (SQuAD's article split, the demo) is shuffled whole, as before the streams
    shuffle_buffer: int = Field(32_768, gt=0, description="training rows a rank holds at "
                                "once: its stream is shuffled and bucketed by length within "
                                "this many (data/stream.py)")

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_words(cls, v: object) -> object:
        # YAML reads `off` and `false` as False, and older params files said `compile: true`
        return {False: "off", True: "default"}.get(v, v) if isinstance(v, bool) else v
