"""Replay attacks: send an honest tensor, but the wrong one. Statistically perfect, semantically wrong.

Both keep per-sender buffers of the sender's *own* honest messages (what a real malicious worker
could store), bounded as stated in each class.
"""

from __future__ import annotations

import collections
import dataclasses

import torch

from attacks.base import Attack, AttackContext
from sentinel.config import spec
from sentinel.registry import ATTACKS


@ATTACKS.register("delay")
class Delay(Attack):
    """Replay the worker's own message from d steps earlier, same microbatch slot (the paper's delay).

    Formula: x'(t, m) = x(t', m) with t' the latest step <= t - d at which this worker sent slot m on
    this boundary and direction (with random routing it may not have been routed m at exactly t - d).
    Declines until such a message exists. Memory: at most d + 1 tensors per (slot, boundary, role)
    of each malicious worker.
    """

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        d: int = spec(10, ge=1, help="age in steps of the replayed message (the paper used ~100 of 5000)")

    def __init__(self, config=None):
        super().__init__(config)
        self._buf: dict[tuple, collections.deque] = {}

    def _stale(self, ctx: AttackContext) -> torch.Tensor | None:
        found = None
        for step, x in self._buf.get(ctx.slot, ()):
            if step <= ctx.step - self.config.d:
                found = x
        return found

    def wants(self, ctx: AttackContext) -> bool:
        return self._stale(ctx) is not None

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        stale = self._stale(ctx)
        if stale is None or stale.shape != x.shape:
            return x  # nothing old enough (or a different shape): decline
        return stale.clone()

    def observe(self, x: torch.Tensor, ctx: AttackContext) -> None:
        buf = self._buf.setdefault(ctx.slot, collections.deque())
        buf.append((ctx.step, x.detach().clone()))
        # Entries older than the newest one that is already >= d steps old at the next step are dead.
        while len(buf) >= 2 and buf[1][0] <= ctx.step + 1 - self.config.d:
            buf.popleft()


@ATTACKS.register("replay_other")
class ReplayOther(Attack):
    """Send a different microbatch's honest tensor (mimic / replay, Byzantine-ML literature).

    Formula: x'(t, m) = the sender's most recent honest message on this boundary and direction, which
    belongs to another microbatch (an earlier slot of this step, or the previous step it was routed).
    Unlike `delay` it is fresh -- current parameters, current statistics -- but carries another
    sequence's content. Declines until the sender has sent one message. Memory: one tensor per
    (boundary, role) of each malicious worker.
    """

    ROLES = frozenset({"activation", "gradient"})

    def __init__(self, config=None):
        super().__init__(config)
        self._last: dict[tuple, torch.Tensor] = {}

    def wants(self, ctx: AttackContext) -> bool:
        return ctx.stream in self._last

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        other = self._last.get(ctx.stream)
        if other is None or other.shape != x.shape:
            return x
        return other.clone()

    def observe(self, x: torch.Tensor, ctx: AttackContext) -> None:
        self._last[ctx.stream] = x.detach().clone()
