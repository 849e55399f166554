"""Point-to-point plumbing over torch.distributed: sends that never block, frames read by one thread per peer.

Sends are `isend`s kept alive until they complete (a rank never blocks on a send, so two ranks that both send
first cannot deadlock). Receives of frames (sentinel/distributed/wire.py) run in one reader thread per peer,
which reads that peer's frames in the order they were sent (header, then exactly the body it announces) into
one queue; the main thread takes frames from the queue and waits at most `timeout_s` for the next one, so a
peer that stalls is reported naming who was awaited, and a peer that died is reported as soon as its
connection drops. Everything travels as CPU tensors on a dedicated gloo group (verifiers are CPU relays;
on GPUs only the DP sync uses NCCL).
"""

from __future__ import annotations

import datetime
import math
import queue
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from sentinel.distributed import wire as W
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
    """This rank's end of the point-to-point links: frames on `frames_group` (read by the reader threads), everything
    else (evaluation weights, replica states, step-end data, log parts) on `group`; both gloo groups of every rank,
    so a reader thread never takes a message meant for the main thread."""

    def __init__(self, rank: int, timeout_s: float, describe: Callable[[int], str], group=None, frames_group=None):
        self.rank, self.timeout_s, self.describe, self.group = rank, timeout_s, describe, group
        self.frames_group = frames_group
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []
        self._prune_at = 64  # prune completed sends when this many are pending (doubles with what stays pending)
        self._lock = threading.Lock()
        self.wait_s = 0.0  # time the main thread spent blocked waiting for peers (cost accounting)

    def send(self, tensor: torch.Tensor, dst: int, group=None) -> None:
        t = tensor.detach().cpu().contiguous()
        with self._lock:
            self._pending.append((dist.isend(t, dst, group=group or self.group), t))
            if len(self._pending) > self._prune_at:
                # amortised O(1) per send: a peer that consumes late leaves many sends pending, and re-scanning
                # them at every send made the relay quadratic in the step's messages (92% of a verifier's time
                # at 176 workers)
                self._pending = [(w, t) for w, t in self._pending if not w.is_completed()]
                self._prune_at = max(64, 2 * len(self._pending))

    def send_frame(self, dst: int, head: torch.Tensor, body: torch.Tensor | None = None) -> None:
        self.send(head, dst, self.frames_group)
        if body is None:
            return
        if body.dtype == torch.uint8:
            for piece in W.split_body(body):
                self.send(piece, dst, self.frames_group)
        else:
            self.send(body, dst, self.frames_group)

    def send_slot(self, dst: int, head: torch.Tensor, body: torch.Tensor | None, size: int) -> None:
        """A frame between a worker and a verifier: header and body in one `size`-byte send (wire.pack)."""
        self.send(W.pack(head, body, size), dst, self.frames_group)

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, what: str) -> torch.Tensor:
        """Receive exactly `shape`/`dtype` from `src` (announced before), waiting at most `timeout_s`."""
        buf = torch.empty(shape, dtype=dtype)
        if buf.numel() == 0:
            return buf
        t0 = time.perf_counter()
        try:
            dist.irecv(buf, src, group=self.group).wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:
            raise PeerFault(
                src,
                f"{self.describe(src)} {describe_failure(exc)} while rank {self.rank} "
                f"waited for {what} (timeout {self.timeout_s:g} s)",
            ) from exc
        finally:
            self.wait_s += time.perf_counter() - t0
        return buf

    def flush(self) -> None:
        """Wait for every send of this rank to complete (the peers consume all of them)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for w, _ in pending:
            w.wait(datetime.timedelta(seconds=self.timeout_s))


class Frames:
    """Frames from a set of peers, one reader thread each, in one queue (see the module docstring).

    `get(what)` returns (src, header as a list of ints, body tensor | None); a MSG body over `limit` bytes is
    drained and returned as None (the relay refuses it); a peer's END frame ends its reader. `slots`: the peers
    whose frames are fixed-size slots (wire.pack), with the slot's size (a worker and a verifier talk in slots).
    """

    def __init__(
        self,
        comm: Comm,
        peers: list[int],
        payload_shape: tuple[int, ...],
        limit: int,
        slots: dict[int, int] | None = None,
    ):
        self.comm, self.shape, self.limit, self.slots = comm, tuple(payload_shape), limit, dict(slots or {})
        self.q: queue.Queue = queue.Queue()
        self.peers, self.open = list(peers), set(peers)
        self.heard = {p: time.monotonic() for p in peers}  # when each peer's latest frame arrived
        self.threads = [threading.Thread(target=self._read, args=(p,), daemon=True, name=f"frames<-{p}") for p in peers]
        for t in self.threads:
            t.start()

    def _recv(self, shape, dtype, src: int) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype)
        if buf.numel():
            dist.irecv(buf, src, group=self.comm.frames_group).wait(datetime.timedelta(hours=24))
        return buf

    def _read(self, src: int) -> None:
        try:
            while True:
                size = self.slots.get(src)
                if size is not None:
                    h, rest = W.unpack(self._recv((size,), torch.uint8, src))
                else:
                    h, rest = self._recv((W.HEADER_LEN,), torch.int64, src).tolist(), None
                if h[0] != W.MAGIC or h[1] not in (W.MSG, W.SKIP, W.DELIVER, W.STATUS, W.END):
                    self.q.put((src, None, PeerFault(src, f"{self.comm.describe(src)} broke the frame format: {h}")))
                    return
                body = None
                if h[1] == W.MSG:
                    n = h[8] + h[9]
                    if h[8] < 0 or h[9] < 0:
                        self.q.put((src, None, PeerFault(src, f"{self.comm.describe(src)} sent negative lengths {h}")))
                        return
                    if rest is not None and h[10]:  # in the slot: a body announced larger than the slot is refused
                        body = rest[:n].clone() if n <= min(rest.numel(), self.limit) else None
                    else:
                        body = W.recv_body(_Reader(self, src), src, n, self.limit, "a message body")
                elif (h[1] == W.DELIVER and not h[6]) or (h[1] == W.STATUS and h[7]):
                    if rest is not None:
                        body = rest[: 4 * math.prod(self.shape)].view(torch.float32).view(self.shape)
                    else:
                        body = self._recv(self.shape, torch.float32, src)
                self.q.put((src, h, body))
                if h[1] == W.END:
                    return
        except Exception as exc:  # the peer died: tell the main thread, which knows what it was waiting for
            self.q.put((src, None, PeerFault(src, f"{self.comm.describe(src)} {describe_failure(exc)}")))

    def join(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s` in all) for the reader threads to end: each ends at its peer's END frame."""
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def get(self, what: Callable[[], tuple[str, list[int]]]) -> tuple[int, list[int] | None, torch.Tensor | None]:
        """The next frame. `what()` says what is awaited and from which ranks: on a timeout, the awaited rank
        silent for longest is the one named as stalled (the others may only be waiting on it)."""
        t0 = time.perf_counter()
        try:
            src, h, body = self.q.get(timeout=self.comm.timeout_s)
        except queue.Empty:
            text, ranks = what()
            now = time.monotonic()
            quiet = min(ranks or self.heard, key=lambda r: (self.heard.get(r, 0.0), r))
            raise PeerFault(
                quiet,
                f"{self.comm.describe(quiet)} stalled (nothing from it for "
                f"{now - self.heard.get(quiet, now):.0f} s) while rank {self.comm.rank} waited for "
                f"{text} (timeout {self.comm.timeout_s:g} s)",
            ) from None
        finally:
            self.comm.wait_s += time.perf_counter() - t0
        if h is None:
            raise body
        self.heard[src] = time.monotonic()
        if h[1] == W.END:
            self.open.discard(src)
        return src, h, body


class _Reader:
    """`wire.recv_body`'s view of a reader thread: receives on the frames' group, no timeout (the main thread
    times out instead)."""

    def __init__(self, frames: Frames, src: int):
        self.frames = frames

    def recv(self, shape, dtype, src, what, device=None) -> torch.Tensor:
        return self.frames._recv(shape, dtype, src)
