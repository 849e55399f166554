"""Each attack computes the formula its docstring states (direct calls, no engine)."""

from __future__ import annotations

import math

import pytest
import torch

from attacks.base import AttackContext
from sentinel.config import build
from sentinel.registry import ATTACKS
from sentinel.transport import Role


def make(name: str, **params):
    cls = ATTACKS.get(name)
    return cls(build(cls.Config, params))


def ctx(step=0, mb=0, worker="s1r0", role=Role.ACTIVATION, boundary=1, **kw) -> AttackContext:
    return AttackContext(step=step, mb_idx=mb, boundary=boundary, role=role, worker=worker, seed=7, **kw)


X = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(0)) * 2.0 + 0.5


def test_constant_scaling_bias():
    assert torch.equal(make("constant", value=3.0).apply(X, ctx()), torch.full_like(X, 3.0))
    assert torch.equal(make("scaling").apply(X, ctx()), -X)  # default alpha = -1, the paper's sign flip
    assert torch.equal(make("scaling", alpha=2.5).apply(X, ctx()), 2.5 * X)
    assert torch.equal(make("bias", b=0.25).apply(X, ctx()), X + 0.25)


def test_random_values_have_the_requested_moments_and_are_seeded():
    a = make("random", mu=1.0, sigma=3.0)
    y = a.apply(X, ctx())
    assert abs(float(y.mean()) - 1.0) < 0.3 and abs(float(y.std()) - 3.0) < 0.3
    assert torch.equal(y, a.apply(X, ctx()))
    assert not torch.equal(y, a.apply(X, ctx(mb=1)))


def test_random_sign_flips_about_p_of_coordinates_and_only_signs():
    y = make("random_sign", p=0.3).apply(X, ctx())
    assert torch.equal(y.abs(), X.abs())
    assert abs(float((y != X).float().mean()) - 0.3) < 0.05


def test_invisible_noise_keeps_statistics_and_loses_content():
    x = torch.randn(64, 32, 16, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.5, 3, 16) + 2.0
    y = make("invisible_noise", ratio=0.99).apply(x, ctx())
    dims = (0, 1)
    torch.testing.assert_close(y.mean(dims), x.mean(dims), atol=0.1, rtol=0.05)
    torch.testing.assert_close(y.std(dims), x.std(dims), atol=0.1, rtol=0.05)
    xc, yc = (x - x.mean(dims)).flatten(), (y - y.mean(dims)).flatten()
    corr = float((xc @ yc) / (xc.norm() * yc.norm()))
    assert corr == pytest.approx(math.sqrt(0.01), abs=0.03)  # content correlation sqrt(1 - r)


def test_delay_replays_the_own_message_from_d_steps_earlier_same_slot():
    a = make("delay", d=2)
    sent = {}
    for step in range(5):
        for mb in (0, 1):
            c, x = ctx(step=step, mb=mb), torch.full((2, 3), float(10 * step + mb))
            if a.wants(c):
                sent[(step, mb)] = a.apply(x, c)
            else:
                assert step < 2
            a.observe(x, c)
    assert set(sent) == {(s, m) for s in (2, 3, 4) for m in (0, 1)}
    for (step, mb), y in sent.items():
        assert torch.equal(y, torch.full((2, 3), float(10 * (step - 2) + mb)))
    assert all(len(buf) <= 3 for buf in a._buf.values())  # bounded: d + 1 per slot


def test_delay_uses_the_latest_message_at_least_d_old_when_routing_skipped_a_step():
    a = make("delay", d=2)
    for step in (0, 1, 4):
        a.observe(torch.full((2,), float(step)), ctx(step=step))
    assert torch.equal(a.apply(torch.zeros(2), ctx(step=5)), torch.full((2,), 1.0))


def test_replay_other_sends_the_previous_honest_message():
    a = make("replay_other")
    c0, c1 = ctx(mb=0), ctx(mb=1)
    assert not a.wants(c0)
    a.observe(torch.ones(3), c0)
    assert torch.equal(a.apply(torch.zeros(3), c1), torch.ones(3))


def test_alie_is_mean_plus_z_std_of_own_history():
    a = make("alie", z=2.0, window=3)
    hist = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 2.0]), torch.tensor([5.0, 8.0]), torch.tensor([7.0, 2.0])]
    for i, h in enumerate(hist):
        a.observe(h, ctx(step=i))
    window = torch.stack(hist[-3:])
    expect = window.mean(0) + 2.0 * window.std(0, unbiased=False)
    torch.testing.assert_close(a.apply(torch.zeros(2), ctx(step=4)), expect)


def test_ipm_is_minus_eps_times_running_mean():
    a = make("ipm", eps=0.5, window=2)
    for i, h in enumerate([torch.tensor([100.0]), torch.tensor([2.0]), torch.tensor([4.0])]):
        a.observe(h, ctx(step=i))
    torch.testing.assert_close(a.apply(torch.zeros(1), ctx(step=3)), torch.tensor([-1.5]))


def test_streams_are_per_worker_boundary_and_role():
    a = make("ipm")
    a.observe(torch.ones(2), ctx(worker="s1r0"))
    assert not a.wants(ctx(worker="s1r1"))
    assert not a.wants(ctx(role=Role.GRADIENT))
    assert a.wants(ctx(worker="s1r0", step=3))


def test_target_corruption_shift_and_random():
    t = torch.randint(0, 32, (4, 16), generator=torch.Generator().manual_seed(0))
    shifted = make("target_corruption").corrupt(t, ctx(), vocab=32)
    assert torch.equal(shifted, (t + 1) % 32)
    half = make("target_corruption", mode="random", fraction=0.5).corrupt(t, ctx(), vocab=32)
    assert 0.3 < float((half != t).float().mean()) < 0.6 and int(half.max()) < 32
    assert torch.equal(make("target_corruption", fraction=0.0).corrupt(t, ctx(), vocab=32), t)
