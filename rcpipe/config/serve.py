"""The ``serve`` section: `rcpipe serve` on Ray Serve, its replicas, batches and deadlines."""

from __future__ import annotations

from pydantic import Field, model_validator

from rcpipe.config.section import Section


class Autoscaling(Section):
    """Ray Serve's autoscaling of each model's Reader: replicas between the bounds, as many
    as keep each one's requests in flight near the target."""

    min_replicas: int = Field(1, ge=0, description="replicas kept when idle (0: none)")
    max_replicas: int = Field(4, ge=1, description="replicas at the most")
    target_ongoing_requests: float = Field(
        16, gt=0, description="requests in flight a replica is sized for (a full batch)")

    @model_validator(mode="after")
    def _ordered(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} is over max_replicas "
                             f"{self.max_replicas}")
        return self


class ServeConfig(Section):
    """`rcpipe serve` on Ray Serve: each model a Reader deployment batching its requests,
    behind one ingress with the routes and the page (rcpipe/serve/deployments.py)."""

    replicas: int = Field(1, ge=1, le=64, description="each model's Reader replicas "
                          "(`--replicas`); ignored under autoscaling")
    autoscaling: Autoscaling | None = Field(None, description="replicas scaled with the "
                                            "load; None: a fixed `replicas`")
    replica_cpus: float = Field(1.0, ge=0, description="Ray CPUs a Reader replica holds "
                                "(0: placed anywhere; the service's threads are --threads)")
    replica_gpus: float = Field(0.0, ge=0, description="GPUs a Reader replica holds "
                                "(Ray's num_gpus; a fraction shares one): its model on CUDA; "
                                "0, the default: on the CPU")
    max_batch: int = Field(16, ge=1, le=1024, description="requests per forward pass "
                           "(a Reader's batch: what queued while the model computed)")
    batch_wait_ms: float = Field(5.0, ge=0, le=10_000, description="how long a batch "
                                 "waits to fill when fewer than max_batch are queued")
    timeout_s: float = Field(30.0, gt=0, description="from arrival to answer, else 504")
    max_pending: int = Field(1024, ge=1, description="requests a Reader replica holds "
                             "(its batch queue), and as many waiting for a replica, else 503")
    body_timeout_s: float = Field(10.0, gt=0, description="a request's body arrives whole "
                                  "within this, else 408 (a slow client)")
    champion_poll_s: float = Field(10.0, gt=0, description="the champion app "
                                   "(infra/kuberay/rayservice.yaml): how often each Reader "
                                   "replica reads champion.json for a new champion")
    keep_alive_s: int = Field(5, ge=1, description="an idle connection is closed after this")
    # uvicorn (Serve's proxy) has no deadline for a request's head: rcpipe/serve/guard.py
    # fronts it with these two, so a silent or trickling client cannot hold a descriptor
    header_timeout_s: float = Field(10.0, gt=0, description="a request's head arrives "
                                    "whole within this of its first byte (of the "
                                    "connection's opening, for the first), else 408 and "
                                    "close (rcpipe/serve/guard.py)")
    # a relayed connection is two descriptors (client, proxy): 4,096 of them fit the open-
    # file limits met in practice (20,000 here, 65,536 in many containers) with room to spare
    max_connections: int = Field(4096, ge=1, description="open client connections the "
                                 "guard holds; one more is answered 503 and closed")
