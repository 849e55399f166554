"""Compiled (numba) loops of the verifier's per-message signature and distances.

Why compiled: the verifier runs between training operations, which evict its code and data from the
CPU caches, so each numpy call there costs 5-15 us whatever its size (2-3 us in a tight loop), and a
signature was about 30 of them. These loops replace the ~20 calls of the token clipping, sampling,
pooled mean and moments with two, and the ~20 of the distances with one; the SENTINEL verifier's time
per step in the benchmark pipeline went from 17-19 ms to 15-17 ms (`sentinel bench`, `detector_overhead`).

The signature loops are bit-for-bit the numpy computation they replace: float32 throughout, sums
accumulated row after row as `np.add.reduce(x, axis=0)` does on a C-ordered array, no fused multiply-add
(numba's default, `fastmath=False`), the same median, cap and scale. A test compares them with a numpy reference on
payloads with huge, zero, constant, NaN and infinite tokens.

Compiled once per machine (`cache=True` keeps the machine code beside this file, ~1 s to load after the
first compile); `nogil=True` lets another thread run while a message is checked.
"""

from __future__ import annotations

import numba
import numpy as np

F32 = np.float32


@numba.njit(cache=True, nogil=True)
def prepare(tokens, sq, start, stride, clip, feats, pooled, full):  # pragma: no cover - compiled
    """Clip, sample and pool the tokens of one payload.

    tokens (N, C) float32; sq (N,) their squared norms (`clip` > 0 only; numpy's einsum computes them);
    rows start, start + stride, ... are the sampled tokens. Token clipping: the cap is `clip` x the upper
    median norm of the non-zero sampled tokens; if some token is longer, every token is scaled by
    sqrt(min(1, cap^2 / |t|^2)) (direction kept). Writes the (clipped) sampled tokens to `feats` (m, C),
    and to `pooled` the mean over every (clipped) token, (C,), or, with `full`, the tokens themselves
    flattened (N * C,). Returns whether any token was clipped.
    """
    n, C = tokens.shape
    cap2 = -1.0
    if clip > 0:
        pos = np.sort(sq[start::stride])
        zeros = np.searchsorted(pos, F32(0.0), side="right")  # squares: the zeros come first, NaN last
        if zeros < pos.shape[0]:
            c2 = clip * clip * np.float64(pos[zeros + (pos.shape[0] - zeros) // 2])
            if sq.max() > c2:
                cap2 = c2
    clipped = cap2 >= 0
    c32 = F32(cap2)
    acc = np.zeros(C, dtype=np.float32)
    row = 0
    for r in range(n):
        s = F32(1.0)
        if clipped:  # np.sqrt(np.minimum(1, cap2 / np.maximum(sq, 1e-30))): NaN stays NaN
            q = c32 / (F32(1e-30) if sq[r] < F32(1e-30) else sq[r])
            s = np.sqrt(F32(1.0) if q > F32(1.0) else q)
        sampled = r >= start and (r - start) % stride == 0
        for c in range(C):
            v = tokens[r, c] * s if clipped else tokens[r, c]
            if full:
                pooled[r * C + c] = v
            else:
                acc[c] += v
            if sampled:
                feats[row, c] = v
        if sampled:
            row += 1
    if not full:
        for c in range(C):
            pooled[c] = acc[c] / F32(n)
    return clipped


@numba.njit(cache=True, nogil=True)
def skewness(x, out):  # pragma: no cover - compiled
    """Standardised third moment of each column of x (m, K) float32: E[d^3] / E[d^2]^1.5, d = x - mean
    (0 for a constant column), written to out (K,)."""
    m, K = x.shape
    mean = np.zeros(K, dtype=np.float32)
    for r in range(m):
        for j in range(K):
            mean[j] += x[r, j]
    for j in range(K):
        mean[j] = mean[j] / F32(m)
    m2 = np.zeros(K, dtype=np.float32)
    m3 = np.zeros(K, dtype=np.float32)
    for r in range(m):
        for j in range(K):
            d = x[r, j] - mean[j]
            d2 = d * d
            m2[j] += d2
            m3[j] += d2 * d
    for j in range(K):
        a = m2[j] / F32(m)
        den = a * np.sqrt(a)
        out[j] = (m3[j] / F32(m)) / (F32(1e-30) if den < F32(1e-30) else den)  # np.maximum: NaN stays NaN


@numba.njit(cache=True, nogil=True)
def all_distances(sig, pooled, skew, quant, base_pooled, base_sign, base_skew, skew_norm, base_quant, inv_rms,
                  inv_var, out):  # pragma: no cover - compiled
    """Every distance of `distances.DISTANCES`, in that order, between a signature (its pooled, skew and
    quant parts: (start, stop) pairs into `sig`) and a baseline view, in one pass (see `distances.py` for
    the definitions). Sums run in order (numpy sums pairwise): the values agree to rounding."""
    p0, p1 = pooled
    n = p1 - p0
    l1 = 0.0
    sq = 0.0
    z = 0.0
    flips = 0
    for i in range(n):
        v = sig[p0 + i]
        d = v - base_pooled[i]
        l1 += abs(d)
        d2 = d * d
        sq += d2
        z += d2 * inv_var[i]
        if np.sign(v) != base_sign[i]:  # NaN counts as a flip
            flips += 1
    q0, q1 = quant
    sw = 0.0
    for i in range(q1 - q0):
        sw += abs(sig[q0 + i] - base_quant[i])
    k0, k1 = skew
    ss = 0.0
    sb = 0.0
    for i in range(k1 - k0):
        s = sig[k0 + i]
        ss += s * s
        sb += s * base_skew[i]
    out[0] = l1 / n
    out[1] = np.sqrt(sq) * inv_rms
    out[2] = flips / n
    out[3] = sw / (q1 - q0)
    out[4] = np.sqrt(z / n)
    den = np.sqrt(ss) * skew_norm
    out[5] = 1.0 - sb / (1e-30 if den < 1e-30 else den)

