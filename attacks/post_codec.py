"""Post-codec attacks: tampering with what a codec puts on the wire (`placement: post_codec`).

Threat model: a malicious sender runs the codec honestly, then edits the encoded message before it
leaves -- the parts of the wire format a verifier looking only at the decoded tensor may not expect
to move. Each attack below targets one codec's content field (registered here, see attacks/wire.py);
with `placement: pre_codec` (or another codec) it applies the same transform to the tensor it gets.

    topk_index      topk        permute the (value, index) pairing: values land on other top-k positions
    mask_seed       random_mask the sender masks with another seed: kept values land on wrong positions
    quant_scale     int8, int4  multiply the per-row scales of a fraction of rows by `factor`
    subspace_coeff  subspace    flip the sign of a fraction of the k coefficients (+ optional noise)
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from attacks.base import Attack, AttackContext, rms
from attacks.wire import register_wire_fields
from sentinel.config import spec
from sentinel.registry import ATTACKS

# content fields of the built-in codecs (tokens, indices and integer codes are never offered)
for _codec, _fields in {
    "fp16": ("x",),
    "bf16": ("x",),
    "int8": ("scale",),
    "int4": ("scale",),
    "topk": ("values",),
    "random_mask": ("v",),
    "subspace": ("c",),
}.items():
    register_wire_fields(_codec, _fields)

PIPELINE_ROLES = frozenset({"activation", "gradient"})


def _codecs_of(spec_role: str, scenario) -> set[str]:
    t = scenario.transport
    by_role = {"activation": (t.activation_codec or t.codec).name, "gradient": (t.gradient_codec or t.codec).name}
    roles = ("activation", "gradient") if spec_role == "both" else (spec_role,)
    return {by_role[r] for r in roles if r in by_role}


class _PostCodec(Attack):
    ROLES = PIPELINE_ROLES
    CODECS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check(cls, index, spec, scenario, malicious):
        if spec.placement != "post_codec":
            return []
        wrong = sorted(_codecs_of(spec.role, scenario) - set(cls.CODECS))
        if not wrong:
            return []
        return [
            (
                f"adversary.attacks[{index}].placement",
                f"{spec.name} tampers the wire format of "
                f"{' / '.join(cls.CODECS)}, but the {spec.role} codec is {', '.join(wrong)}; set transport.codec "
                f"to {cls.CODECS[0]!r} or use placement: pre_codec",
            )
        ]


def _shuffle(x: torch.Tensor, fraction: float, gen: torch.Generator) -> torch.Tensor:
    """Move a random `fraction` of the entries of x to each other's positions (a seeded derangement-ish cycle)."""
    flat = x.reshape(-1).clone()
    n = flat.numel()
    m = min(n, round(fraction * n))
    if m < 2:
        return flat.reshape(x.shape)
    chosen = torch.randperm(n, generator=gen)[:m]
    flat[chosen] = flat[chosen.roll(1)]  # each chosen entry takes the next chosen entry's value
    return flat.reshape(x.shape)


@ATTACKS.register("topk_index")
class TopKIndex(_PostCodec):
    """Top-k: re-pair values and indices, so kept values land on other top-k positions.

    Threat model: a post-codec sender on a `topk` link. Formula: for a random share `fraction` of the k
    pairs (v_j, i_j), v_j moves to the position i_{pi(j)} of another chosen pair (pi a cyclic shift).
    Exactly the same as permuting the index tensor; the decoded support, norm and value histogram are
    unchanged -- only which coordinate carries which value.
    """

    CODECS = ("topk",)
    NOOP = {"fraction": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        fraction: float = spec(1.0, ge=0, le=1, help="share of the (value, index) pairs re-paired")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        return _shuffle(x, self.config.fraction, ctx.generator())


@ATTACKS.register("mask_seed")
class MaskSeed(_PostCodec):
    """Random mask: values taken with another seed's mask, so they land on the wrong positions.

    Threat model: a post-codec sender on a `random_mask` link does not use the shared seed. The receiver
    still decodes with the shared mask, so each kept value is written where another value belonged.
    Formula: a random share `fraction` of the kept values is cyclically permuted (the values of a
    wrong mask are draws from other positions; the 1/q rescale and the support are unchanged).
    """

    CODECS = ("random_mask",)
    NOOP = {"fraction": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        fraction: float = spec(1.0, ge=0, le=1, help="share of the kept values that land on a wrong position")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        return _shuffle(x, self.config.fraction, ctx.generator())


@ATTACKS.register("quant_scale")
class QuantScale(_PostCodec):
    """Quantization: multiply the per-row scales of a random share of rows by `factor`.

    Threat model: a post-codec sender on an `int8` / `int4` link edits the float32 scales and leaves
    every integer code alone. Formula: s_r' = factor * s_r for rows r in a seeded subset of size
    round(fraction * R); the decoded row is x_r' = factor * x_r (factor -1: a per-row sign flip).
    Pre-codec, rows run over the last dimension of the tensor.
    """

    CODECS = ("int8", "int4")
    NOOP = {"factor": 1.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        factor: float = spec(-1.0, help="multiplier of the chosen rows' scales")
        fraction: float = spec(1.0, ge=0, le=1, help="share of the rows whose scale is changed")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x.reshape(-1, 1)
        n = rows.shape[0]
        chosen = torch.randperm(n, generator=ctx.generator())[: round(self.config.fraction * n)]
        mult = torch.ones(n, 1, dtype=x.dtype)
        mult[chosen] = self.config.factor
        return (rows * mult).reshape(x.shape)


@ATTACKS.register("subspace_coeff")
class SubspaceCoeff(_PostCodec):
    """Subspace: flip the sign of a share of the k coefficients (same ones for every token), plus noise.

    Threat model: a post-codec sender on a `subspace` link edits the coefficients c = U^T (h - E[tok]).
    Formula: c'_{..., j} = -c_{..., j} for a seeded set J of round(fraction * k) coordinates, then
    c' += eps * rms(c) * N(0, 1). The decoded h' stays in E[tok] + span(U) -- the set every honest
    message lies in under the lossless subspace codec -- so a span check cannot catch it.
    """

    CODECS = ("subspace",)
    NOOP = {"fraction": 0.0, "eps": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        fraction: float = spec(0.5, ge=0, le=1, help="share of the coefficient coordinates sign-flipped")
        eps: float = spec(0.0, ge=0, help="added Gaussian noise, relative to the coefficients' RMS")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        k = x.shape[-1] if x.dim() else 1
        gen = ctx.generator()
        flip = torch.randperm(k, generator=gen)[: round(self.config.fraction * k)]
        sign = torch.ones(k, dtype=x.dtype)
        sign[flip] = -1
        out = x * sign
        if self.config.eps > 0:
            noise = torch.randn(x.shape, generator=gen, dtype=torch.float32).to(x.dtype)
            out = out + self.config.eps * rms(x).to(x.dtype) * noise
        return out
