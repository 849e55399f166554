"""TOPLOC-style commitments: the sender commits to its top-k values, a trusted verifier audits a sampled share.

After TOPLOC (Ong et al. 2025, "TOPLOC: a locality sensitive hashing scheme for trustless verifiable
inference"): a prover commits, per tensor, to the positions and values of its k largest-magnitude entries (a
few hundred bytes, robust to the float noise of recomputation on other hardware, unlike an exact hash); a
verifier that recomputes the same tensor from the same input accepts when the top-k positions largely agree
and the committed values match the recomputation within a tolerance. Here every message carries such a
commitment (its bytes are counted in `commitment_bytes`), and the verifier recomputes a random share p of
the messages with the trusted hook (`DetectorEnv.recompute`, as `spot_check`): a message is flagged, as
certain evidence, when fewer than `min_overlap` of the committed positions are among the recomputation's
top k, or a committed value differs from the recomputed one by more than `tol` (relative to the
recomputation's top-k magnitude). What it assumes: honest computation is deterministic up to float
rounding; a sampled message is checked exactly, an unsampled one not at all (recall per message p, cost
per message p recomputations plus 8k bytes). Compare its recall and cost with SENTINEL's (no recomputation).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from sentinel.config import spec
from sentinel.detectors.base import Marker, Verdict
from sentinel.detectors.recompute import UNCHECKED, Duplication
from sentinel.registry import DETECTORS
from sentinel.transport.message import Message


def commitment(x: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, values) of the k largest |entries| of x, positions sorted (what the sender commits to)."""
    flat = x.detach().reshape(-1).float()
    k = min(k, flat.numel())
    idx = flat.abs().topk(k).indices.sort().values
    return idx.cpu().numpy(), flat[idx].cpu().numpy()


@DETECTORS.register("toploc")
class TopLoc(Duplication):
    """TOPLOC-style top-k commitments, audited by trusted recomputation of a sampled share p of the messages."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        k: int = spec(128, ge=1, help="committed entries per message (largest magnitudes)")
        p: float = spec(0.1, gt=0, le=1, help="share of messages the verifier recomputes (seeded)")
        min_overlap: float = spec(
            0.9, ge=0, le=1, help="least share of committed positions among the recomputation's top k"
        )
        tol: float = spec(1e-3, gt=0, help="largest committed-value error, relative to the recomputed top-k magnitude")

    def __init__(self, config=None, *, seed: int = 0, env=None):
        super().__init__(config, seed=seed, env=env)
        self.commitment_bytes = 0

    def observe(self, msg: Message) -> Verdict:
        pos, val = commitment(msg.payload, self.config.k)  # what the sender committed to (sent with the message)
        self.commitment_bytes += 8 * len(pos)  # int32 position + float32 value per entry
        if self._rng(msg).random() >= self.config.p or self.env.recompute is None:
            return UNCHECKED
        ref = self.env.recompute(msg, None)
        if ref is None:
            return UNCHECKED
        self.checked += 1
        self._last = (msg.msg_id, ref.detach())
        ref_pos, _ = commitment(ref, self.config.k)
        overlap = len(np.intersect1d(pos, ref_pos, assume_unique=True)) / max(1, len(pos))
        flat = ref.detach().reshape(-1).float().cpu().numpy()
        scale = max(float(np.abs(flat[ref_pos]).max()) if len(ref_pos) else 0.0, 1e-30)
        err = float(np.abs(val - flat[pos]).max()) / scale if len(pos) else 0.0
        scores = {"topk_overlap": overlap, "topk_error": err}
        if overlap >= self.config.min_overlap and err <= self.config.tol:
            return Verdict(scores, False)
        return Verdict(scores, True, frozenset({Marker.CERTAIN}))

    @classmethod
    def threshold_rule(cls, config) -> dict:
        """Flag <=> topk_error > tol (when the positions agree); the checker keeps no state."""
        return {"key": "tol", "statistic": "topk_error", "value": config.tol, "warmup_steps": 0, "exact_from": 0.0}

    def public_state(self) -> dict:
        return {
            "config": dataclasses.asdict(self.config),
            "checked": self.checked,
            "commitment_bytes": self.commitment_bytes,
        }
