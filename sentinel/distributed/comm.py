"""Point-to-point plumbing over torch.distributed: sends that never block, receives that time out.

Sends are `isend`s kept alive until they complete (a rank never blocks on a send, so two ranks that
both send first cannot deadlock); receives are `irecv(...).wait(timeout)`, so a peer that stalls is
reported after `timeout_s` naming the peer and what was awaited, and a peer that died is reported as
soon as its connection drops. Tensors travel on `comm_device` (CPU for gloo, the rank's GPU for NCCL)
and are handed back on the compute `device`.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from sentinel.errors import RunError


class PeerFault(RunError):
    """A peer rank that died, stalled or broke the protocol. `rank` names it."""

    def __init__(self, rank: int, message: str):
        self.rank = rank
        super().__init__(message)


def describe_failure(exc: BaseException) -> str:
    text = str(exc)
    if "Timed out" in text or "timed out" in text or "Timeout" in text:
        return "stalled (no data before the timeout)"
    if "reset by peer" in text or "closed" in text.lower() or "Broken pipe" in text or "EOF" in text:
        return "died (its connection dropped)"
    return f"failed ({text.splitlines()[0][:200] if text else exc.__class__.__name__})"


class Comm:
    """This rank's end of the p2p links.

    Args:
        rank: this process's rank.
        timeout_s: how long one receive may wait before its peer counts as stalled.
        describe: rank -> human description ('rank 2 (workers s1r0, s1r1)') for error messages.
        device: where received tensors are handed back; comm_device: where they travel.
    """

    def __init__(self, rank: int, timeout_s: float, describe, device: torch.device, comm_device: torch.device):
        self.rank, self.timeout_s, self.describe = rank, timeout_s, describe
        self.device, self.comm_device = device, comm_device
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []
        self.wait_s = 0.0  # time spent blocked in receives (cost accounting)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        t = tensor.detach().to(self.comm_device).contiguous()
        self._pending.append((dist.isend(t, dst), t))
        if len(self._pending) > 64:
            self._pending = [(w, t) for w, t in self._pending if not w.is_completed()]

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, what: str,
             device: torch.device | None = None) -> torch.Tensor:
        """Receive exactly `shape`/`dtype` from `src` (announced in a header before), onto `device` (default: compute)."""
        device = device or self.device
        buf = torch.empty(shape, dtype=dtype, device=self.comm_device)
        if buf.numel() == 0:
            return buf.to(device)
        t0 = time.perf_counter()
        try:
            dist.irecv(buf, src).wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:
            raise PeerFault(src, f"{self.describe(src)} {describe_failure(exc)} while rank {self.rank} "
                                 f"waited for {what} (timeout {self.timeout_s:g} s)") from exc
        finally:
            self.wait_s += time.perf_counter() - t0
        return buf.to(device)

    def flush(self) -> None:
        """Wait for every send of this rank to complete (the peers consume all of them within a step)."""
        for w, _ in self._pending:
            w.wait(datetime.timedelta(seconds=self.timeout_s))
        self._pending.clear()
