"""Harmful directions for the adaptive and colluding attacks: x' = x + a * D(x) with ||D(x)|| = ||x||,
so `a` is the relative perturbation norm ||x' - x|| / ||x||.

- `negate`: D(x) = -x. a = 1 zeroes the message, a = 2 is the full sign flip; the perturbation is
  aligned with the content, so its effect on training is direct.
- `random`: D(x) = ||x|| u / ||u||, u a seeded Gaussian direction fixed per sender stream (boundary,
  role) for `refresh` steps (0 = for the whole run). A fixed direction accumulates over steps.
- `shared`: as `random`, but u is seeded without the sender's id: every colluder on the same
  boundary and direction pushes the *same* way (same-direction collusion), so their perturbations
  add up across replicas and microbatches instead of averaging out.
"""

from __future__ import annotations

from typing import Literal

import torch

from attacks.base import AttackContext, _crc, torch_generator

DirectionKind = Literal["negate", "random", "shared"]
_DIR_SALT = 0xD1E


class Directions:
    """Returns D(x) for one attack instance; caches one unit direction per stream (bounded memory)."""

    def __init__(self, kind: str, refresh: int = 0):
        self.kind, self.refresh = kind, refresh
        self._cache: dict[tuple, tuple[int, torch.Tensor]] = {}

    def unit(self, shape: torch.Size, ctx: AttackContext) -> torch.Tensor:
        """The seeded unit-norm direction for this sender stream (or coalition) at this step."""
        epoch = ctx.since // self.refresh if self.refresh else 0
        who = 0 if self.kind == "shared" else _crc(ctx.worker) + 1
        key = (who, ctx.boundary, int(ctx.role), ctx.field, tuple(shape))
        hit = self._cache.get(key)
        if hit is None or hit[0] != epoch:
            gen = torch_generator(ctx.seed, _DIR_SALT, who, ctx.boundary, int(ctx.role), _crc(ctx.field), epoch)
            u = torch.randn(tuple(shape), generator=gen, dtype=torch.float64)
            hit = self._cache[key] = (epoch, u / u.norm())
        return hit[1]

    def __call__(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        if self.kind == "negate":
            return -x
        u = self.unit(x.shape, ctx)
        return (u * x.detach().double().norm()).to(dtype=x.dtype, device=x.device)
