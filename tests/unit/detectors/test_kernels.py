"""The compiled loops of the signature, distances and fences against plain numpy references.

`signature` must equal the numpy computation it replaced (reproduced below: token clipping, sampling, pooled mean,
moments, quantiles), bit for bit where it sums in the same order; distances agree to rounding (numpy sums pairwise,
the loop in order); fence quartiles are numpy's linear quantiles.
"""

import numpy as np
import pytest
import torch

from sentinel.detectors.baseline import Baseline, Fences
from sentinel.detectors.distances import DISTANCES, Projections, distances, layout, signature


def reference_signature(x, proj, pooling, max_tokens=None, offset=0, token_clip=None):
    C = x.shape[-1]
    tokens = x.detach().float().numpy().reshape(-1, C)
    n = tokens.shape[0]
    stride = 1 if max_tokens is None or n <= max_tokens else -(-n // max_tokens)
    rows = slice(offset % stride, None, stride)
    if token_clip is not None:
        sq = np.einsum("ij,ij->i", tokens, tokens)
        pos = sq[rows]
        pos = pos[pos > 0]
        if pos.size:
            cap2 = token_clip * token_clip * float(np.partition(pos, pos.size // 2)[pos.size // 2])
            if sq.max() > cap2:
                tokens = tokens * np.sqrt(np.minimum(1.0, cap2 / np.maximum(sq, 1e-30))).astype(np.float32)[:, None]
    sample = np.ascontiguousarray(tokens[rows])
    m = sample.shape[0]
    both = np.concatenate([sample, np.empty((m, proj.num_projections), np.float32)], axis=1)
    both[:, C:] = sample @ proj.theta_t
    mean = np.add.reduce(both, axis=0) / np.float32(m)
    d = both - mean
    d2 = d * d
    m2 = np.add.reduce(d2, axis=0) / np.float32(m)
    m3 = np.add.reduce(d2 * d, axis=0) / np.float32(m)
    skew = m3 / np.maximum(m2 * np.sqrt(m2), np.float32(1e-30))
    quant = np.sort(both[:, C:].T, axis=1)[:, proj.index(m)]
    pooled = tokens.reshape(-1) if pooling == "full" else np.add.reduce(tokens, axis=0) / np.float32(n)
    pooled = pooled.astype(np.float64)
    return np.concatenate([pooled, skew, quant.reshape(-1), [pooled @ pooled]])


def payloads():
    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        shape = [(4, 32, 64), (2, 5, 16), (3, 7, 32), (1, 1, 8)][trial % 4]
        x = torch.randn(*shape, generator=g) * float(torch.rand(1, generator=g) * 10)
        flat = x.view(-1, shape[-1])
        if trial % 3 == 0:
            flat[torch.randint(0, flat.shape[0], (3,), generator=g)] *= 1000  # clipped
        if trial % 7 == 0:
            flat[::2] = 0  # masked tokens
        if trial % 11 == 0:
            x[..., 0] = 1.0  # a constant feature
        if trial % 13 == 0:
            flat[-1, 0] = float("nan")
        if trial % 17 == 0:
            flat[0, 1] = float("inf")
        if trial % 19 == 0:
            x.zero_()
        yield trial, x


def test_signature_is_the_numpy_computation():
    """Bit for bit where the kernel sums in numpy's order (without clipping: every entry but the squared norm of the
    pooled part); to float32 rounding where it does not (the squared token norms, which set the clipping scale)."""
    for trial, x in payloads():
        proj = Projections(x.shape[-1], 8, 16, seed=trial)
        for pooling in ("token_mean", "full"):
            for max_tokens in (None, 8):
                for clip in (None, 10.0, 1.5):
                    with np.errstate(all="ignore"):
                        want = reference_signature(x, proj, pooling, max_tokens, trial, clip)
                    got = signature(x, proj, pooling, max_tokens, trial, clip)
                    case = (trial, pooling, max_tokens, clip)
                    if clip is None:
                        assert np.array_equal(got[:-1], want[:-1], equal_nan=True), case
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True, err_msg=str(case))


def reference_distances(sig, base):
    L = base.layout
    p = sig[L.pooled]
    diff = p - base.pooled
    s = sig[L.skew]
    return np.array(
        [
            np.abs(diff).mean(),
            np.sqrt(diff @ diff) * base.inv_rms,
            np.count_nonzero(np.sign(p) != base.pooled_sign) / p.shape[0],
            np.abs(sig[L.quant] - base.quant).mean(),
            np.sqrt((diff * diff * base.inv_var).mean()),
            1.0 - (s @ base.skew) / max(np.sqrt(s @ s) * base.skew_norm, 1e-30),
        ]
    )


def test_distances_agree_with_numpy_to_rounding():
    proj = Projections(32, 8, 16, seed=0)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(3, 7, 32, generator=g) for _ in range(6)]
    b = Baseline(0.9, 0.99)
    for x in xs[:4]:
        b.update(signature(x, proj, "token_mean"), layout(tuple(x.shape), proj, "token_mean"))
    for x in (xs[4], -xs[5], xs[5] + 3.0):
        sig = signature(x, proj, "token_mean")
        np.testing.assert_allclose(distances(sig, b.view(), DISTANCES), reference_distances(sig, b.view()), rtol=1e-12)
        names = ("skewness", "l1")
        np.testing.assert_array_equal(distances(sig, b.view(), names), distances(sig, b.view(), DISTANCES)[[5, 0]])


def test_baseline_update_and_view_are_their_numpy_definitions():
    """`kernels.ema_update` and `kernels.baseline_view` against the definitions (`baseline.Baseline`): m_t = beta m + (1 -
    beta) s, m_hat = m_t / (1 - beta^t); var the EMA (beta_var) of the squared innovation of the pooled part against
    the previous m_hat, bias-corrected over the updates that had one (ones before any); inv_var = 1 / (var + 1e-6 x
    mean var). The EMAs bit for bit (the same operations element by element), the derived values to rounding."""
    proj = Projections(32, 8, 16, seed=0)
    g = torch.Generator().manual_seed(3)
    beta, beta_var = 0.9, 0.99
    b = Baseline(beta, beta_var)
    lay = layout((3, 7, 32), proj, "token_mean")
    m = np.zeros(lay.size)
    var = None
    for t in range(1, 8):
        sig = signature(torch.randn(3, 7, 32, generator=g) * t, proj, "token_mean")
        if t > 1:
            innov = (sig[lay.pooled] - (m / (1 - beta ** (t - 1)))[lay.pooled]) ** 2
            var = (1 - beta_var) * innov if var is None else beta_var * var + (1 - beta_var) * innov
        m = beta * m + (1 - beta) * sig
        b.update(sig, lay)
        np.testing.assert_array_equal(b._m, m)
        if var is not None:
            np.testing.assert_array_equal(b._var, var)
        v = b.view()
        mean = m / (1 - beta**t)
        np.testing.assert_array_equal(v.pooled, mean[lay.pooled])
        np.testing.assert_array_equal(v.quant, mean[lay.quant])
        want_var = np.ones(32) if var is None else var / (1 - beta_var ** (t - 1))
        np.testing.assert_allclose(v.var, want_var, rtol=1e-15)
        np.testing.assert_allclose(v.inv_var, 1 / (want_var + 1e-6 * want_var.mean()), rtol=1e-12)
        np.testing.assert_array_equal(v.pooled_sign, np.sign(mean[lay.pooled]))
        np.testing.assert_allclose(v.skew_norm, np.linalg.norm(mean[lay.skew]), rtol=1e-12)
        np.testing.assert_allclose(v.inv_rms, 1 / np.sqrt(mean[lay.sq_norm]), rtol=1e-12)


@pytest.mark.parametrize("count", [1, 2, 7, 16, 100])
def test_fence_quartiles_are_numpy_linear_quantiles(count):
    rng = np.random.default_rng(count)
    f = Fences(("a", "b", "c"), window=100, k=4.0, log=(True, False, False))
    f.set_resolution(np.array([0.0, 0.0, 0.25]))
    for _ in range(count):
        f.push(np.exp(rng.standard_normal(3)))
    q3, iqr = f.quartiles()
    window = f._buf[: f.count]
    want_q1, want_q3 = np.quantile(window, 0.25, axis=0), np.quantile(window, 0.75, axis=0)
    np.testing.assert_allclose(q3, want_q3, rtol=1e-14)  # numpy interpolates from the nearer end: rounding
    floor = np.where([True, False, False], 0.01, np.maximum(0.01 * np.abs(want_q3) + 1e-30, [0.0, 0.0, 0.25]))
    np.testing.assert_allclose(iqr, np.maximum(want_q3 - want_q1, floor), rtol=1e-12)
