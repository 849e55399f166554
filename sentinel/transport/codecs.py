"""Codecs: how a boundary tensor becomes bytes on the wire and back.

A codec is registered in `CODECS` and implements `encode(payload, ctx) -> Wire` and
`decode(wire, ctx) -> Tensor`. `ctx` carries the public facts both ends share (step, microbatch,
boundary, role, scenario seed, shape), from which e.g. a shared random mask can be derived so no
indices travel. `Wire.nbytes()` is the exact byte count charged to the link; `expected_nbytes(shape)`
states it as a formula (tests check the two agree).

Built-ins (compression rate for a float32 (B, T, C) activation in brackets):

    identity      float32 as is                                            [1x]
    fp16, bf16    cast to 16 bits                                          [2x]
    int8, int4    symmetric per-row quantization, one float32 scale/row   [~4x, ~8x]
    topk          the k largest |x| as values + int32 indices              [1 / (2 fraction)]
    random_mask   k = keep * n entries at positions drawn from a seed shared by both ends
                  (no indices travel), same mask forward and backward     [1 / keep]
    subspace      c = U^T (h - E[tokens]) with a fixed random orthonormal U  [rate]  (subspace.py)

A codec may also be a `StepHook` (sentinel/engine/hooks.py) when it needs the engine (the subspace
codec reads the step's tokens and can project the model's weights after each optimizer step).
For a detector looking at the compressed representation (`detector.view: wire`), the transport puts
the Wire in `msg.meta["wire"]` and `codec.wire_view(wire, ctx)` (one float tensor) in
`msg.meta["wire_view"]`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import numpy as np
import torch

from sentinel.config import spec
from sentinel.registry import CODECS
from sentinel.transport.message import Role, Wire

VALUE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True, slots=True)
class CodecContext:
    step: int
    mb_idx: int
    boundary: int
    role: Role
    seed: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def derive_seed(*key: int) -> int:
    """A 63-bit seed from a tuple of non-negative ints (stable across processes and platforms)."""
    state = np.random.SeedSequence([int(k) for k in key]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def rows_of(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, row length) of a tensor seen as rows over its last dimension (a 0-d tensor is one row)."""
    if not shape:
        return 1, 1
    return numel(shape[:-1]), shape[-1]


