"""Signatures, distances, baselines and fences: hand-checkable values."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

from sentinel.detectors.baseline import Baseline, Fences
from sentinel.detectors.distances import DISTANCES, MAGNITUDES, Projections, distances, layout, signature


def _payload(seed: int, shape=(4, 8, 16), skew: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) + torch.linspace(-1, 1, shape[-1])
    return x + (torch.rand(shape, generator=g).pow(4) * 3 if skew else 0)  # right-skewed per feature


def _baseline_of(x: torch.Tensor, proj: Projections, pooling: str = "token_mean") -> Baseline:
    b = Baseline(beta=0.9, beta_var=0.99)
    b.update(signature(x, proj, pooling), layout(tuple(x.shape), proj, pooling))
    return b


@pytest.fixture
def proj():
    return Projections(16, num_projections=8, num_quantiles=16, seed=0)


def test_identical_message_has_zero_distances(proj):
    x = _payload(0)
    d = distances(signature(x, proj, "token_mean"), _baseline_of(x, proj).view(), DISTANCES)
    names = dict(zip(DISTANCES, d))
    for n in ("l1", "l2_normalized", "sign_flip_ratio", "sliced_wasserstein", "z_mean"):
        assert names[n] == pytest.approx(0.0, abs=1e-6), n
    assert names["skewness"] == pytest.approx(0.0, abs=1e-5)


def test_sign_flip_is_maximal_for_sign_ratio_and_skewness(proj):
    x = _payload(1)
    d = dict(zip(DISTANCES, distances(signature(-x, proj, "token_mean"), _baseline_of(x, proj).view(), DISTANCES)))
    assert d["sign_flip_ratio"] == pytest.approx(1.0)
    assert d["skewness"] == pytest.approx(2.0, abs=1e-5)  # kappa(-x) = -kappa(x): cosine -1


def test_l1_and_l2_normalized_by_hand(proj):
    x = _payload(2)
    base = _baseline_of(x, proj).view()
    y = x + 0.5  # a bias shifts every pooled coordinate by 0.5
    d = dict(zip(DISTANCES, distances(signature(y, proj, "token_mean"), base, DISTANCES)))
    assert d["l1"] == pytest.approx(0.5, rel=1e-5)
    pooled = x.reshape(-1, 16).mean(0)
    assert d["l2_normalized"] == pytest.approx(0.5 * 4 / float(pooled.norm()), rel=1e-4)  # ||0.5 * 1_16|| = 2


def test_sliced_wasserstein_matches_scipy_for_one_direction():
    proj = Projections(16, num_projections=1, num_quantiles=4096, seed=3)
    x, y = _payload(3, (16, 64, 16)), _payload(4, (16, 64, 16)) * 1.5
    base = _baseline_of(x, proj).view()
    got = dict(zip(DISTANCES, distances(signature(y, proj, "token_mean"), base, DISTANCES)))["sliced_wasserstein"]
    theta = torch.from_numpy(proj.theta[0])
    ref = wasserstein_distance((x.reshape(-1, 16) @ theta).numpy(), (y.reshape(-1, 16) @ theta).numpy())
    assert got == pytest.approx(ref, rel=0.02)


def test_projections_are_seeded_unit_vectors():
    a, b, c = Projections(32, 8, 8, seed=5), Projections(32, 8, 8, seed=5), Projections(32, 8, 8, seed=6)
    assert np.array_equal(a.theta, b.theta) and not np.array_equal(a.theta, c.theta)
    np.testing.assert_allclose(np.linalg.norm(a.theta, axis=1), np.ones(8), rtol=1e-6)


def test_full_pooling_compares_whole_tensors(proj):
    x = _payload(5)
    d = dict(
        zip(DISTANCES, distances(signature(x.flip(0), proj, "full"), _baseline_of(x, proj, "full").view(), DISTANCES))
    )
    assert d["l1"] > 0.1  # token order matters for full pooling
    d_mean = distances(signature(x.flip(0), proj, "token_mean"), _baseline_of(x, proj).view(), DISTANCES)
    assert d_mean[0] == pytest.approx(0.0, abs=1e-6)  # ...and not for the token mean


def test_constant_payload_gives_finite_distances(proj):
    x = _payload(6)
    d = distances(signature(torch.zeros_like(x), proj, "token_mean"), _baseline_of(x, proj).view(), DISTANCES)
    assert np.isfinite(d).all()


def test_baseline_bias_correction_is_exact_for_a_constant_stream(proj):
    x = _payload(7)
    sig, lay = signature(x, proj, "token_mean"), layout(tuple(x.shape), proj, "token_mean")
    b = Baseline(beta=0.9, beta_var=0.99, keep_full=True)
    for _ in range(5):
        b.update(sig, lay, x)
    torch.testing.assert_close(b.view().pooled, sig[lay.pooled])
    torch.testing.assert_close(b.full(), x)
    assert b.n == 5


def test_fences_match_numpy_quantiles():
    f = Fences(("a", "b"), window=10, k=1.5)
    rng = np.random.default_rng(0)
    vals = rng.random((25, 2))
    for v in vals:
        f.push(v)
    last = vals[-10:]
    q1, q3 = np.quantile(last, [0.25, 0.75], axis=0)
    thr = f.thresholds()
    assert thr["a"] == pytest.approx(q3[0] + 1.5 * (q3[0] - q1[0]))
    assert thr["b"] == pytest.approx(q3[1] + 1.5 * (q3[1] - q1[1]))
    e = f.exceedance(np.array([thr["a"], thr["b"]]))
    np.testing.assert_allclose(e, [1.5, 1.5])


def test_log_fences_are_multiplicative():
    f = Fences(("a",), window=4, k=1.0, log=True)
    for v in (1.0, 2.0, 4.0, 8.0):
        f.push(np.array([v]))
    q1, q3 = np.quantile(np.log([1.0, 2.0, 4.0, 8.0]), [0.25, 0.75])
    assert f.thresholds()["a"] == pytest.approx(np.exp(q3 + (q3 - q1)))


def test_fences_take_a_log_scale_per_statistic():
    vals = np.array([[1.0, 1.0], [2.0, 2.0], [4.0, 4.0], [8.0, 8.0]])
    mixed = Fences(("a", "b"), window=4, k=1.0, log=(True, False))
    lin, log = Fences(("b",), window=4, k=1.0), Fences(("a",), window=4, k=1.0, log=True)
    for v in vals:
        mixed.push(v)
        log.push(v[:1])
        lin.push(v[1:])
    thr = mixed.thresholds()
    assert thr["a"] == pytest.approx(log.thresholds()["a"])
    assert thr["b"] == pytest.approx(lin.thresholds()["b"])
    assert not mixed.log and log.log
    np.testing.assert_allclose(mixed.exceedance(np.array([thr["a"], thr["b"]])), [1.0, 1.0])


def test_auto_fence_scale_logs_the_magnitudes_only():
    from sentinel.detectors.stagewise import Sentinel
    from sentinel.detectors.streams import fence_logs

    cfg = Sentinel.Config(distances=DISTANCES, fence_scale="auto")
    assert fence_logs(cfg) == tuple(d in MAGNITUDES for d in DISTANCES)
    assert fence_logs(dataclasses.replace(cfg, fence_scale="linear")) == (False,) * len(DISTANCES)
    assert "sign_flip_ratio" not in MAGNITUDES and "l1" in MAGNITUDES


def test_token_clip_leaves_dense_traffic_alone(proj):
    x = torch.randn(4, 16, 16, generator=torch.Generator().manual_seed(0))  # Gaussian token norms: within 10x
    np.testing.assert_array_equal(signature(x, proj, "token_mean", token_clip=10.0), signature(x, proj, "token_mean"))


def test_token_clip_caps_huge_tokens_and_keeps_their_direction(proj):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    x[3] *= 1e4
    x[10:20] = 0.0  # masked-out tokens do not count toward the median
    norms = np.linalg.norm(x, axis=1)
    nz = np.sort(norms[norms > 0])
    cap = 10.0 * nz[len(nz) // 2]  # the upper median
    y = x.copy()
    y[3] *= cap / norms[3]
    got = signature(torch.from_numpy(x), proj, "full", token_clip=10.0)
    np.testing.assert_allclose(got[: x.size].reshape(x.shape), y, rtol=1e-5)  # `full` pooling: the tokens
    keep = np.arange(64) != 3
    np.testing.assert_array_equal(got[: x.size].reshape(x.shape)[keep], x[keep])
    zeros = torch.zeros(8, 16)
    np.testing.assert_array_equal(
        signature(zeros, proj, "token_mean", token_clip=10.0), signature(zeros, proj, "token_mean")
    )


def test_token_clip_bounds_the_signature_shift_of_one_huge_token(proj):
    x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(2))
    spiked = x.clone()
    spiked[0, 0] *= 1e6
    base = signature(x, proj, "token_mean")
    off = np.abs(signature(spiked, proj, "token_mean") - base).max()
    on = np.abs(
        signature(spiked, proj, "token_mean", token_clip=10.0) - signature(x, proj, "token_mean", token_clip=10.0)
    ).max()
    assert off > 1e4 and on < 10.0


def test_sender_median_baseline_ignores_a_minority_sender(proj):
    from sentinel.detectors.baseline import SenderMedianBaseline

    lay = layout((4, 8, 16), proj, "token_mean")
    b = SenderMedianBaseline(beta=0.5, beta_var=0.9)
    honest = [signature(_payload(10 + i), proj, "token_mean") for i in range(3)]
    for i, sig in enumerate(honest):
        b.update(sig, lay, sender=f"s1r{i % 2}", step=i)
    b.update(signature(_payload(20) + 100.0, proj, "token_mean"), lay, sender="s1r2", step=3)  # a wild sender
    assert float(np.abs(b.view().pooled).max()) < 10  # the median of three senders ignores the wild one
    single = SenderMedianBaseline(beta=0.5, beta_var=0.9)
    pooled = Baseline(beta=0.5, beta_var=0.9)
    for i, sig in enumerate(honest):
        single.update(sig, lay, sender="s1r0", step=i)
        pooled.update(sig, lay)
    np.testing.assert_allclose(single.view().pooled, pooled.view().pooled)


def _reference_signature(x: torch.Tensor, proj: Projections, max_tokens: int, offset: int) -> np.ndarray:
    """The signature's definition, directly and in float64 (module docstring of distances.py)."""
    C = x.shape[-1]
    tokens = x.reshape(-1, C).double().numpy()
    stride = 1 if len(tokens) <= max_tokens else -(-len(tokens) // max_tokens)
    sample = tokens[offset % stride :: stride]
    both = np.concatenate([sample, sample @ proj.theta.T.astype(np.float64)], axis=1)
    d = both - both.mean(axis=0)
    skew = (d**3).mean(axis=0) / np.maximum((d**2).mean(axis=0) ** 1.5, 1e-30)
    quant = np.sort(both[:, C:], axis=0)[proj.index(len(sample))].T
    pooled = tokens.mean(axis=0)
    return np.concatenate([pooled, skew, quant.reshape(-1), [pooled @ pooled]])


@pytest.mark.parametrize("shape, offset", [((4, 8, 16), 0), ((4, 64, 64), 3), ((2, 96, 64), 1)])
def test_signature_matches_its_definition(shape, offset):
    """Blocked projections, unwrapped means and the token-mean reduction compute the documented quantities
    (the second and third shapes subsample tokens and split the projections into several blocks)."""
    proj = Projections(shape[-1], num_projections=64, num_quantiles=16, seed=1)
    x = _payload(11, shape)
    got = signature(x, proj, "token_mean", max_tokens=128, offset=offset)
    np.testing.assert_allclose(got, _reference_signature(x, proj, 128, offset), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("exponent", [40, 50, 66, 120])
def test_signature_of_a_huge_finite_payload_is_finite_and_scales_exactly(proj, exponent):
    """Entries past ~1e12 overflow float32 cubes (the skewness) and, past ~1e19, squares: such a payload is still
    finite (honest top-k compressed gradients reached 1e14 per entry), so its signature must be too. Scaling by a
    power of two is exact: the signature equals the small payload's with its scale-dependent parts scaled."""
    x = _payload(3)
    small = signature(x, proj, "token_mean", 16, 1, 10.0, n_small := np.empty(2)).copy()
    big = signature(x * 2.0**exponent, proj, "token_mean", 16, 1, 10.0, n_big := np.empty(2))
    L = layout(tuple(x.shape), proj, "token_mean")
    assert np.isfinite(big).all()
    np.testing.assert_array_equal(big[L.skew], small[L.skew])
    np.testing.assert_array_equal(big[L.pooled], np.ldexp(small[L.pooled], exponent))
    np.testing.assert_array_equal(big[L.quant], np.ldexp(small[L.quant], exponent))
    assert big[L.sq_norm] == np.ldexp(small[L.sq_norm], 2 * exponent)
    np.testing.assert_array_equal(n_big, np.ldexp(n_small, 2 * exponent))
    bad = (x * 2.0**exponent).clone()
    bad.view(-1)[7] = float("inf")
    assert not np.isfinite(signature(bad, proj, "token_mean", 16, 1, 10.0)).all()  # a real Inf stays visible


def test_projections_run_in_blocks_below_the_blas_threading_threshold():
    """The signature's projections are BLAS products of at most BLAS_SINGLE_THREAD_MNK multiply-adds (OpenBLAS keeps
    those in the calling thread); the default blocks give what one product gives, up to float32 rounding: bit for bit
    on some CPUs, not on an AMD EPYC (OpenBLAS 0.3.31: up to 2e-6 apart, a product's kernel depends on its shape).
    Runs stay deterministic: a message is always cut into the same blocks."""
    from sentinel.detectors import kernels
    from sentinel.detectors.distances import BLAS_SINGLE_THREAD_MNK

    proj = Projections(128, num_projections=32, num_quantiles=8, seed=0)
    tokens = _payload(12, (2, 100, 128)).reshape(-1, 128).numpy()
    feats, z, ordered = proj.workspace(200)
    outs = []
    for block in (BLAS_SINGLE_THREAD_MNK, 1 << 40):
        sig = np.empty(layout((2, 100, 128), proj, "token_mean").size)
        kernels.signature(tokens, 0, 1, 0.0, False, proj.theta_t, block, feats, z, ordered, sig, np.empty(2))
        np.testing.assert_allclose(z, tokens @ proj.theta.T, rtol=1e-5, atol=1e-5)
        outs.append(np.concatenate([z.reshape(-1), sig[128 : 128 + 128 + 32]]))  # slices and skewness
    assert BLAS_SINGLE_THREAD_MNK // (128 * 32) < 200  # the default takes several blocks here
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_chunked_ema_equals_the_one_call_update():
    """`ema_` splits the update so torch runs it in the calling thread; the values are bit for bit the same."""
    from sentinel.detectors.baseline import SERIAL_NUMEL, ema_

    for shape in [(4, 8, 16), (8, 64, 128), (3, SERIAL_NUMEL // 7 + 5, 7)]:
        acc, x = _payload(13, shape), _payload(14, shape)
        ref = acc.clone()
        for beta in (0.8, 0.37):
            ref.mul_(beta).add_(x, alpha=1 - beta)
            ema_(acc, x, beta)
        assert torch.equal(acc, ref)


def test_a_discrete_distance_is_fenced_at_its_resolution_not_at_1e28():
    # a window of identical sign-flip ratios (0: no feature ever flipped) used to floor the IQR at 1e-30, so
    # one flipped feature out of 64 scored an exceedance of ~1.6e28 and was flagged
    f = Fences(("sign_flip_ratio", "l1"), window=16, k=4.0)
    f.set_resolution(np.array([1 / 64, 0.0]))
    for _ in range(16):
        f.push(np.array([0.0, 1.0]))
    one, five = f.exceedance(np.array([1 / 64, 1.0])), f.exceedance(np.array([5 / 64, 1.0]))
    assert one[0] == pytest.approx(1.0) and five[0] == pytest.approx(5.0)  # in units of one flipped feature
    assert f.level(4.0)[0] == pytest.approx(4 / 64)


def test_sentinel_sets_the_sign_flip_resolution_from_the_payload(proj):
    from sentinel.detectors.distances import resolutions
    from sentinel.detectors.stagewise import Sentinel

    lay = layout((4, 8, 16), proj, "token_mean")
    np.testing.assert_allclose(resolutions(("l1", "sign_flip_ratio", "skewness"), lay), [0.0, 1 / 16, 0.0])
    det = Sentinel(Sentinel.Config())
    from sentinel.transport.message import Message, Role

    x = _payload(0)
    det.observe(Message(step=0, mb_idx=0, boundary=1, role=Role.ACTIVATION, sender="s1r0", receiver="s2r0", payload=x))
    st = det._streams[(1, int(Role.ACTIVATION))]
    i = st.names.index("sign_flip_ratio")
    assert st.fences.resolution[i] == pytest.approx(1 / 16) and st.fences.resolution[st.names.index("l1")] == 0
