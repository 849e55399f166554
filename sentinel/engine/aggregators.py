"""DP aggregators: how a stage combines its replicas' gradient contributions.

Interface: `agg(vectors, weights) -> vector`, with `vectors` (n, d) one row per contributing replica
(its local mean gradient) and `weights` (n,) the number of microbatches behind each row. `mean` uses
the weights, which makes it the exact all-reduce of the full-batch gradient; robust aggregators treat
rows as equals (each row is one replica's vote). `max_faulty(n)` states the domain rule.
"""

from __future__ import annotations

import dataclasses

import torch

from sentinel.registry import AGGREGATORS


class Aggregator:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        pass

    def __init__(self, config: Config | None = None):
        self.config = config if config is not None else self.Config()

    def __call__(self, vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def check_domain(cls, config, n: int, f: int) -> str | None:
        """Return a message when `f` faulty rows out of `n` cannot be tolerated, else None."""
        return None


@AGGREGATORS.register("mean")
class Mean(Aggregator):
    """Weighted mean sum_i (w_i / W) x_i: the plain all-reduce; tolerates no faulty replica."""

    def __call__(self, vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        w = weights.to(vectors.dtype) / weights.sum()
        if len(w) == 1:
            return vectors[0] * w[0]  # w[0] == 1 exactly: keeps R=1 bit-identical to no DP sync
        return (w[:, None] * vectors).sum(0)
