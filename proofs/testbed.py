"""Harness that drives the testbed's own SENTINEL detector and attacks from the proofs' checks.

No training run: the checks build `Message` objects from synthetic honest tensors (seeded, one sender, one
boundary) and feed them to `Sentinel.observe`, exactly as a verifier would. Imported lazily by the checks
so that `import proofs` (used by the scenario validator) does not pull in torch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import torch

from attacks.base import Attack, AttackContext
from sentinel.detectors.stagewise import Sentinel
from sentinel.registry import ATTACKS, DETECTORS
from sentinel.transport.message import Message, Role

BOUNDARY = 0
ENDS = {Role.ACTIVATION: ("s0r0", "s1r0"), Role.GRADIENT: ("s1r0", "s0r0")}  # (sender, receiver) per direction


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """torch on one thread for the duration (deterministic and light on a shared machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def sentinel(seed: int = 0, **config) -> Sentinel:
    """The registered "sentinel" detector with `config` overriding its defaults, judging by Tukey fences
    (`combine: any`, the paper's rule that results 3 and 5 are stated for) unless `combine` is given; the
    default calibrated rule (tail probabilities) has no fence Q3 + k IQR for these statements to bound."""
    cls = DETECTORS.get("sentinel")
    config.setdefault("combine", "any")
    config.setdefault("window", 100)  # the fence window the statements were checked with
    return cls(cls.Config(**config), seed=seed)


def attack(name: str, **config) -> Attack:
    """A registered attack with `config` overriding its defaults."""
    cls = ATTACKS.get(name)
    return cls(cls.Config(**config))


def message(step: int, payload: torch.Tensor, role: Role = Role.ACTIVATION) -> Message:
    sender, receiver = ENDS[role]
    return Message(step, 0, BOUNDARY, role, sender, receiver, payload)


def context(step: int, since: int, role: Role = Role.ACTIVATION, seed: int = 0) -> AttackContext:
    sender, receiver = ENDS[role]
    return AttackContext(
        step=step, mb_idx=0, boundary=BOUNDARY, role=role, worker=sender, receiver=receiver, seed=seed, since=since
    )


class HonestStream:
    """Seeded synthetic honest payloads: a fixed per-feature profile plus i.i.d. Gaussian noise per token.

    Each payload is rescaled to the fixed norm sqrt(numel) (RMS 1), so that an attack whose strength is
    relative to ||x|| (`slow_drift`) injects exactly the same absolute perturbation at every step.

    Args:
        shape: (B, T, C) payload shape; the detector pools over the B * T tokens.
        noise: Standard deviation of the per-token noise relative to the profile (0: a constant payload).
        seed: Seed of the noise.
    """

    def __init__(self, shape: tuple[int, int, int], noise: float, seed: int):
        self.shape, self.noise = shape, noise
        self.profile = np.linspace(-1.0, 1.0, shape[-1])
        self.rng = np.random.default_rng(seed)

    def __call__(self) -> torch.Tensor:
        x = self.profile + self.noise * self.rng.standard_normal(self.shape)
        return torch.from_numpy(x * (math.sqrt(x.size) / np.linalg.norm(x))).float()

    def pooled(self, x: torch.Tensor) -> np.ndarray:
        """The token-mean pooled vector SENTINEL compares (`pooling: token_mean`), in float64."""
        return x.double().reshape(-1, x.shape[-1]).mean(dim=0).numpy()


def stream_state(det: Sentinel, role: Role = Role.ACTIVATION):
    """The detector's (baseline, fences) for the harness's stream (read-only use)."""
    st = det._streams[(BOUNDARY, int(role))]
    return st.baseline, st.fences
