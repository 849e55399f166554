"""Fault injection for the dist backend: a rogue sender below the adversary layer, and crashing ranks.

`--fault KIND:WORKER:STEP` (repeatable) makes the rank hosting WORKER misbehave from STEP on:

    shape     its next message's first wire tensor is cut to half its length (wrong shape)
    dtype     its next message's first wire tensor is sent as float64
    nan       its next message's first float wire tensor is all NaN
    bytes     its next message's body carries 16 bytes more than its manifest accounts for
    oversize  its next message's body exceeds the relay's size limit (the relay drains it unread)
    manifest  its next message's manifest is not JSON
    crash     the rank exits abruptly (exit code 3) at the start of STEP
    stall     the rank stops responding at the start of STEP (sleeps; the others' timeouts fire)

Attacks in `attacks/` must keep shape and dtype (the adversary layer enforces it); these faults model
a worker whose transport itself is malicious or broken, which only a real multi-process run can show.
The message faults fire once each; the relay must flag and attribute them without crashing.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time

import torch

from sentinel.distributed.wire import body_limit
from sentinel.errors import ConfigError
from sentinel.transport.message import Wire

MESSAGE_FAULTS = ("shape", "dtype", "nan", "bytes", "oversize", "manifest")
RANK_FAULTS = ("crash", "stall")


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    worker: str
    step: int


def parse_faults(specs: list[str] | tuple[str, ...]) -> tuple[Fault, ...]:
    out = []
    for text in specs:
        m = re.fullmatch(r"(\w+):(s\d+r\d+):(\d+)", text.strip())
        if not m or m.group(1) not in MESSAGE_FAULTS + RANK_FAULTS:
            raise ConfigError(
                f"--fault {text}: expected KIND:WORKER:STEP with KIND one of "
                f"{', '.join(MESSAGE_FAULTS + RANK_FAULTS)}, e.g. --fault shape:s1r0:2"
            )
        out.append(Fault(m.group(1), m.group(2), int(m.group(3))))
    return tuple(out)


class FaultInjector:
    """The faults of the workers this rank hosts."""

    def __init__(self, faults: tuple[Fault, ...], hosted: list[str]):
        self.pending = [f for f in faults if f.worker in hosted]

    def at_step(self, step: int) -> None:
        for f in self.pending:
            if f.step == step and f.kind == "crash":
                os._exit(3)
            if f.step == step and f.kind == "stall":
                time.sleep(10**6)

    def tamper(self, msg, wire: Wire, log=None) -> tuple[Wire, int, bool]:
        """(wire, extra body bytes, garble manifest) for this message; the fault is ground truth in `log`."""
        fault = next(
            (f for f in self.pending if f.kind in MESSAGE_FAULTS and f.worker == msg.sender and msg.step >= f.step),
            None,
        )
        if fault is None:
            return wire, 0, False
        self.pending.remove(fault)
        if log is not None:
            log.log_tamper(msg, f"fault_{fault.kind}", float("nan"))
        name, t = next(iter(wire.tensors.items()))
        tensors = dict(wire.tensors)
        if fault.kind == "shape":
            tensors[name] = t.reshape(-1)[: max(1, t.numel() // 2)].clone()
        elif fault.kind == "dtype":
            tensors[name] = t.double()
        elif fault.kind == "nan":
            name = next((k for k, v in wire.tensors.items() if v.is_floating_point()), name)
            tensors[name] = torch.full_like(wire.tensors[name], float("nan"))
        extra = {"bytes": 16, "oversize": body_limit(tuple(msg.payload.shape)) + 1}
        return Wire(tensors, dict(wire.meta)), extra.get(fault.kind, 0), fault.kind == "manifest"
