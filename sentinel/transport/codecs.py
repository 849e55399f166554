"""Codecs: how a boundary tensor becomes bytes on the wire and back.

A codec is registered in `CODECS` and implements `encode(payload, ctx) -> Wire` and
`decode(wire, ctx) -> Tensor`. `ctx` carries the public facts both ends share (step, microbatch,
boundary, role, scenario seed, shape), from which e.g. a shared random mask can be derived so no
indices travel. `Wire.nbytes()` is the exact byte count charged to the link.
"""

from __future__ import annotations

import dataclasses

import torch

from sentinel.registry import CODECS
from sentinel.transport.message import Role, Wire


@dataclasses.dataclass(frozen=True, slots=True)
class CodecContext:
    step: int
    mb_idx: int
    boundary: int
    role: Role
    seed: int
    shape: tuple[int, ...]
    dtype: torch.dtype


class Codec:
    """Base class. Subclasses define `Config`, `encode` and `decode`."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        pass

    def __init__(self, config: Config | None = None):
        self.config = config if config is not None else self.Config()

    def encode(self, payload: torch.Tensor, ctx: CodecContext) -> Wire:
        raise NotImplementedError

    def decode(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        raise NotImplementedError


@CODECS.register("identity")
class Identity(Codec):
    """Sends the tensor as is (float32 bytes on the wire)."""

    def encode(self, payload: torch.Tensor, ctx: CodecContext) -> Wire:
        return Wire({"x": payload})

    def decode(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        return wire.tensors["x"]
