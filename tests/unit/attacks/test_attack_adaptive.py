"""Adaptive attacks: fence evasion against a read-only detector view, drift, poisoning, gating."""

from __future__ import annotations

import pytest
import torch

from attacks.base import AttackContext
from attacks.detector_view import DetectorView, ReferenceView, under_fence
from sentinel.config import build
from sentinel.registry import ATTACKS
from sentinel.transport import Role


def make(name: str, **params):
    cls = ATTACKS.get(name)
    return cls(build(cls.Config, params))


def ctx(step=0, mb=0, worker="s1r0", since=None, **kw) -> AttackContext:
    return AttackContext(
        step=step,
        mb_idx=mb,
        boundary=1,
        role=Role.ACTIVATION,
        worker=worker,
        seed=11,
        since=step if since is None else since,
        **kw,
    )


def honest(i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, 16, generator=g) * 0.3 + torch.linspace(-1, 1, 16)


class CountingView(ReferenceView):
    """A ReferenceView that records that the attack only reads thresholds and scores."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls = {"scores": 0, "thresholds": 0}

    def scores(self, boundary, role, payload, sender=None):
        self.calls["scores"] += 1
        return super().scores(boundary, role, payload, sender)

    def thresholds(self, boundary, role):
        self.calls["thresholds"] += 1
        return super().thresholds(boundary, role)


@pytest.fixture
def view():
    v = CountingView({"l2": 0.2, "sign": 0.3})
    for i in range(20):
        v.update(1, Role.ACTIVATION, honest(i))
    return v


def test_reference_view_satisfies_the_protocol_and_is_pure(view):
    assert isinstance(view, DetectorView)
    before = view._base[(1, int(Role.ACTIVATION))].clone()
    view.scores(1, Role.ACTIVATION, honest(99) * 5)
    assert torch.equal(view._base[(1, int(Role.ACTIVATION))], before)


@pytest.mark.parametrize("direction", ["negate", "random"])
def test_fence_evasion_finds_the_largest_perturbation_under_the_fence(view, direction):
    a = make("fence_evasion", direction=direction, margin=0.95, iters=20)
    a.attach_view(view)
    x, c = honest(50), ctx()
    y = a.apply(x, c)
    thr = view.thresholds(1, Role.ACTIVATION)
    assert under_fence(view.scores(1, Role.ACTIVATION, y), thr, 0.95)  # undetected by construction
    strength = float((y - x).norm() / x.norm())
    assert 0.05 < strength < 2.0
    d = a._dirs(x, c)
    bigger = x + (strength + 0.01) * d
    assert not under_fence(view.scores(1, Role.ACTIVATION, bigger), thr, 0.95)  # and maximal
    assert view.calls["scores"] > 0


def test_fence_evasion_without_a_view_falls_back_to_a_bounded_perturbation():
    x = honest(1)
    y = make("fence_evasion", fallback_strength=0.1).apply(x, ctx())
    assert float((y - x).norm() / x.norm()) == pytest.approx(0.1, rel=1e-5)


def test_fence_evasion_before_the_detector_has_a_fence_uses_the_fallback():
    a = make("fence_evasion", fallback_strength=0.2)
    a.attach_view(ReferenceView({"l2": 0.1}))  # no baseline yet: empty thresholds
    x = honest(2)
    assert float((a.apply(x, ctx()) - x).norm() / x.norm()) == pytest.approx(0.2, rel=1e-5)


def test_fence_evasion_declines_when_even_a_tiny_step_is_flagged(view):
    a = make("fence_evasion")
    a.attach_view(view)
    far = honest(3) * -4.0  # already far outside the fence
    assert a.apply(far, ctx()) is far


def test_slow_drift_grows_linearly_then_saturates():
    a = make("slow_drift", rate=0.05, max_strength=0.3)
    x = honest(4)
    ratios = [float((a.apply(x, ctx(since=t)) - x).norm() / x.norm()) for t in range(10)]
    assert ratios[:5] == pytest.approx([0.05, 0.10, 0.15, 0.20, 0.25], rel=1e-4)
    assert ratios[6:] == pytest.approx([0.3] * 4, rel=1e-4)
    d0, d1 = a.apply(x, ctx(since=0)) - x, a.apply(x, ctx(since=1)) - x
    assert torch.allclose(d1, 2 * d0, rtol=1e-4, atol=1e-6)  # one fixed direction


def test_warmup_poisoning_random_strength_then_full():
    a = make("warmup_poisoning", strength=0.5, switch=10)
    x = honest(5)
    early = [float((a.apply(x, ctx(step=t)) - x).norm() / x.norm()) for t in range(10)]
    late = [float((a.apply(x, ctx(step=t)) - x).norm() / x.norm()) for t in range(10, 15)]
    assert all(0 <= r <= 0.5 + 1e-6 for r in early) and len(set(round(r, 6) for r in early)) > 5
    assert late == pytest.approx([0.5] * 5, rel=1e-4)


def test_intermittent_duty_cycle_with_per_worker_phase():
    a = make("intermittent", on_steps=2, off_steps=3, random_phase=False)
    assert [a.wants(ctx(since=t)) for t in range(10)] == [True, True, False, False, False] * 2
    b = make("intermittent", on_steps=2, off_steps=3)
    patterns = {w: tuple(b.wants(ctx(since=t, worker=w)) for t in range(5)) for w in ("s1r0", "s1r1", "s2r0", "s2r2")}
    assert all(sum(p) == 2 for p in patterns.values()) and len(set(patterns.values())) > 1


def test_sparse_acts_on_about_p_of_messages():
    a = make("sparse", p=0.2)
    hits = sum(a.wants(ctx(step=s, mb=m)) for s in range(100) for m in range(10))
    assert 150 < hits < 250
    y = a.apply(honest(6), ctx())
    assert torch.equal(y, -honest(6))  # inner attack: scaling alpha = -1 by default
