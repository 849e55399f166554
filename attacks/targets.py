"""Target corruption: a malicious last stage computes its loss on corrupted targets.

This is not a boundary tensor transform: the engine asks the adversary layer for the targets of the
last stage's loss (`AdversaryLayer.corrupt_targets`), and the corruption reaches the rest of the
pipeline through the gradient messages that stage then sends back. Those gradient messages are the
tampered messages recorded as ground truth (their norm ratio is NaN: the perturbation lives in the
labels, and the honest gradient is never computed).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from attacks.assignment import parse_worker
from attacks.base import Attack, AttackContext
from sentinel.config import spec
from sentinel.registry import ATTACKS


@ATTACKS.register("target_corruption")
class TargetCorruption(Attack):
    """A malicious last stage trains on corrupted targets (label flipping); needs `protect` without last.

    Formula: a seeded Bernoulli(fraction) mask picks target tokens y_i, which become
    (y_i + shift) mod V (`mode: shift`) or a uniform random token (`mode: random`); V is the data
    source's vocabulary. Threat model: the last stage holds the head and the loss, so it sees the
    targets; the paper's threat model keeps it honest, hence `adversary.protect` must drop `last`.
    Role: `gradient` (the gradients it sends back are the corrupted messages).
    """

    ROLES = frozenset({"gradient"})
    NOOP = {"fraction": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        mode: Literal["shift", "random"] = spec("shift", help="shift every chosen label, or draw a random one")
        fraction: float = spec(1.0, ge=0, le=1, help="share of target tokens corrupted")
        shift: int = spec(1, ge=1, help="mode shift: y -> (y + shift) mod vocab")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        return x  # acts on targets through `corrupt`, never on a message tensor directly

    def corrupt(self, targets: torch.Tensor, ctx: AttackContext, vocab: int) -> torch.Tensor:
        """Corrupted copy of `targets` (integer token ids)."""
        gen = ctx.generator(salt=0x7A6)
        mask = (torch.rand(targets.shape, generator=gen) < self.config.fraction).to(targets.device)
        if self.config.mode == "shift":
            bad = (targets + self.config.shift) % vocab
        else:
            bad = torch.randint(0, vocab, targets.shape, generator=gen, dtype=targets.dtype).to(targets.device)
        return torch.where(mask, bad, targets)

    @classmethod
    def check(cls, index, spec, scenario, malicious):
        path, last = f"adversary.attacks[{index}]", scenario.pipeline.stages - 1
        if scenario.pipeline.stages < 2:
            return [
                (
                    f"{path}.name",
                    "target_corruption needs pipeline.stages >= 2 (it acts through the last stage's gradient messages)",
                )
            ]
        if "last" in scenario.adversary.protect:
            return [
                (
                    "adversary.protect",
                    f"attack {index} (target_corruption) needs a malicious last stage, which "
                    "protect keeps honest: remove 'last' from adversary.protect",
                )
            ]
        runners = spec.workers or malicious
        if not any((parse_worker(w) or (-1, -1))[0] == last for w in runners):
            return [
                (
                    f"{path}.workers",
                    f"no worker running target_corruption is in the last stage (s{last}r*); "
                    "list one in adversary.workers / this attack's workers",
                )
            ]
        return []