class Codec:
    """Base class. Subclasses define `Config`, `encode`, `decode` and `expected_nbytes`.

    `random_positions`: the codec keeps a fresh pseudo-random subset of entries per message (whatever the
    data), so a replayed tensor is re-masked and never repeats exactly; the relay then checks replays on
    the positions two messages share (`detectors.replay.SparseReplayMemory`). Not for codecs whose kept
    positions follow the data (top-k keeps the same large entries of a stage whose weights barely move,
    with the same values: an honest repeat, seen under top-k 1%).

    `zeroes_tokens`: the codec drops entries, so a token can arrive exactly zero although its sender computed a
    non-zero one (top-k drops a small token whole; a random mask that keeps 10% of 64 entries drops every entry of
    a token with probability 0.9^64 ~ 1e-3, one 128-token message in seven). A detector that relates each token to
    the sender's input must not read such a token as the sender's doing (`DetectorEnv.zeroed_roles`).

    `projects_tokens(role)`: the codec delivers each token of that role as its projection onto a low-dimensional
    subspace, not the token (subspace: gradients always, activations unless the weights keep them in the subspace).
    What a token's projection keeps of its input's projection is then the stage's update seen through k of d
    dimensions, not what the stage passed on (`DetectorEnv.projected_roles`).
    """

    random_positions = False
    zeroes_tokens = False

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        pass

    def __init__(self, config: Config | None = None):
        self.config = config if config is not None else self.Config()

    def encode(self, payload: torch.Tensor, ctx: CodecContext) -> Wire:
        raise NotImplementedError

    def decode(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        raise NotImplementedError

    def expected_nbytes(self, shape: tuple[int, ...], role: Role = Role.ACTIVATION) -> int:
        """Exact wire bytes for an honest payload of `shape` (what `encode(...).nbytes()` returns)."""
        raise NotImplementedError

    def projects_tokens(self, role: Role) -> bool:
        """Whether a token of `role` arrives as its projection onto a low-dimensional subspace (see the class)."""
        return False

    def wire_view(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        """The compressed representation as one float tensor (what a `view: wire` detector reads)."""
        return next(iter(wire.tensors.values())).float()


@CODECS.register("identity")
class Identity(Codec):
    """Sends the tensor as is (float32 bytes on the wire)."""

    def encode(self, payload: torch.Tensor, ctx: CodecContext) -> Wire:
        return Wire({"x": payload})

    def decode(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        return wire.tensors["x"]

    def expected_nbytes(self, shape: tuple[int, ...], role: Role = Role.ACTIVATION) -> int:
        return 4 * numel(shape)

    def wire_view(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        return wire.tensors["x"]


class _Cast(Codec):
    DTYPE: torch.dtype = torch.float16

    def encode(self, payload: torch.Tensor, ctx: CodecContext) -> Wire:
        if self.DTYPE == torch.float16:  # saturate instead of overflowing to inf (|x| > 65504)
            payload = payload.clamp(-65504.0, 65504.0)
        return Wire({"x": payload.to(self.DTYPE)})

    def decode(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        return wire.tensors["x"].to(ctx.dtype)

    def expected_nbytes(self, shape: tuple[int, ...], role: Role = Role.ACTIVATION) -> int:
        return 2 * numel(shape)


@CODECS.register("fp16")
class Fp16(_Cast):
    """Cast to IEEE half precision: relative error <= 2^-11 in [6.1e-5, 65504]; saturates beyond 65504."""

    DTYPE = torch.float16


@CODECS.register("bf16")
class Bf16(_Cast):
    """Cast to bfloat16: float32's range, relative error <= 2^-8."""

    DTYPE = torch.bfloat16


class _Quantize(Codec):
    """Symmetric per-row quantization: s_r = max_j |x_rj| / qmax, q_rj = round(x_rj / s_r) in [-qmax, qmax].

    Decoded x'_rj = q_rj * s_r, so |x - x'| <= s_r / 2 per entry. Rows run over the last dimension
    (one row per token of a (B, T, C) activation). Inputs are made finite first (NaN -> 0, entries
    clamped to +-1e30), so a decoded message is always finite. Wire: the codes plus one float32 scale
    per row (content fields for post-codec attacks: `scale`).
    """

    BITS = 8

    @property
    def qmax(self) -> int:
        return 2 ** (self.BITS - 1) - 1

    def _codes(self, payload: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = payload.detach().reshape(rows_of(tuple(payload.shape))).float()
        rows = torch.nan_to_num(rows, nan=0.0, posinf=1e30, neginf=-1e30).clamp_(-1e30, 1e30)
        amax = rows.abs().amax(1)  # R
        scale = torch.where(amax > 0, amax / self.qmax, torch.ones_like(amax))
        q = torch.round(rows / scale[:, None]).clamp_(-self.qmax, self.qmax)
        return q.to(torch.int8), scale

    def decode(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        q = self._unpack(wire, ctx).float()
        scale = wire.tensors["scale"].float()
        return (q * scale[:, None]).reshape(ctx.shape).to(ctx.dtype)

    def _unpack(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        return wire.tensors["q"].reshape(rows_of(ctx.shape))

    def wire_view(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        """The integer codes as floats, (rows, row length): the message with every row's scale divided out."""
        return self._unpack(wire, ctx).float()


@CODECS.register("int8")
class Int8(_Quantize):
    """int8 per-row symmetric quantization (codes in [-127, 127] + one float32 scale per row)."""

    BITS = 8

    def encode(self, payload: torch.Tensor, ctx: CodecContext) -> Wire:
        q, scale = self._codes(payload)
        return Wire({"q": q.reshape(-1), "scale": scale})

    def expected_nbytes(self, shape: tuple[int, ...], role: Role = Role.ACTIVATION) -> int:
        rows, _ = rows_of(shape)
        return numel(shape) + 4 * rows


@CODECS.register("int4")
class Int4(_Quantize):
    """int4 per-row symmetric quantization (codes in [-7, 7], two per byte, + one float32 scale per row)."""

    BITS = 4

    def encode(self, payload: torch.Tensor, ctx: CodecContext) -> Wire:
        q, scale = self._codes(payload)
        nib = (q.reshape(-1).to(torch.int16) + 8).to(torch.uint8)  # 1..15
        if nib.numel() % 2:
            nib = torch.cat([nib, nib.new_full((1,), 8)])  # pad with a zero code
        packed = nib[0::2] | (nib[1::2] << 4)
        return Wire({"q": packed, "scale": scale})

    def _unpack(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        packed = wire.tensors["q"]
        nib = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1)[: numel(ctx.shape)]
        return (nib.to(torch.int16) - 8).to(torch.int8).reshape(rows_of(ctx.shape))

    def expected_nbytes(self, shape: tuple[int, ...], role: Role = Role.ACTIVATION) -> int:
        rows, _ = rows_of(shape)
        return (numel(shape) + 1) // 2 + 4 * rows


def _scatter(n: int, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Dense length-n vector with `values` added at `idx` (taken modulo n: a receiver never crashes on a bad index)."""
    out = torch.zeros(n, dtype=torch.float32)
    return out.index_add_(0, torch.remainder(idx.long(), max(n, 1)), values.float())


@CODECS.register("topk")
class TopK(Codec):
    """The k = ceil(fraction * n) largest-magnitude entries: values + int32 indices (sorted).

    Decoded: those entries exactly (up to `value_dtype`), zero elsewhere; so ||x - x'||^2 <=
    (1 - k/n) ||x||^2 and every dropped entry is no larger than the smallest kept one. Biased (the
    papers report top-k collapsing PP training); kept for comparison.
    """

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        fraction: float = spec(0.1, gt=0, le=1, help="kept fraction of the entries")
        value_dtype: Literal["float32", "float16", "bfloat16"] = spec("float32", help="dtype of the kept values")

    def k(self, n: int) -> int:
        return max(1, min(n, math.ceil(self.config.fraction * n - 1e-9)))

    zeroes_tokens = True

    def encode(self, payload: torch.Tensor, ctx: CodecContext) -> Wire:
        flat = payload.detach().reshape(-1)
        idx = torch.nan_to_num(flat.abs(), nan=0.0).topk(self.k(flat.numel()), sorted=False).indices.sort().values
        return Wire({"values": flat[idx].to(VALUE_DTYPES[self.config.value_dtype]), "idx": idx.to(torch.int32)})

    def decode(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        n = numel(ctx.shape)
        return _scatter(n, wire.tensors["idx"], wire.tensors["values"]).reshape(ctx.shape).to(ctx.dtype)

    def expected_nbytes(self, shape: tuple[int, ...], role: Role = Role.ACTIVATION) -> int:
        k = self.k(numel(shape))
        return k * (VALUE_DTYPES[self.config.value_dtype].itemsize + 4)

    def wire_view(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        return wire.tensors["values"].float()


@CODECS.register("random_mask")
class RandomMask(Codec):
    """Random masking with a shared seed: keep k = round(keep * n) entries, rescaled by n / k.

    The kept positions are a uniform random k-subset drawn from a generator seeded by
    (scenario seed, step, microbatch, boundary) -- public facts both ends know -- so **no indices
    travel**, and the role is not part of the key: the gradient crossing a boundary backward uses the
    very mask of the activation that crossed it forward. Decoded x' = (n/k) * M . x, unbiased
    (E[x'] = x over masks), and for the backward it is the exact chain rule of the masked forward:
    dL/dx = (n/k) M . dL/dx'. `granularity: feature` keeps the same k channels (last dimension) for
    every token instead. Wire: only the kept values (content field `v`), k * itemsize bytes.
    """

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        keep: float = spec(0.05, gt=0, le=1, help="keep-rate q (95% compression = keep 0.05)")
        granularity: Literal["element", "feature"] = spec("element", help="mask entries, or whole channels")
        value_dtype: Literal["float32", "float16", "bfloat16"] = spec("float32", help="dtype of the kept values")

    random_positions = True  # the relay checks re-masked replays (see `Codec`)
    zeroes_tokens = True

    def __init__(self, config: Config | None = None):
        super().__init__(config)
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def _n(self, shape: tuple[int, ...]) -> int:
        return shape[-1] if (self.config.granularity == "feature" and shape) else numel(shape)

    def k(self, n: int) -> int:
        return max(1, min(n, round(self.config.keep * n)))

    def mask_indices(self, ctx: CodecContext) -> torch.Tensor:
        """Sorted kept positions for this (seed, step, mb, boundary): identical at both ends, both directions."""
        n = self._n(ctx.shape)
        key = (ctx.seed, ctx.step, ctx.mb_idx, ctx.boundary, n)
        idx = self._cache.get(key)
        if idx is None:
            gen = torch.Generator().manual_seed(
                derive_seed(ctx.seed, 0x4D41534B, ctx.step, ctx.mb_idx + 1, ctx.boundary, n)
            )
            idx = torch.randperm(n, generator=gen)[: self.k(n)].sort().values
            if len(self._cache) > 64:  # a step's messages reuse a handful of masks; keep memory bounded
                self._cache.clear()
            self._cache[key] = idx
        return idx

    def encode(self, payload: torch.Tensor, ctx: CodecContext) -> Wire:
        idx = self.mask_indices(ctx)
        x = payload.detach()
        kept = x[..., idx] if self.config.granularity == "feature" else x.reshape(-1)[idx]
        return Wire({"v": kept.to(VALUE_DTYPES[self.config.value_dtype]).reshape(-1)})

    def decode(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        idx, n = self.mask_indices(ctx), self._n(ctx.shape)
        v = wire.tensors["v"].float() * (n / len(idx))
        if self.config.granularity == "feature":
            out = torch.zeros(ctx.shape, dtype=torch.float32)
            out[..., idx] = v.reshape(*ctx.shape[:-1], len(idx))
            return out.to(ctx.dtype)
        return torch.zeros(n, dtype=torch.float32).index_copy_(0, idx, v).reshape(ctx.shape).to(ctx.dtype)

    def expected_nbytes(self, shape: tuple[int, ...], role: Role = Role.ACTIVATION) -> int:
        n = self._n(shape)
        rows = numel(shape) // n if self.config.granularity == "feature" else 1
        return rows * self.k(n) * VALUE_DTYPES[self.config.value_dtype].itemsize

    def wire_view(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        return wire.tensors["v"].float()


def build_codecs(transport) -> dict[Role, Codec]:
    """One codec per role from a `TransportConfig`: `codec` for both, unless `activation_codec` /
    `gradient_codec` override it. Roles configured by the same spec share one instance."""
    specs = {
        Role.ACTIVATION: transport.activation_codec or transport.codec,
        Role.GRADIENT: transport.gradient_codec or transport.codec,
    }
    made: dict[int, Codec] = {}
    out = {}
    for role, sp in specs.items():
        if id(sp) not in made:
            made[id(sp)] = CODECS.get(sp.name)(sp.config)
        out[role] = made[id(sp)]
    return out


from sentinel.transport import subspace as _subspace  # noqa: E402,F401  (registers `subspace`)
