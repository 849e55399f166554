"""Compiled (numba) loops of the verifier's per-message signature and distances.

Why compiled: the verifier runs between training operations, which evict its code and data from the
CPU caches, so each numpy call there costs 5-15 us whatever its size (2-3 us in a tight loop), and a
signature was about 30 of them. These loops replace the ~20 calls of the token clipping, sampling,
pooled mean and moments with two, and the ~20 of the distances with one; the SENTINEL verifier's time
per step in the benchmark pipeline went from 17-19 ms to 15-17 ms (`sentinel bench`, `detector_overhead`).
The token relation (`relation`: align, the gains, the match over pairs and over neighbours) is one call for what
were three, its cosines over pairs one BLAS product per block of rows: 378 -> 311 us per 512 x 128 message inside
training; the verifier's time per step in the benchmark 20.9, 17.4, 16.8 -> 18.9, 17.4, 14.6 ms in three alternating
pairs of runs (2026-12-05, issue-18 note, stop 39), the overhead ratio unchanged within its noise.

The signature (`signature`, `finish_signature`: the norms, clipping, sampling, pooling, projections and moments in
one call, numpy's sort, the quantiles in one more) and the baseline's view and update (`baseline_view`, `ema_update`)
took the verifier's time per bench step from 20.8, 20.3, 20.0 to 16.1, 16.2, 16.0 ms (three alternating pairs of runs,
2026-12-05, issue-18 note, stop 40). Of what is left, about half is these calls and half the Python around them (a
sampling profile). The calls wait on memory: inside training a message's payload is not in the caches, and reading a
512 x 128 float32 payload once takes ~60 us there (~4 GB/s) against ~10 us in a tight loop, so the signature call
takes ~75 us in training (26 in a loop) and the relation, which reads the payload and the sender's input, ~290 (200).

The signature loops are the numpy computation they replace: float32 throughout, sums accumulated row after row as
`np.add.reduce(x, axis=0)` does on a C-ordered array, no fused multiply-add (numba's default, `fastmath=False`), the
same median, cap and scale; bit for bit except two sums taken in another order: the squared token norms
(`square_norms`, vectorised; they set the clipping scale, which moves in its last bits) and the squared norm of the
pooled part (float64, in order). A test compares them with a numpy reference on payloads with huge, zero, constant,
NaN and infinite tokens.

Compiled once per machine (`cache=True` keeps the machine code beside this file, ~1 s to load after the
first compile); `nogil=True` lets another thread run while a message is checked.
"""

from __future__ import annotations

import numba
import numpy as np

F32 = np.float32
# gain_high and retain read the tokens whose received |r_i|^2 is at most this x the median (|r_i| <= e^0.5 = 1.65x):
# honest backward passes raise the gain of tokens that received much more than the others, and can turn them
# (`tokens.py`); retain also leaves out those under the median / this^2 (|r_i| < median / e)
TYPICAL_RECEIVED = float(np.e)


