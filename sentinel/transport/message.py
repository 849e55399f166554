"""The Message: the one shape in which every tensor crosses a stage boundary.

A Message is a frozen value. Each party on its path makes a new one from the one it got
(`dataclasses.replace`): the sender's step builds it, a malicious sender's adversary replaces its payload,
the verifier's relay decodes the wire into the payload it judges. What the receiver got is a separate
record (`sentinel.transport.relay.Delivery`).

Message ids are canonical: a function of (step, microbatch, boundary, direction) and the mesh shape
(`message_id`), so every process of a distributed run names a message the same way without asking anyone.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Mapping
from typing import Any

import torch


class Role(enum.IntEnum):
    """Direction of a boundary tensor (plus the DP-sync axis inside a stage)."""

    ACTIVATION = 0  # stage s -> s+1, forward
    GRADIENT = 1  # stage s+1 -> s, backward (gradient w.r.t. the activation)
    DP_GRADIENT = 2  # a replica's contribution to its stage's DP sync

    @property
    def label(self) -> str:
        return self.name.lower()


_NO_META: Mapping[str, Any] = types.MappingProxyType({})


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    """A tensor in flight between two workers.

    Attributes:
        step, mb_idx: the optimizer step and the microbatch.
        boundary: b is the link between stage b and stage b+1 (both directions use the same index).
        role: ACTIVATION (forward) or GRADIENT (backward).
        sender, receiver: worker ids `s{stage}r{replica}`.
        payload: the tensor as the sender sends it (before the codec) or, at the verifier, as decoded.
        msg_id: the canonical id (`message_id`), -1 for DP-sync contributions.
        wire_bytes: bytes on the wire (set by the relay).
        wire_view: the codec's compressed representation (`Codec.wire_view`), for `detector.view: wire`.
        meta: public metadata (read-only).
    """

    step: int
    mb_idx: int
    boundary: int
    role: Role
    sender: str
    receiver: str
    payload: torch.Tensor
    msg_id: int = -1
    wire_bytes: int = 0
    wire_view: torch.Tensor | None = None
    meta: Mapping[str, Any] = dataclasses.field(default_factory=lambda: _NO_META)

    def replace(self, **changes: Any) -> Message:
        """A new message with `changes` (this one is left as it is)."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(slots=True)
class Wire:
    """What actually travels: named tensors plus small public metadata (codec header)."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def hop(boundary: int, role: Role, num_stages: int) -> int:
    """Position of a message on its microbatch's path: activations across 0..S-2, then gradients S-2..0."""
    return boundary if role == Role.ACTIVATION else 2 * (num_stages - 1) - 1 - boundary


def message_id(step: int, mb_idx: int, boundary: int, role: Role, num_microbatches: int, num_stages: int) -> int:
    """The canonical id of a boundary message: steps, then microbatches, then hops along the path."""
    hops = 2 * (num_stages - 1)
    return (step * num_microbatches + mb_idx) * hops + hop(boundary, role, num_stages)


def canonical_key(msg: Message) -> tuple[int, int, int, int]:
    """The order in which a step's messages are weighed, whatever order they were sent in: by microbatch, then
    along its path (activations across boundaries 0, 1, ..., then gradients back across ..., 1, 0)."""
    if msg.role == Role.ACTIVATION:
        return (msg.step, msg.mb_idx, 0, msg.boundary)
    return (msg.step, msg.mb_idx, 1, -msg.boundary)
