"""Attacks from the Byzantine-ML literature, adapted to pipeline parallelism: ALIE and IPM.

In DP aggregation these attacks use the mean and std of the *honest workers'* vectors. A PP worker
sees no other worker's messages, so here mu and sigma are estimated from the attacker's own recent
honest messages on the same boundary and direction (a sliding window), the reading given in
shared/PAPERS.md section 6. Memory: `window` tensors per (boundary, role) of each malicious worker.
"""

from __future__ import annotations

import collections
import dataclasses

import torch

from attacks.base import Attack, AttackContext
from sentinel.config import spec
from sentinel.registry import ATTACKS


class _History(Attack):
    """Keeps the last `window` honest tensors of each of the sender's streams."""

    MIN_HISTORY = 1

    def __init__(self, config=None):
        super().__init__(config)
        self._hist: dict[tuple, collections.deque] = {}

    def _stack(self, ctx: AttackContext, shape: torch.Size) -> torch.Tensor | None:
        hist = [h for h in self._hist.get(ctx.stream, ()) if h.shape == shape]
        return torch.stack(hist) if len(hist) >= self.MIN_HISTORY else None

    def wants(self, ctx: AttackContext) -> bool:
        return len(self._hist.get(ctx.stream, ())) >= self.MIN_HISTORY

    def observe(self, x: torch.Tensor, ctx: AttackContext) -> None:
        hist = self._hist.setdefault(ctx.stream, collections.deque(maxlen=self.config.window))
        hist.append(x.detach().clone())


@ATTACKS.register("alie")
class ALIE(_History):
    """A Little Is Enough: mu + z * sigma from the attacker's own recent honest messages.

    Formula (Baruch et al. 2019): x' = mu + z * sigma, coordinate-wise, with mu and sigma the mean
    and std of the last `window` honest messages of this sender on this boundary and direction.
    Libraries disagree on z's default (it is often derived from n and f in DP); here it is exposed.
    Declines until two honest messages are stored.
    """

    MIN_HISTORY = 2

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        z: float = spec(1.0, help="how many standard deviations from the mean")
        window: int = spec(8, ge=2, le=1024, help="honest messages kept to estimate mu and sigma")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        hist = self._stack(ctx, x.shape)
        if hist is None:
            return x
        mu, sigma = hist.mean(0), hist.std(0, unbiased=False)
        return (mu + self.config.z * sigma).to(x.dtype)


@ATTACKS.register("ipm")
class IPM(_History):
    """Inner-product manipulation: minus eps times the running mean of the attacker's honest messages.

    Formula (Xie et al. 2020): x' = -eps * mu, mu the mean of the last `window` honest messages of
    this sender on this boundary and direction; its inner product with the honest direction is
    negative. Declines until one honest message is stored.
    """

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        eps: float = spec(0.5, gt=0, help="scale of the reversed mean")
        window: int = spec(8, ge=1, le=1024, help="honest messages kept to estimate the mean")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        hist = self._stack(ctx, x.shape)
        if hist is None:
            return x
        return (-self.config.eps * hist.mean(0)).to(x.dtype)
