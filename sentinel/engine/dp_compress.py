"""Compression of the DP all-reduce: what each replica sends to its stage's aggregator.

Each contributing replica compresses its own local mean gradient g_i before aggregation, with
per-replica **error feedback** (Karimireddy et al. 2019; the PowerSGD recipe):

    v_i = g_i + e_i,   c_i = C(v_i),   e_i <- v_i - c_i,   aggregator sees c_i

Methods (`dp.compression.method`):
    low_rank   PowerSGD-style (Vogels et al. 2019): every weight matrix M (rows x cols, min > rank) is
               sent as P (rows x r) and Q (cols x r) from one power iteration warm-started with last
               step's Q: P = orth(M Q), Q = M^T P, C(M) = P Q^T. Vectors and thin matrices travel dense.
               Bytes per replica: sum (rows + cols) r * 4 (+ 4 per dense entry).
    topk       the ceil(fraction * d) largest-magnitude entries: values + int32 indices (8 bytes each).

Each replica is compressed separately (rather than PowerSGD's all-reduce of P and Q) so that robust
aggregators and DP-axis attacks still see one row per replica; the byte count is what each replica
sends. In a stage with a single live replica nothing travels and nothing is compressed.
"""

from __future__ import annotations

import math

import torch

from sentinel.transport.codecs import derive_seed


def build_dp_compressor(scenario) -> DPCompressor | None:
    cfg = scenario.dp.compression
    if cfg.method == "none" or scenario.dp.sync != "allreduce":
        return None
    return DPCompressor(cfg, scenario.seed)


class DPCompressor:
    """Per-replica compression with error feedback (see module docstring).

    Attributes:
        step_bytes: stage -> bytes one replica sent in the latest sync of that stage (network clock).
        bytes_sent: total bytes all replicas sent.
    """

    def __init__(self, cfg, seed: int):
        self.cfg, self.seed = cfg, seed
        self.errors: dict[str, torch.Tensor] = {}
        self._q: dict[tuple[str, int], torch.Tensor] = {}
        self.step_bytes: dict[int, int] = {}
        self.bytes_sent = 0

    def __call__(self, step: int, stage_idx: int, wids: list[str], vecs: torch.Tensor, shapes: list) -> torch.Tensor:
        """(n, d) replica contributions -> (n, d) what the aggregator receives (nothing travels for n < 2)."""
        if len(wids) < 2:
            self.step_bytes[stage_idx] = 0
            return vecs
        return torch.stack([self.compress(step, stage_idx, wid, g, shapes) for wid, g in zip(wids, vecs)])

    def compress(self, step: int, stage_idx: int, wid: str, g: torch.Tensor, shapes: list) -> torch.Tensor:
        """One replica's contribution as the aggregator receives it (its error feedback updated)."""
        v = g + self.errors[wid] if self.cfg.error_feedback and wid in self.errors else g
        c, nbytes = self._low_rank(wid, v, shapes) if self.cfg.method == "low_rank" else self._topk(v)
        if self.cfg.error_feedback:
            self.errors[wid] = v - c
        self.step_bytes[stage_idx] = nbytes  # every replica of a stage sends the same number of bytes
        self.bytes_sent += nbytes
        return c

    def _topk(self, v: torch.Tensor) -> tuple[torch.Tensor, int]:
        k = max(1, math.ceil(self.cfg.fraction * v.numel() - 1e-9))
        idx = torch.nan_to_num(v.abs(), nan=0.0).topk(k, sorted=False).indices
        c = torch.zeros_like(v)
        c[idx] = v[idx]
        return c, 8 * k

    def _low_rank(self, wid: str, v: torch.Tensor, shapes: list) -> tuple[torch.Tensor, int]:
        r, parts, nbytes, off = self.cfg.rank, [], 0, 0
        for i, shape in enumerate(shapes):
            n = math.prod(shape)
            chunk = v[off : off + n]
            off += n
            if len(shape) != 2 or min(shape) <= r:
                parts.append(chunk)
                nbytes += 4 * n
                continue
            M = chunk.view(shape[0], shape[1])  # rows, cols
            Q = self._q.get((wid, i))
            if Q is None:
                gen = torch.Generator().manual_seed(derive_seed(self.seed, 0x9051, i))
                Q = torch.randn(shape[1], r, generator=gen)
            P, _ = torch.linalg.qr(M @ Q)  # rows, r (orthonormal columns)
            Q = M.T @ P  # cols, r
            self._q[(wid, i)] = Q
            parts.append((P @ Q.T).reshape(-1))
            nbytes += 4 * r * (shape[0] + shape[1])
        return torch.cat(parts), nbytes
