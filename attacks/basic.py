"""The paper's value attacks (SENTINEL, arXiv 2603.03592): constant, random, scaling, random_sign, bias,
invisible_noise. Each is stateless: the tampered tensor depends only on the honest one and a seeded draw.

Threat model shared by all of them: a malicious worker sees only the tensor it is about to send (its
own activation forward, or its own input-gradient backward, or its own DP-sync contribution) and
replaces it. It needs no knowledge of other workers or of the detector.
"""

from __future__ import annotations

import dataclasses

import torch

from attacks.base import Attack, AttackContext, feature_stats
from sentinel.config import spec
from sentinel.registry import ATTACKS


@ATTACKS.register("constant")
class Constant(Attack):
    """Replace the tensor by a constant (default 0: the paper's zero attack).

    Formula: x' = c (every coordinate). Shape and dtype preserved.
    """

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        value: float = spec(0.0, help="the constant c every coordinate is set to")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        return torch.full_like(x, self.config.value)


@ATTACKS.register("random")
class RandomValues(Attack):
    """Replace the tensor by Gaussian noise N(mu, sigma^2) (the paper's random attack).

    Formula: x'_i ~ N(mu, sigma^2) i.i.d., drawn from the message's seeded generator.
    """

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        mu: float = spec(0.0, help="mean of the replacement values")
        sigma: float = spec(1.0, ge=0, help="standard deviation of the replacement values")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        noise = torch.randn(x.shape, generator=ctx.generator(), dtype=torch.float32)
        return (noise * self.config.sigma + self.config.mu).to(dtype=x.dtype, device=x.device)


@ATTACKS.register("scaling")
class Scaling(Attack):
    """Multiply the tensor by alpha (alpha = -1 is the paper's sign flip).

    Formula: x' = alpha * x. No-op at alpha = 1.
    """

    NOOP = {"alpha": 1.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        alpha: float = spec(-1.0, help="scale factor; -1 flips the sign of every coordinate")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        return x * self.config.alpha


@ATTACKS.register("random_sign")
class RandomSign(Attack):
    """Flip the sign of a random fraction p of the coordinates.

    Formula: x'_i = -x_i with probability p (seeded Bernoulli mask), x_i otherwise. No-op at p = 0.
    """

    NOOP = {"p": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        p: float = spec(0.5, ge=0, le=1, help="fraction of coordinates whose sign is flipped")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        mask = torch.rand(x.shape, generator=ctx.generator()) < self.config.p
        return torch.where(mask.to(x.device), -x, x)


@ATTACKS.register("bias")
class Bias(Attack):
    """Add a constant bias b to every coordinate (the paper's bias attack).

    Formula: x' = x + b. No-op at b = 0.
    """

    NOOP = {"b": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        b: float = spec(1.0, help="added to every coordinate")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        return x + self.config.b


@ATTACKS.register("invisible_noise")
class InvisibleNoise(Attack):
    """Mix in noise matched to the message's own per-feature mean and std: statistics kept, content lost.

    Formula, with mu_f and sigma_f the per-feature (last dimension) mean and std of the message itself
    and eps ~ N(0, 1):  x' = mu + sqrt(1 - r) (x - mu) + sqrt(r) sigma eps, written as
    x' = x + (sqrt(1 - r) - 1)(x - mu) + sqrt(r) sigma eps so that r = 0 is bit-identical to x.
    Mean and variance of every feature are preserved in expectation; the correlation with the honest
    content is sqrt(1 - r) (0.1 at the paper's r = 0.99). A 1-D tensor (DP sync) is one feature.
    """

    NOOP = {"ratio": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        ratio: float = spec(0.99, ge=0, le=1, help="share r of the variance replaced by matched noise")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        r = self.config.ratio
        mu, sigma = feature_stats(x)
        eps = torch.randn(x.shape, generator=ctx.generator(), dtype=torch.float32).to(dtype=x.dtype, device=x.device)
        keep = (1.0 - r) ** 0.5 - 1.0
        return x + (keep * (x - mu) + (r**0.5) * sigma * eps)
