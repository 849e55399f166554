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

import torch

REPLAY_MEMORY = 1000  # steps a fingerprint is remembered


class Fingerprint:
    """64 fixed, seeded coordinates of the flattened payload (plus its shape)."""

    def __init__(self, seed: int):
        self.seed = seed
        self._idx: dict[int, torch.Tensor] = {}

    def __call__(self, payload: torch.Tensor) -> tuple:
        flat = payload.detach().reshape(-1)
        n = flat.numel()
        if n not in self._idx:
            gen = torch.Generator().manual_seed(int(self.seed) ^ 0x5EE)
            self._idx[n] = torch.randint(0, n, (min(64, n),), generator=gen).to(flat.device)
        return (tuple(payload.shape), flat.index_select(0, self._idx[n]).cpu().numpy().tobytes())


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
