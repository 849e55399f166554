"""Replay memory: a trusted relay remembers what it relayed.

Honest boundary tensors never repeat exactly: every microbatch carries new data and every step new
weights, and the values are continuous. A replay, by contrast, must resend a tensor the relay already
saw: the first d steps of any d-step delay attack (the stale tensors were sent honestly before the
attack began), a copy of another microbatch's tensor that was already sent, a constant repeated. So
an exact repeat is certain evidence, not a statistical one. Keys are fingerprints: equal for equal
tensors, and (for continuous values) different for different ones.
"""

from __future__ import annotations

import collections
import hashlib

import numpy as np
import torch

REPLAY_MEMORY = 1000  # steps a fingerprint is remembered
NUMPY_FLOATS = (torch.float32, torch.float64, torch.float16)


class Fingerprint:
    """64 fixed, seeded coordinates of the flattened payload (plus its shape); a hash of every entry when one
    of them is exactly zero (two honest sparse payloads would often agree on 64 zeros)."""

    def __init__(self, seed: int):
        self.seed = seed
        self._idx: dict[int, np.ndarray] = {}  # payload size -> the sampled positions

    def __call__(self, payload: torch.Tensor) -> tuple:
        t = payload.detach()
        n = t.numel()
        idx = self._idx.get(n)
        if idx is None:
            gen = torch.Generator().manual_seed(int(self.seed) ^ 0x5EE)
            idx = self._idx[n] = torch.randint(0, n, (min(64, n),), generator=gen).numpy()
        if t.device.type == "cpu" and t.dtype in NUMPY_FLOATS:  # numpy reads it in place: no torch call per message
            sample = t.reshape(-1).numpy()[idx]
        else:  # another device, or bfloat16 (which numpy cannot hold): exact in float32
            sample = t.reshape(-1)[torch.from_numpy(idx).to(t.device)].to("cpu", torch.float32).numpy()
        if (sample == 0).any():  # sparse (masked, top-k) payloads agree on their zeros: use every entry
            return digest(payload)
        return (tuple(payload.shape), str(payload.dtype), sample.tobytes())


def digest(payload: torch.Tensor) -> tuple:
    """A key equal only for equal tensors (shape, dtype and every entry's bytes; any dtype, bfloat16 included, which
    numpy cannot hold: the bytes are read as uint8)."""
    raw = payload.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
    return (tuple(payload.shape), str(payload.dtype), hashlib.blake2b(raw.tobytes(), digest_size=16).digest())


class ReplayMemory:
    """Fingerprints seen in the last `memory` steps."""

    def __init__(self, memory: int = REPLAY_MEMORY):
        self.memory = memory
        self._seen: dict = {}
        self._order: collections.deque = collections.deque()

    def seen_before(self, key, step: int) -> bool:
        """True if `key` was recorded before; records it otherwise."""
        while self._order and self._order[0][0] <= step - self.memory:
            _, old = self._order.popleft()
            self._seen.pop(old, None)
        if key in self._seen:
            return True
        self._seen[key] = step
        self._order.append((step, key))
        return False


