"""DP aggregators: hand-computed values, domain rules, and robustness properties (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.engine.aggregators import (
    CenteredClip,
    GeometricMedian,
    Krum,
    Mean,
    Median,
    MultiKrum,
    TrimmedMean,
    krum_scores,
)
from sentinel.registry import AGGREGATORS

ROBUST = ["median", "trimmed_mean", "krum", "multi_krum", "centered_clip", "geometric_median"]
W = None  # robust rules ignore the weights


def _rows(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_every_aggregator_is_registered():
    assert set(ROBUST) | {"mean"} <= set(AGGREGATORS.names())


def test_mean_uses_weights():
    out = Mean()(_rows([0.0, 0.0], [3.0, 6.0]), torch.tensor([2.0, 1.0]))
    torch.testing.assert_close(out, _rows([1.0, 2.0])[0])


def test_median_hand_computed():
    x = _rows([1.0, 10.0], [2.0, -5.0], [100.0, 0.0])
    torch.testing.assert_close(Median()(x, W), _rows([2.0, 0.0])[0])
    x4 = _rows([1.0], [2.0], [4.0], [100.0])  # even n: mean of the two middle values
    torch.testing.assert_close(Median()(x4, W), _rows([3.0])[0])


def test_trimmed_mean_hand_computed():
    x = _rows([1.0], [2.0], [3.0], [4.0], [100.0])
    torch.testing.assert_close(TrimmedMean(TrimmedMean.Config(f=1))(x, W), _rows([3.0])[0])  # (2+3+4)/3
    torch.testing.assert_close(TrimmedMean(TrimmedMean.Config(f=2))(x, W), _rows([3.0])[0])
    torch.testing.assert_close(TrimmedMean(TrimmedMean.Config(f=0))(x, W), _rows([22.0])[0])


def test_krum_hand_computed():
    # n=5, f=1 -> each row sums its n-f-2 = 2 nearest squared distances
    x = _rows([0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [50.0, 0.0], [60.0, 0.0])
    scores = krum_scores(x, f=1)
    torch.testing.assert_close(scores, _rows([10.0, 5.0, 13.0, 100.0 + 47.0**2, 100.0 + 57.0**2])[0])
    torch.testing.assert_close(Krum(Krum.Config(f=1))(x, W), x[1])
    # multi-krum with m=2 averages the two best rows
    torch.testing.assert_close(MultiKrum(MultiKrum.Config(f=1, m=2))(x, W), _rows([0.5, 0.0])[0])
    # a configured f outside the domain for the rows present degrades to the largest tolerable f
    assert Krum(Krum.Config(f=3))._f(5) == 1


def test_centered_clip_hand_computed():
    # start at the coordinate-wise median 1; tau = 1 (absolute); one iteration:
    # clip(z) for z = x - 1 = [-1, -1, 0, 0.5, 99] is [-1, -1, 0, 0.5, 1] -> v = 1 + (-0.5/5) = 0.9
    x = _rows([0.0], [0.0], [1.0], [1.5], [100.0])
    out = CenteredClip(CenteredClip.Config(tau=1.0, tau_relative=False, iterations=1))(x, W)
    torch.testing.assert_close(out, _rows([0.9])[0])
    # relative tau: the median distance to the start, median |z| = 1, gives the same result
    out = CenteredClip(CenteredClip.Config(tau=1.0, iterations=1))(x, W)
    torch.testing.assert_close(out, _rows([0.9])[0])


def test_geometric_median_of_collinear_points_is_the_median():
    x = _rows([0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [1000.0, 0.0])
    out = GeometricMedian(GeometricMedian.Config(iterations=500, tol=1e-12))(x, W)
    torch.testing.assert_close(out, _rows([2.0, 0.0])[0], atol=1e-3, rtol=0)


def test_single_row_is_returned_unchanged():
    x = _rows([1.0, -2.0])
    for name in ROBUST:
        torch.testing.assert_close(AGGREGATORS.get(name)()(x, W).double(), x[0], msg=name)


@pytest.mark.parametrize(
    "name,n,f,ok",
    [
        ("median", 3, 1, True),
        ("median", 2, 1, False),
        ("trimmed_mean", 5, 2, True),
        ("trimmed_mean", 4, 2, False),
        ("krum", 5, 1, True),
        ("krum", 4, 1, False),
        ("multi_krum", 7, 2, True),
        ("centered_clip", 4, 2, False),
        ("geometric_median", 5, 2, True),
        ("mean", 5, 2, True),
    ],
)
def test_domain_rules(name, n, f, ok):
    cls = AGGREGATORS.get(name)
    msg = cls.check_domain(cls.Config(), n, f)
    assert (msg is None) == ok, msg
    if not ok:
        assert f"n={n}" in msg and f"f={f}" in msg


def test_trimmed_mean_domain_checks_its_own_trim():
    cfg = TrimmedMean.Config(f=0)
    assert "trims f=0" in TrimmedMean.check_domain(cfg, 5, 1)


# -- properties --------------------------------------------------------------------------------------
finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def honest_and_byzantine(draw):
    """(vectors, f): n rows of dimension d, the last f of them arbitrary, with 2f < n."""
    n = draw(st.integers(3, 9))
    f = draw(st.integers(0, (n - 1) // 2))
    d = draw(st.integers(1, 4))
    honest = draw(st.lists(st.lists(finite, min_size=d, max_size=d), min_size=n - f, max_size=n - f))
    bad = draw(
        st.lists(
            st.lists(st.floats(-1e9, 1e9, allow_nan=False, width=32), min_size=d, max_size=d), min_size=f, max_size=f
        )
    )
    return torch.tensor(honest + bad, dtype=torch.float64), f


@settings(max_examples=60, deadline=None)
@given(data=honest_and_byzantine(), seed=st.integers(0, 2**16))
def test_permutation_invariance(data, seed):
    x, f = data
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    for name in ["median", "trimmed_mean", "centered_clip", "geometric_median"]:
        agg = AGGREGATORS.get(name)()
        torch.testing.assert_close(agg(x, W), agg(x[perm], W), rtol=1e-9, atol=1e-6, msg=name)
    # Krum's choice may differ between exactly tied rows, but its score multiset may not
    torch.testing.assert_close(krum_scores(x, f).sort().values, krum_scores(x[perm], f).sort().values)


@settings(max_examples=80, deadline=None)
@given(data=honest_and_byzantine())
def test_median_and_trimmed_mean_stay_in_the_honest_range(data):
    x, f = data
    honest = x[: x.shape[0] - f]
    lo, hi = honest.min(0).values, honest.max(0).values
    for agg in (Median(), TrimmedMean(TrimmedMean.Config(f=f))):
        out = agg(x, W)
        assert bool(((out >= lo - 1e-9) & (out <= hi + 1e-9)).all()), (agg, x, f, out)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(5, 10), d=st.integers(1, 6), seed=st.integers(0, 2**16), far=st.floats(10, 1e6))
def test_krum_picks_an_honest_row_when_honest_rows_are_clustered(n, d, seed, far):
    f = (n - 3) // 2
    gen = torch.Generator().manual_seed(seed)
    honest = torch.randn(n - f, d, generator=gen, dtype=torch.float64) * 0.1  # a tight cluster
    bad = far * (1 + torch.rand(f, d, generator=gen, dtype=torch.float64))
    x = torch.cat([honest, bad])[torch.randperm(n, generator=gen)]
    out = Krum(Krum.Config(f=f))(x, W)
    assert any(torch.equal(out, h) for h in honest)
    mk = MultiKrum(MultiKrum.Config(f=f))(x, W)
    assert float(mk.abs().max()) < 1.0  # the average of honest rows only


def test_scenario_validation_checks_the_aggregator_domain(tiny_scenario):
    """Only when the adversary attacks the DP sync: krum with n=3 cannot tolerate one faulty replica."""
    from sentinel.errors import ConfigError

    base = ("pipeline.replicas=3", "adversary.fraction=0.34")
    dp_attack = "adversary.attacks=[{name: ipm, role: dp_gradient}]"
    with pytest.raises(ConfigError, match=r"dp.aggregator.name: krum cannot tolerate"):
        tiny_scenario(*base, "dp.aggregator=krum", dp_attack)
    tiny_scenario(*base, "dp.aggregator=median", dp_attack)  # 2f < n holds
    tiny_scenario(*base, "dp.aggregator=krum", "adversary.attacks=[{name: scaling, role: activation}]")
