"""The attack plugin interface: a tiny class with a frozen `Config`, a pure `apply` and optional state.

An attack is one tensor transform that a malicious *sender* applies to a message it sends::

    @register_attack("scaling")
    class Scaling(Attack):
        '''x * alpha (alpha = -1: the paper's sign flip).'''

        @dataclasses.dataclass(frozen=True, kw_only=True)
        class Config:
            alpha: float = spec(-1.0)

        def apply(self, x, ctx):
            return x * self.config.alpha

Contract (checked for every registered attack by tests/conformance/test_attacks.py):

- `apply(x, ctx)` returns a tensor of the same shape and dtype and never modifies `x` in place.
  Returning the very object `x` means "declined": the message is not tampered and no ground truth
  is written. Returning anything else (even equal values) means the attack *acted*.
- All randomness comes from `ctx.generator(...)` (seeded by scenario seed, attack index and the
  message identity) or `ctx.shared_generator(...)` (the same for every colluder), so runs replay.
- `observe(x, ctx)` sees the honest tensor of every message the attack could act on, after `apply`,
  whether or not it acted (history for delay / ALIE / IPM ...). Memory kept there must be bounded.
- `wants(ctx)` lets an attack gate itself (duty cycles, missing history); `ROLES` lists the
  directions it supports (validated in the scenario); `NOOP` gives parameters under which it acts
  but leaves every tensor unchanged (the conformance suite checks bit-identity with no attack).
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any, ClassVar

import numpy as np
import torch

from sentinel.transport.message import Role

ALL_ROLES = frozenset({"activation", "gradient", "dp_gradient"})
ROLE_NAMES = {Role.ACTIVATION: "activation", Role.GRADIENT: "gradient", Role.DP_GRADIENT: "dp_gradient"}


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def seeded_int(*key: int) -> int:
    """A 63-bit integer derived from a tuple of non-negative ints (stable across processes)."""
    state = np.random.SeedSequence([int(k) for k in key]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def torch_generator(*key: int) -> torch.Generator:
    return torch.Generator().manual_seed(seeded_int(*key))


@dataclasses.dataclass(frozen=True, slots=True)
class AttackContext:
    """What the sender knows about the message it is crafting (public facts plus its own identity).

    Attributes:
        step, mb_idx, boundary, role: the message identity (`mb_idx` is -1 and `boundary` the stage
            index for a DP-sync contribution).
        worker, receiver: sender and receiver ids ("" receiver for DP sync).
        seed: per-attack seed (scenario seed and the attack's index in `adversary.attacks`).
        since: steps since the attack's schedule `start`.
        colluders: ids of every worker running this attack (its coalition).
        field: which wire tensor is being tampered (post-codec), "" for the payload itself.
        num_stages: pipeline stages S (public).
    """

    step: int
    mb_idx: int
    boundary: int
    role: Role
    worker: str
    receiver: str = ""
    seed: int = 0
    since: int = 0
    colluders: frozenset[str] = frozenset()
    field: str = ""
    num_stages: int = 0

    @property
    def role_name(self) -> str:
        return ROLE_NAMES[self.role]

    @property
    def stream(self) -> tuple[str, int, int, str]:
        """Key of this sender's message stream (one per direction and boundary)."""
        return (self.worker, int(self.role), self.boundary, self.field)

    @property
    def slot(self) -> tuple[str, int, int, str, int]:
        """`stream` plus the microbatch slot."""
        return (*self.stream, self.mb_idx)

    def identity(self, *, shared: bool = False) -> tuple[int, ...]:
        worker = 0 if shared else _crc(self.worker) + 1
        return (self.seed, self.step, self.mb_idx + 1, self.boundary, int(self.role), worker, _crc(self.field))

    def generator(self, salt: int = 0) -> torch.Generator:
        """A torch.Generator unique to this message (and `salt`)."""
        return torch_generator(*self.identity(), salt)

    def shared_generator(self, salt: int = 0) -> torch.Generator:
        """Like `generator`, but identical for every colluder sending on the same (step, mb, boundary)."""
        return torch_generator(*self.identity(shared=True), salt)


class Attack:
    """Base class of every attack. Subclasses set `Config`, `ROLES`, `NOOP` and implement `apply`."""

    ROLES: ClassVar[frozenset[str]] = ALL_ROLES
    NOOP: ClassVar[dict[str, Any] | None] = None
    registry_name: ClassVar[str] = ""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        pass

    def __init__(self, config: Any = None):
        self.config = config if config is not None else self.Config()

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        """The tampered tensor (or `x` itself to decline). Must not modify `x`."""
        raise NotImplementedError

    def wants(self, ctx: AttackContext) -> bool:
        """Whether the attack chooses to act on this message (after the generic schedule allowed it)."""
        return True

    def observe(self, x: torch.Tensor, ctx: AttackContext) -> None:
        """See the honest tensor of a message this attack could act on (default: keeps nothing)."""

    def forced(self, ctx: AttackContext) -> bool:
        """True when the attack must act whatever the `prob` draw says (e.g. a colluder's undo)."""
        return False

    def attach_view(self, view: Any) -> None:
        """Receive a read-only detector view (white-box attacks only; see attacks/detector_view.py)."""

    @classmethod
    def check(cls, index: int, spec: Any, scenario: Any, malicious: list[str]) -> list[tuple[str, str]]:
        """Extra scenario rules for this attack: [(yaml path, message)]. Called by validation."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"


def rms(x: torch.Tensor) -> torch.Tensor:
    """Root mean square of a tensor (a 0-d tensor)."""
    return x.detach().pow(2).mean().sqrt()


def feature_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature mean and std over every dimension but the last (whole-tensor stats for 1-D)."""
    if x.dim() < 2:
        return x.mean(), x.std(unbiased=False)
    dims = tuple(range(x.dim() - 1))
    return x.mean(dim=dims, keepdim=True), x.std(dim=dims, unbiased=False, keepdim=True)