class SparseReplayMemory:
    """Replays of sparse payloads whose kept positions change from message to message (random masking).

    A codec that keeps a fresh random subset of entries per message (`random_mask`: q n entries, from a
    seed of step, microbatch and boundary) turns a replayed tensor into a new-looking payload: the
    stale tensor x is masked again with this message's mask, so no fingerprint repeats. But where the
    old and the new masks overlap (about q^2 n positions) the replay carries the old message's values
    exactly, and honest continuous values never repeat exactly at the same position. So, per stream
    (boundary, direction) and shape, each tracked position remembers the float bits of its last `slots`
    nonzero values and which message sent them; a message is a replay when, for one earlier message,
    at least `min_matches` positions carry its exact values and they are at least half of the positions
    where that message is still remembered (chance collisions of coarse values, e.g. bf16, are spread
    over many messages and match a small share of each).

    The Verifier asks only for roles whose codec keeps random positions (`Codec.random_positions`: top-k
    keeps data-dependent ones, and a stage whose weights barely move repeats them honestly, values and
    all). Only payloads that look sparse (at least `min_zeros` of 64 seeded sample entries exactly zero:
    masked traffic; honest dense tensors have no exact zeros) are checked; dense ones are left to the exact
    fingerprint (`ReplayMemory`), so the dense hot path costs one 64-entry gather. At most
    `max_positions` positions are tracked (a seeded subset of larger tensors; the overlap grows with the
    tensor, so a subset keeps the evidence and bounds the memory at max_positions x slots x 8 bytes per
    stream). A position is overwritten after `slots` kept values: with keep-rate q and m messages per step
    in the stream, the horizon is about slots / (q m) steps (160 steps at q = 0.05, m = 4, 32 slots).
    """

    def __init__(
        self, seed: int, slots: int = 32, min_matches: int = 3, min_zeros: int = 24, max_positions: int = 1 << 16
    ):
        self.seed, self.slots, self.min_matches, self.min_zeros = seed, slots, min_matches, min_zeros
        self.max_positions = max_positions
        self._probe: dict[int, np.ndarray] = {}
        self._streams: dict[tuple, tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._next_id = 0

    def _sparse(self, flat: np.ndarray) -> bool:
        n = flat.shape[0]
        if n not in self._probe:
            self._probe[n] = np.random.default_rng([self.seed, 0x5A5E]).integers(0, n, size=min(64, n))
        return np.count_nonzero(flat[self._probe[n]] == 0) >= min(self.min_zeros, len(self._probe[n]))

    def _stream(self, key: tuple, n: int):
        if key not in self._streams:
            track = None  # position -> tracked row (-1: untracked); None: every position is tracked
            rows = n
            if n > self.max_positions:
                rng = np.random.default_rng([self.seed, 0x5A5F, n])
                track = np.full(n, -1, dtype=np.int64)
                track[rng.choice(n, size=self.max_positions, replace=False)] = np.arange(self.max_positions)
                rows = self.max_positions
            values = np.zeros((rows, self.slots), dtype=np.int32)  # float32 bits
            ids = np.full((rows, self.slots), -1, dtype=np.int32)  # sending message, -1: empty
            self._streams[key] = (track, values, ids, np.zeros(rows, dtype=np.int64))
        return self._streams[key]

    def seen_before(self, stream: tuple, payload: torch.Tensor) -> bool:
        """True if `payload` replays an earlier sparse payload of `stream`; records it otherwise."""
        t = payload.detach()
        if t.dtype != torch.float32 or t.device.type != "cpu":
            t = t.to("cpu", torch.float32)
        flat = t.numpy().reshape(-1)
        if not self._sparse(flat):
            return False
        track, values, ids, count = self._stream((stream, tuple(payload.shape)), flat.shape[0])
        pos = np.flatnonzero(flat)
        bits = flat[pos].view(np.int32)
        rows = pos if track is None else track[pos]
        if track is not None:
            keep = rows >= 0
            rows, bits = rows[keep], bits[keep]
        if self._matches(values[rows], ids[rows], bits):
            return True
        slot = count[rows] % self.slots
        values[rows, slot], ids[rows, slot] = bits, self._next_id
        count[rows] += 1
        self._next_id += 1
        return False

    def _matches(self, values: np.ndarray, ids: np.ndarray, bits: np.ndarray) -> bool:
        """Some earlier message whose exact values fill at least min_matches, and half, of its remembered
        positions among this message's kept ones."""
        hit = (values == bits[:, None]) & (ids >= 0)
        if np.count_nonzero(hit) < self.min_matches:
            return False
        source, matched = np.unique(ids[hit], return_counts=True)
        best = int(np.argmax(matched))
        if matched[best] < self.min_matches:
            return False
        overlap = np.count_nonzero(ids == source[best])
        return 2 * matched[best] >= overlap
