"""The Message: the one shape in which every tensor crosses a stage boundary."""

from __future__ import annotations

import dataclasses
import enum
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


@dataclasses.dataclass(slots=True)
class Message:
    """A tensor in flight between two workers.

    `boundary` b is the link between stage b and stage b+1 (both directions use the same index).
    `payload` is the tensor as sent by the sender (before the codec) and, after delivery, as decoded.
    `msg_id` is assigned by the EventLog when the message enters the transport.
    """

    step: int
    mb_idx: int
    boundary: int
    role: Role
    sender: str
    receiver: str
    payload: torch.Tensor
    wire_bytes: int = 0
    msg_id: int = -1
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)  # public, e.g. codec metadata


@dataclasses.dataclass(slots=True)
class Wire:
    """What actually travels: named tensors plus small public metadata (codec header)."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def canonical_key(msg: Message) -> tuple[int, int, int, int]:
    """The order in which a step's messages are weighed, whatever order they were sent in: by microbatch, then
    along its path (activations across boundaries 0, 1, ..., then gradients back across ..., 1, 0)."""
    if msg.role == Role.ACTIVATION:
        return (msg.step, msg.mb_idx, 0, msg.boundary)
    return (msg.step, msg.mb_idx, 1, -msg.boundary)
