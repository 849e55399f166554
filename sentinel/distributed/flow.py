"""The relay's copy of the sim engine's per-step control flow, without the tensors.

`SimEngine._ready/_forward/_backward` decide, from which inbox slots are filled or dropped, what runs
next and which boundary messages exist. Those decisions depend on data only through the drops, and
the relay makes every drop decision itself, so it can run the very same bookkeeping under
`schedule.execute` and obtain sim's global message order -- message ids, the order the verifier
observes messages, bans -- exactly. Every inbox write sim makes (`act_in[s, mb]`, `grad_in[s, mb]`)
becomes a `post(kind, stage, mb, tensor or None)` to the rank hosting that slot's worker.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from sentinel.distributed.wire import KIND_ACT, KIND_GRAD
from sentinel.engine.schedule import Action
from sentinel.transport.message import Role

Carry = Callable[[int, int, Role, int, int], "torch.Tensor | None"]  # (mb, boundary, role, sender, receiver)
Post = Callable[[int, int, int, "torch.Tensor | None"], None]  # (kind, stage, mb, tensor or None = dropped)


class RelayFlow:
    """One step's inbox state: `True` = delivered, `False` = dropped (sim's DROPPED)."""

    def __init__(self, num_stages: int, plan: np.ndarray, carry: Carry, post: Post):
        self.num_stages, self.plan, self.carry, self.post = num_stages, plan, carry, post
        self.act_in: dict[tuple[int, int], bool] = {}
        self.grad_in: dict[tuple[int, int], bool] = {}
        self.skipped: set[tuple[int, int]] = set()

    def ready(self, a: Action) -> bool:  # == SimEngine._ready
        if a.kind == "F":
            return a.stage == 0 or (a.stage, a.mb) in self.act_in
        return a.stage == self.num_stages - 1 or (a.stage, a.mb) in self.grad_in or (a.stage, a.mb) in self.skipped

    def run(self, a: Action) -> None:
        (self._forward if a.kind == "F" else self._backward)(a.stage, a.mb)

    def _set(self, kind: int, s: int, mb: int, tensor: torch.Tensor | None) -> None:
        (self.act_in if kind == KIND_ACT else self.grad_in)[(s, mb)] = tensor is not None
        self.post(kind, s, mb, tensor)

    def _forward(self, s: int, mb: int) -> None:  # mirrors SimEngine._forward
        last = s == self.num_stages - 1
        if s > 0 and not self.act_in[(s, mb)]:
            self.skipped.add((s, mb))
            if not last:
                self._set(KIND_ACT, s + 1, mb, None)
            return
        self.act_in.pop((s, mb), None)
        if last:
            return  # the loss is computed on the last stage's rank
        delivered = self.carry(mb, s, Role.ACTIVATION, int(self.plan[mb, s]), int(self.plan[mb, s + 1]))
        if delivered is None:
            self._set(KIND_ACT, s + 1, mb, None)
            self._set(KIND_GRAD, s, mb, None)  # no backward will come for this microbatch
        else:
            self._set(KIND_ACT, s + 1, mb, delivered)

    def _backward(self, s: int, mb: int) -> None:  # mirrors SimEngine._backward
        if (s, mb) in self.skipped:
            return
        if s != self.num_stages - 1 and not self.grad_in.pop((s, mb)):
            if s > 0:
                self._set(KIND_GRAD, s - 1, mb, None)
            return
        if s == 0:
            return
        delivered = self.carry(mb, s - 1, Role.GRADIENT, int(self.plan[mb, s]), int(self.plan[mb, s - 1]))
        self._set(KIND_GRAD, s - 1, mb, delivered)