@numba.njit(cache=True, nogil=True)
def prepare(tokens, sq, start, stride, clip, feats, pooled, full, norms):  # pragma: no cover - compiled
    """Clip, sample and pool the tokens of one payload.

    tokens (N, C) float32; sq (N,) their squared norms (empty: no clipping and no `norms`; `square_norms`
    computes them); rows start, start + stride, ... are the sampled tokens. Token clipping (`clip` > 0):
    the cap is `clip` x the upper median norm of the non-zero sampled tokens; if some token is longer,
    every token is scaled by sqrt(min(1, cap^2 / |t|^2)) (direction kept). Writes the (clipped) sampled
    tokens to `feats` (m, C), to `pooled` the mean over every (clipped) token, (C,), or, with `full`, the
    tokens themselves flattened (N * C,), and to `norms` (2,) the squared upper median norm of the non-zero
    sampled tokens and the largest squared norm of all tokens, before clipping (0, 0 without `sq`).
    Returns whether any token was clipped.
    """
    n, C = tokens.shape
    cap2 = -1.0
    norms[0] = 0.0
    norms[1] = 0.0
    if sq.shape[0] > 0:
        pos = np.sort(sq[start::stride])
        zeros = np.searchsorted(pos, F32(0.0), side="right")  # squares: the zeros come first, NaN last
        top = sq.max()
        norms[1] = top
        if zeros < pos.shape[0]:
            med = np.float64(pos[zeros + (pos.shape[0] - zeros) // 2])
            norms[0] = med
            c2 = clip * clip * med
            if clip > 0 and top > c2:
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


@numba.njit(cache=True, nogil=True, fastmath=True)
def square_norms(tokens, sq):  # pragma: no cover - compiled
    """sq[r] = |tokens[r]|^2 in float32 (`fastmath`: vectorised partial sums; the order of a sum of squares only
    moves its last bits)."""
    n, C = tokens.shape
    for r in range(n):
        s = F32(0.0)
        for c in range(C):
            s += tokens[r, c] * tokens[r, c]
        sq[r] = s


@numba.njit(cache=True, nogil=True)
def signature(tokens, start, stride, clip, full, theta_t, block, feats, z, ordered, sig, norms):  # pragma: no cover
    """A signature's pooled part and skewness in one call (`distances.signature` documents what they are).

    tokens (N, C) float32; rows start, start + stride, ... are the sampled tokens (m of them: `feats` (m, C) and
    `z` (m, P) receive them, clipped, and their projections on theta_t (C, P); `ordered` (m, P) a copy of z, for
    numpy to sort in place, `finish_signature`). Writes to `sig` (float64, `distances.Layout`) the pooled part and
    the skewness of the C features and P slices, and to `norms` (2,) what `prepare` writes there. The squared token
    norms are float32 sums (`square_norms`); the projections BLAS products of at most `block` multiply-adds
    (`distances.BLAS_SINGLE_THREAD_MNK`: OpenBLAS computes those in the calling thread). One call for what were four
    numpy calls and two kernels: between training operations each call costs its own cold start (see the module
    docstring).
    """
    n, C = tokens.shape
    P = theta_t.shape[1]
    m = feats.shape[0]
    sq = np.empty(n, dtype=np.float32)
    square_norms(tokens, sq)
    npooled = n * C if full else C
    prepare(tokens, sq, start, stride, clip, feats, sig[:npooled], full, norms)
    rows = max(1, block // (C * P))
    for i0 in range(0, m, rows):
        i1 = min(m, i0 + rows)
        z[i0:i1] = np.dot(feats[i0:i1], theta_t)
    skewness(feats, sig[npooled : npooled + C])
    skewness(z, sig[npooled + C : npooled + C + P])
    ordered[:] = z


@numba.njit(cache=True, nogil=True)
def finish_signature(ordered, qidx, npooled, sig):  # pragma: no cover - compiled
    """The rest of a signature: `ordered` (m, P) the sampled projections sorted along each column (numpy's sort, several
    times faster than numba's here), `qidx` (Q,) the order-statistic positions of the levels, `npooled` the length of
    the pooled part. Writes the P x Q quantiles (slice after slice) and the squared norm of the pooled part (a float64
    sum) to the end of `sig`; returns the sum of `sig` (finite exactly when every entry is)."""
    P = ordered.shape[1]
    Q = qidx.shape[0]
    k = sig.shape[0] - 1 - P * Q
    for j in range(P):
        for q in range(Q):
            sig[k + j * Q + q] = ordered[qidx[q], j]
    total = 0.0
    for c in range(npooled):
        total += sig[c] * sig[c]
    sig[sig.shape[0] - 1] = total
    return np.sum(sig)


@numba.njit(cache=True, nogil=True)
def ema_update(m, var, sig, npooled, beta, beta_var, div):  # pragma: no cover - compiled
    """One update of `baseline.Baseline`: innov = (sig - m / div)^2 over the pooled part (`div` = 1 - beta^n: 0 for the
    first update, which has no innovation), var <- beta_var var + (1 - beta_var) innov (`var` (npooled,); an empty
    `var` takes none), then m <- beta m + (1 - beta) sig. The operations of the numpy code it replaces, element by
    element: the same values. Returns whether `var` took the innovation."""
    took = div > 0.0 and var.shape[0] == npooled
    if took:
        a = 1.0 - beta_var
        for i in range(npooled):
            d = sig[i] - m[i] / div
            var[i] = var[i] * beta_var + a * (d * d)
    b = 1.0 - beta
    for i in range(m.shape[0]):
        m[i] = m[i] * beta + b * sig[i]
    return took


@numba.njit(cache=True, nogil=True)
def baseline_view(m, div, var, var_div, pooled_end, skew_end, quant_end):  # pragma: no cover - compiled
    """What `baseline.BaselineView` holds, in one call: (mean = m / div, sign of its pooled part, var = var / var_div
    (ones when `var` is empty), 1 / (var + floor) with floor = 1e-6 x max(mean of var, 1e-30) (it guards coordinates
    that never moved), the norm of the skewness part, 1 / sqrt(max(squared-norm entry, 1e-30))). Layout: pooled
    [0, pooled_end), skewness [pooled_end, skew_end), quantiles up to quant_end, then the squared norm."""
    mean = m / div
    sign = np.sign(mean[:pooled_end])
    if var.shape[0] == 0:
        v = np.ones(pooled_end)
    else:
        v = var / var_div
    total = 0.0
    for i in range(pooled_end):
        total += v[i]
    floor = max(total / pooled_end, 1e-30) * 1e-6
    inv_var = 1.0 / (v + floor)
    s = 0.0
    for i in range(pooled_end, skew_end):
        s += mean[i] * mean[i]
    return mean, sign, v, inv_var, np.sqrt(s), 1.0 / np.sqrt(max(mean[quant_end], 1e-30))


@numba.njit(cache=True, nogil=True)
def all_distances(
    sig, pooled, skew, quant, base_pooled, base_sign, base_skew, skew_norm, base_quant, inv_rms, inv_var, out
):  # pragma: no cover - compiled
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


@numba.njit(cache=True, nogil=True, inline="always")
def match_gap(own, other, floor):  # pragma: no cover - compiled
    """log(max(1 - own, floor)) - log(max(1 - other, floor)): how many times better the best other input explains a
    token than its own (`tokens.match`)."""
    return np.log(max(1.0 - np.float64(own), floor)) - np.log(max(1.0 - np.float64(other), floor))


@numba.njit(cache=True, nogil=True, fastmath=True)
def relation(y, r, out, skip_zero, m_start, m_stride, reach, floor, typical, block):  # pragma: no cover - compiled
    """How a stage's output tokens relate to its input tokens, token by token (see `tokens.py`), in one call.

    y, r (N, C) float32: the message's tokens and the sender's input tokens, row i of both being the same token.
    Writes, by the length of `out`:
      out[0] = 1 - mean_i cos_i, out[1] = 1 - min_i cos_i (align, align_tail): both centred by their own per-feature
        mean over every row, cos_i = <y_i, r_i> / (|y_i| |r_i|) over the rows of non-zero centred vectors (both 1
        when none qualifies: a constant message);
      out[2] = max_i (m - g_i), out[3] = max_i (g_i - m) (gain_low, gain_high; with four entries or more):
        g_i = log(|y_i| / |r_i|) on the tokens as sent (not centred), m the median gain, over the rows with r_i != 0
        (a zeroed token: g_i ~ -69; 0 when none); out[3] only over the rows that received a typical magnitude,
        |r_i|^2 <= TYPICAL_RECEIVED x the median |r_j|^2 (see `tokens.py`);
      out[4] = the match over every pair of rows m_start, m_start + m_stride, ... (with five entries): both centred
        by their own per-feature mean over those rows, each row scaled to unit length (float32; rows of zero centred
        norm in either left out), then max_i of log(max(1 - cos(y_i, r_i), floor)) - log(max(1 - max_j cos(y_i,
        r_j), floor)), j != i among the rows that received at most `typical` x their median |r|^2 (as sent;
        `typical` <= 0: all); 0.0 with fewer than two rows. Its cosines are BLAS products of at most `block`
        multiply-adds each (`distances.BLAS_SINGLE_THREAD_MNK`: OpenBLAS computes those in the calling thread);
      out[5] = max_i (m' - g'_i) (gain_centred; with six entries): g'_i = log(|y_i - ybar| / |r_i - rbar|), the gain
        of the centred tokens of out[0] (centred by the means over every row), m' their median, over the rows with a
        non-zero centred r_i (0 when none);
      out[6] = max_i (m'' - a_i) (retain; with seven entries): a_i = <y_i, r_i> / |r_i|^2 on the tokens as sent, the
        share of its own input a token carries on, m'' their median over the rows with r_i != 0, the max over those
        that received a typical magnitude, median |r_j|^2 / TYPICAL_RECEIVED^2 <= |r_i|^2 <= TYPICAL_RECEIVED x the
        median |r_j|^2 (|r_i| within [median / e, 1.65 median], the upper bound that of out[3]; 0 when none);
      out[7] = max_i (a_i - m'') over the same tokens (retain_high; with eight entries): a token that carries on more
        of its own input than the message's median token does (scaled up along it; 0 when none).
    Returns the local match (`reach` > 0 and five entries; else -inf): the same over every row, centred by the
    means over every row, with the candidates j restricted to the rows at most `reach` positions away (N 2 reach C
    work: every output token against its neighbours' inputs, where a copied token comes from; 0.0 with fewer than
    two rows). The unit input rows live in a ring of 2 reach + 1 rows (a normalised copy of a whole 4096 x 1024
    message cost 16 of 23 ms in allocation alone).

    `skip_zero`: a token exactly zero in y or in r (a codec dropped it whole, `DetectorEnv.zeroed_roles`) takes no
    part in the cosines, the gains and the shares (it still counts in the means). float64 sums; `fastmath`
    (reassociated sums, vectorised dot products) is fine: nothing here needs to match another computation bit for bit.
    One compiled call for what were three: between training operations each call costs its own cold start (see the
    module docstring).
    """
    n, C = y.shape
    pairs = out.shape[0] > 4
    centred = out.shape[0] > 5
    kept = out.shape[0] > 6
    above = out.shape[0] > 7
    local = pairs and reach > 0
    # the means: over every row, and over the match's rows
    my = np.zeros(C)
    mr = np.zeros(C)
    sy = np.zeros(C)
    sr = np.zeros(C)
    m = 0
    for i in range(n):
        for c in range(C):
            my[c] += y[i, c]
            mr[c] += r[i, c]
        if pairs and i >= m_start and (i - m_start) % m_stride == 0:
            m += 1
            for c in range(C):
                sy[c] += y[i, c]
                sr[c] += r[i, c]
    for c in range(C):
        my[c] /= n
        mr[c] /= n
        if m > 0:
            sy[c] /= m
            sr[c] /= m
    sy32 = sy.astype(np.float32)  # the unit rows are float32: so is their arithmetic (it vectorises)
    sr32 = sr.astype(np.float32)
    total = 0.0
    low = 1.0
    count = 0
    gains = np.empty(n)
    received = np.empty(n)  # |r_i|^2 as sent, of the rows with a gain
    m_gain = 0
    c_gains = np.empty(n if centred else 0)  # the centred tokens' gains
    m_centred = 0
    shares = np.empty(n if kept else 0)  # <y_i, r_i> / |r_i|^2 of the rows with a gain (the same m_gain rows)
    inv_y = np.zeros(n if local else 0)  # 1 / centred norm of each row (0: left out of the local match)
    inv_r = np.zeros(n if local else 0)
    as_sent = np.empty(n if local else 0)  # |r_i|^2 by row
    kept_sq = np.empty(n if local else 0)  # the same of the rows kept, for their median
    k_local = 0
    yn = np.empty((m, C), dtype=np.float32)  # the match's rows, unit and centred
    rn = np.empty((m, C), dtype=np.float32)
    pair_sq = np.empty(m)  # |r_i|^2 as sent, of the match rows kept
    k = 0
    for i in range(n):
        dot = 0.0
        ny = 0.0
        nr = 0.0
        s_y = 0.0
        s_r = 0.0
        s_yr = 0.0
        for c in range(C):
            yv = np.float64(y[i, c])
            rv = np.float64(r[i, c])
            a = yv - my[c]
            b = rv - mr[c]
            dot += a * b
            ny += a * a
            nr += b * b
            s_y += yv * yv
            s_r += rv * rv
            s_yr += yv * rv
        if local:
            as_sent[i] = s_r
            if ny > 0.0 and nr > 0.0:
                inv_y[i] = 1.0 / np.sqrt(ny)
                inv_r[i] = 1.0 / np.sqrt(nr)
                kept_sq[k_local] = s_r
                k_local += 1
        if pairs and i >= m_start and (i - m_start) % m_stride == 0:
            py = 0.0
            pr = 0.0
            for c in range(C):
                a = np.float64(y[i, c]) - sy[c]
                b = np.float64(r[i, c]) - sr[c]
                py += a * a
                pr += b * b
            if py > 0.0 and pr > 0.0:
                pair_sq[k] = s_r
                iy = np.float32(1.0 / np.sqrt(py))
                ir = np.float32(1.0 / np.sqrt(pr))
                for c in range(C):
                    yn[k, c] = (y[i, c] - sy32[c]) * iy
                    rn[k, c] = (r[i, c] - sr32[c]) * ir
                k += 1
        if skip_zero and (s_y == 0.0 or s_r == 0.0):
            continue
        if s_r > 0.0:
            gains[m_gain] = 0.5 * (np.log(s_y + 1e-60) - np.log(s_r))
            received[m_gain] = s_r
            if kept:
                shares[m_gain] = s_yr / s_r
            m_gain += 1
        if centred and nr > 0.0:
            c_gains[m_centred] = 0.5 * (np.log(ny + 1e-60) - np.log(nr))
            m_centred += 1
        if ny > 0.0 and nr > 0.0:
            cs = dot / np.sqrt(ny * nr)
            total += cs
            count += 1
            if cs < low:
                low = cs
    if count == 0:
        out[0] = 1.0
        out[1] = 1.0
    else:
        out[0] = 1.0 - total / count
        out[1] = 1.0 - low
    typ = np.median(received[:m_gain]) if m_gain > 0 and out.shape[0] > 3 else 0.0  # median |r|^2 (gain_high, retain)
    if out.shape[0] > 3:
        low = 0.0
        high = 0.0
        if m_gain > 0:
            mid = np.median(gains[:m_gain])
            limit = TYPICAL_RECEIVED * typ
            for j in range(m_gain):
                if mid - gains[j] > low:
                    low = mid - gains[j]
                if gains[j] - mid > high and received[j] <= limit:
                    high = gains[j] - mid
        out[2] = low
        out[3] = high
    if centred:
        low = 0.0
        if m_centred > 0:
            mid = np.median(c_gains[:m_centred])
            for j in range(m_centred):
                if mid - c_gains[j] > low:
                    low = mid - c_gains[j]
        out[5] = low
    if kept:
        low = 0.0
        high = 0.0
        if m_gain > 0:
            mid = np.median(shares[:m_gain])
            least = typ / TYPICAL_RECEIVED**2  # tokens of |r_i| >= median / e: not tiny
            most = typ * TYPICAL_RECEIVED  # nor far above typical (|r_i|^2 <= e x median, as gain_high)
            for j in range(m_gain):
                if least <= received[j] <= most:
                    if mid - shares[j] > low:
                        low = mid - shares[j]
                    if shares[j] - mid > high:
                        high = shares[j] - mid
        out[6] = low
        if above:
            out[7] = high
    if pairs:
        best = 0.0
        if k >= 2:
            limit = typical * np.median(pair_sq[:k]) if typical > 0.0 else np.inf
            best = -np.inf
            cols = np.ascontiguousarray(rn[:k].T)  # C, k
            rows = max(1, min(k, block // (k * C)))  # BLAS products small enough to stay in this thread
            gram = np.empty((rows, k), dtype=np.float32)
            for i0 in range(0, k, rows):
                i1 = min(k, i0 + rows)
                gram[: i1 - i0] = np.dot(yn[i0:i1], cols)
                for i in range(i0, i1):
                    g = gram[i - i0]
                    other = np.float32(-2.0)
                    for j in range(k):
                        if j != i and pair_sq[j] <= limit and g[j] > other:
                            other = g[j]
                    gap = match_gap(g[i], other, floor)
                    if gap > best:
                        best = gap
        out[4] = best
    if not local:
        return -np.inf
    if k_local < 2:
        return 0.0
    limit = typical * np.median(kept_sq[:k_local]) if typical > 0.0 else np.inf
    W = 2 * reach + 1
    ring = np.empty((W, C), dtype=np.float32)  # unit centred input rows j - reach .. j + reach, row j at j % W
    unit = np.empty(C, dtype=np.float32)
    my32 = my.astype(np.float32)  # float32 from here: the unit rows are float32 anyway, and it vectorises
    mr32 = mr.astype(np.float32)
    filled = 0  # rows below this are in the ring (or were)
    best = -np.inf
    for i in range(n):
        while filled < n and filled <= i + reach:
            if inv_r[filled] > 0.0:
                row = filled % W
                scale = np.float32(inv_r[filled])
                for c in range(C):
                    ring[row, c] = (r[filled, c] - mr32[c]) * scale
            filled += 1
        if inv_y[i] == 0.0:
            continue
        scale = np.float32(inv_y[i])
        for c in range(C):
            unit[c] = (y[i, c] - my32[c]) * scale
        own = np.float32(0.0)
        row = i % W
        for c in range(C):
            own += unit[c] * ring[row, c]
        other = np.float32(-2.0)
        for j in range(max(0, i - reach), min(n, i + reach + 1)):
            if j != i and inv_y[j] > 0.0 and as_sent[j] <= limit:
                d = np.float32(0.0)
                row = j % W
                for c in range(C):
                    d += unit[c] * ring[row, c]
                if d > other:
                    other = d
        gap = match_gap(own, other, floor)
        if gap > best:
            best = gap
    return best


@numba.njit(cache=True, nogil=True, fastmath=True)
def kept_cosine(y, r):  # pragma: no cover - compiled
    """cos(y, r) over the entries where both y and r (flat float32 arrays of one length) are non-zero: the entries
    both a sparse message and its sender's sparse input carry (`tokens.carry`); 0.0 when there is none, or when the
    entries kept are all zero in one of them. float64 sums (`fastmath`: their order only moves the last bits)."""
    yy = 0.0
    rr = 0.0
    yr = 0.0
    for i in range(y.shape[0]):
        a = np.float64(y[i])
        b = np.float64(r[i])
        if a != 0.0 and b != 0.0:
            yy += a * a
            rr += b * b
            yr += a * b
    if yy <= 0.0 or rr <= 0.0:
        return 0.0
    return yr / np.sqrt(yy * rr)


@numba.njit(cache=True, nogil=True)
def window_insert(rows, count, old, new, full):  # pragma: no cover - compiled
    """Sliding windows kept sorted: in each row of `rows` (D, W), whose first `count` entries are sorted,
    remove `old[i]` (when `full`) and insert `new[i]` in order. Values are finite."""
    D = rows.shape[0]
    for i in range(D):
        n = count
        if full:
            j = np.searchsorted(rows[i, :n], old[i])
            while j < n - 1 and rows[i, j] != old[i]:  # equal floats: the very value that was inserted
                j += 1
            for k in range(j, n - 1):
                rows[i, k] = rows[i, k + 1]
            n -= 1
        j = np.searchsorted(rows[i, :n], new[i])
        for k in range(n, j, -1):
            rows[i, k] = rows[i, k - 1]
        rows[i, j] = new[i]


@numba.njit(cache=True, nogil=True)
def tail_p(row, n, q0, floor, max_shape, x):  # pragma: no cover - compiled
    """Upper-tail p-value of x against the sorted window `row[:n]` (see `calibration.py`): above the window's q0
    quantile u (numpy's linear quantile) a generalised Pareto tail whose shape xi and scale beta are the
    method-of-moments fit to the window's excesses over u (xi = (1 - mean^2 / var) / 2 clipped to
    [0, max_shape], beta = mean (1 - xi) floored at `floor`); at or below u the empirical rank
    (1 + #{w >= x}) / (n + 1)."""
    pos = q0 * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    u = row[lo] + (pos - lo) * (row[hi] - row[lo])
    if x <= u:
        below = np.searchsorted(row[:n], x)  # values < x
        return (1.0 + n - below) / (n + 1.0)
    total = 0.0
    total2 = 0.0
    k = 0
    j = n - 1
    while j >= 0 and row[j] > u:
        e = row[j] - u
        total += e
        total2 += e * e
        k += 1
        j -= 1
    mean = total / k if k > 0 else 0.0
    xi = 0.0
    if k > 2:
        var = (total2 - k * mean * mean) / (k - 1)
        if var > 0.0:
            xi = 0.5 * (1.0 - mean * mean / var)
            xi = min(max(xi, 0.0), max_shape)
    beta = max(mean * (1.0 - xi), floor)
    z = (x - u) / beta
    if xi < 1e-6:
        return (1.0 - q0) * np.exp(-z)
    return (1.0 - q0) * np.exp(-np.log1p(xi * z) / xi)


@numba.njit(cache=True, nogil=True)
def tail_pvalues(rows, count, q0, floor, max_shape, t, out):  # pragma: no cover - compiled
    """Upper-tail p-values (`tail_p`) of t (D,) against sorted windows `rows` (D, >= count). NaN -> NaN."""
    for i in range(rows.shape[0]):
        out[i] = np.nan if np.isnan(t[i]) else tail_p(rows[i], count, q0, floor[i], max_shape, t[i])


@numba.njit(cache=True, nogil=True)
def recent_pvalues(ring, pos, count, recent, q0, floor, max_shape, t, out):  # pragma: no cover - compiled
    """Where a value lies in its window's tail (out[i] < 1 - q0), raise its p-value `out[i]` to its tail p-value
    (`tail_p`) against the window's `recent` latest values: those before `pos` in the arrival-order ring
    (W, D) of a window holding `count` values. Nothing changes unless count > recent."""
    if recent <= 0 or count <= recent:
        return
    W = ring.shape[0]
    buf = np.empty(recent)
    for i in range(out.shape[0]):
        if not out[i] < 1.0 - q0:  # in the window's body, or NaN
            continue
        for k in range(recent):
            buf[k] = ring[(pos - 1 - k) % W, i]
        buf.sort()
        out[i] = max(out[i], tail_p(buf, recent, q0, floor[i], max_shape, t[i]))


@numba.njit(cache=True, nogil=True)
def bonferroni(p, subset):  # pragma: no cover - compiled
    """(min(1, D min_i p_i) over the non-NaN p, the same over those where `subset` is true): Bonferroni's combined
    p-values of all statistics and of a subset; NaN for a subset without any value (1 when `p` has none)."""
    lo, n, lo_s, n_s = 1.0, 0, 1.0, 0
    for i in range(p.shape[0]):
        v = p[i]
        if v == v:
            n += 1
            lo = min(lo, v)
            if subset[i]:
                n_s += 1
                lo_s = min(lo_s, v)
    all_ = min(1.0, lo * n) if n > 0 else 1.0
    part = min(1.0, lo_s * n_s) if n_s > 0 else np.nan
    return all_, part


@numba.njit(cache=True, nogil=True, fastmath=True)
def id_relation(z, ids, table, weight, center, out):  # pragma: no cover - compiled
    """The first stage's relation to its input token ids (see `tokens.IdRelation`): z (m, K) float32 are sampled
    output tokens (projected), ids (m,) their input token ids, table (V, K) / weight (V,) the bias-corrected
    running mean output of each id, center (K,) the running mean of every token. Over the tokens whose id was
    seen before, cos_i = cos(z_i - center, table[id_i] / weight[id_i] - center); out[0] = 1 - mean cos,
    out[1] = 1 - min cos; NaN, NaN when no token's id was seen before. (Centred by the stream's mean token, not
    the message's: a message made mostly of one token -- a run of spaces -- would otherwise keep only its
    context-dependent variation, which the id does not predict.)"""
    m, K = z.shape
    V = table.shape[0]
    total = 0.0
    low = 1.0
    count = 0
    known = 0
    for i in range(m):
        v = ids[i]
        if not (0 <= v < V and weight[v] > 0.0):
            continue
        known += 1
        dot = 0.0
        na = 0.0
        nb = 0.0
        for c in range(K):
            a = z[i, c] - center[c]
            b = table[v, c] / weight[v] - center[c]
            dot += a * b
            na += a * a
            nb += b * b
        if na > 0.0 and nb > 0.0:
            cs = dot / np.sqrt(na * nb)
            total += cs
            count += 1
            if cs < low:
                low = cs
    if known == 0:
        out[0] = np.nan
        out[1] = np.nan
    elif count == 0:
        out[0] = 1.0
        out[1] = 1.0
    else:
        out[0] = 1.0 - total / count
        out[1] = 1.0 - low


@numba.njit(cache=True, nogil=True)
def id_learn(z, ids, table, weight, center, beta):  # pragma: no cover - compiled
    """Running means per token id: table[v] <- beta table[v] + (1 - beta) z_i, weight[v] likewise from 0 (so
    table[v] / weight[v] is the bias-corrected mean), for every sampled token i of id v < V; center[:K] the
    bias-corrected running mean of every token (center[K] its weight)."""
    m, K = z.shape
    V = table.shape[0]
    for i in range(m):
        v = ids[i]
        if 0 <= v < V:
            for c in range(K):
                table[v, c] = beta * table[v, c] + (1.0 - beta) * z[i, c]
            weight[v] = beta * weight[v] + (1.0 - beta)
    b = beta ** (1.0 / max(m, 1))  # the whole message moves the mean token as much as one token moves its id's
    for i in range(m):
        for c in range(K):
            center[c] = b * center[c] + (1.0 - b) * z[i, c]
        center[K] = b * center[K] + (1.0 - b)


@numba.njit(cache=True, nogil=True)
def calibrate(rows, ring, pos, count, recent, q0, floor, max_shape, logs, values, subset, t, p):  # pragma: no cover
    """One message's calibration in one call: t = values on the calibration scale (log where `logs`; NaN stays
    NaN), p = their tail p-values (`tail_pvalues`, raised by `recent_pvalues`); returns Bonferroni's p over all
    and over `subset` (`bonferroni`)."""
    for i in range(values.shape[0]):
        v = values[i]
        t[i] = np.log(max(v, 1e-30)) if logs[i] and v == v else v
    tail_pvalues(rows, count, q0, floor, max_shape, t, p)
    recent_pvalues(ring, pos, count, recent, q0, floor, max_shape, t, p)
    return bonferroni(p, subset)


@numba.njit(cache=True, nogil=True)
def window_push(rows, ring, pos, count, t):  # pragma: no cover - compiled
    """Add t (D,) to sorted windows `rows` (D, W) and the arrival-order ring (W, D) at `pos`: the value at `pos`
    leaves a full window (count == W). Values are finite."""
    full = count == ring.shape[0]
    window_insert(rows, count, ring[pos].copy(), t, full)
    for i in range(t.shape[0]):
        ring[pos, i] = t[i]
