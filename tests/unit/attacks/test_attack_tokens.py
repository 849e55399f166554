"""The token-level attack class: each keeps what it claims to keep, and changes what it claims to change."""

from __future__ import annotations

import math

import pytest
import torch

from attacks.base import AttackContext
from sentinel.config import build
from sentinel.registry import ATTACKS
from sentinel.transport.message import Role


def make(name, **params):
    cls = ATTACKS.get(name)
    return cls(build(cls.Config, params))


def ctx(step=3, mb=1):
    return AttackContext(step=step, mb_idx=mb, boundary=1, role=Role.ACTIVATION, worker="s1r0", seed=5)


X = torch.randn(4, 16, 8, generator=torch.Generator().manual_seed(0))


def multiset(x):
    rows = x.reshape(-1, x.shape[-1])
    return sorted(map(tuple, rows.tolist()))


@pytest.mark.parametrize("name", ["token_permute", "batch_permute", "sequence_swap"])
def test_permutations_keep_the_multiset_of_token_vectors(name):
    y = make(name).apply(X, ctx())
    assert y.shape == X.shape and not torch.equal(y, X)
    assert multiset(y) == multiset(X)
    torch.testing.assert_close(y.mean((0, 1)), X.mean((0, 1)))


def test_token_permute_moves_each_sequence_within_itself_and_share_limits_it():
    y = make("token_permute").apply(X, ctx())
    for b in range(4):
        assert multiset(y[b : b + 1]) == multiset(X[b : b + 1])
    part = make("token_permute", share=0.25).apply(X, ctx())
    moved = (part != X).any(-1).sum(-1)  # per sequence
    assert (moved == 4).all()  # round(0.25 * 16) positions, all moved (a cyclic shift among them)


def test_batch_and_sequence_swaps_keep_every_token_at_its_position():
    for name in ("batch_permute", "sequence_swap"):
        y = make(name).apply(X, ctx())
        for t in range(16):
            assert multiset(y[:, t : t + 1]) == multiset(X[:, t : t + 1])


def test_microbatch_exchange_sends_the_previous_messages_sequences():
    a = make("microbatch_exchange", share=0.5)
    prev = X + 100
    c = ctx()
    assert not a.wants(c)
    a.observe(prev, c)
    y = a.apply(X, c)
    from_prev = [b for b in range(4) if torch.equal(y[b], prev[b])]
    assert len(from_prev) == 2 and all(torch.equal(y[b], X[b]) for b in range(4) if b not in from_prev)


def test_few_tokens_changes_exactly_k_tokens_with_the_inner_attack():
    y = make("few_tokens", attack="scaling", params={"alpha": -1.0}, tokens=3).apply(X, ctx())
    changed = (y != X).any(-1).reshape(-1)
    assert int(changed.sum()) == 3
    torch.testing.assert_close(y.reshape(-1, 8)[changed], -X.reshape(-1, 8)[changed])


def test_rank_two_tensors_are_declined():
    v = torch.randn(16)
    for name in ("token_permute", "batch_permute", "sequence_swap"):
        assert make(name).apply(v, ctx()) is v


def test_token_copy_overwrites_a_few_tokens_with_earlier_ones_of_their_sequence():
    y = make("token_copy", tokens=3, reach=4).apply(X, ctx())
    changed = (y != X).any(-1).nonzero().tolist()
    assert 1 <= len(changed) <= 3
    for b, t in changed:
        assert t >= 1 and any(torch.equal(y[b, t], X[b, s]) for s in range(max(0, t - 4), t))
    assert torch.equal(make("token_copy").apply(X, ctx()), make("token_copy").apply(X, ctx()))  # seeded
    assert make("token_copy", tokens=0).apply(X, ctx()) is X
    one = X[:, :1].clone()
    assert make("token_copy").apply(one, ctx()) is one  # one token per sequence: nothing earlier to copy


@pytest.mark.parametrize("tokens, fade", [(1, 1.0), (2, 1.0), (2, 0.9)])
def test_token_fade_keeps_the_pooled_mean_and_shrinks_a_few_tokens_toward_it(tokens, fade):
    """The pooled mean is kept exactly; after centring, a faded token is (1 - fade) x its old centred self plus the
    shift that keeps the mean (fade / (B T) x the sum of the faded tokens'): one token at fade 1 keeps its direction."""
    y = make("token_fade", tokens=tokens, fade=fade).apply(X, ctx())
    flat, new = X.reshape(-1, 8).double(), y.reshape(-1, 8).double()
    torch.testing.assert_close(new.mean(0), flat.mean(0))
    cx, cy = flat - flat.mean(0), new - new.mean(0)
    faded = ((cy - cx).norm(dim=1) > 0.5 * cx.norm(dim=1)).nonzero().flatten()
    assert len(faded) == tokens
    shift = fade / len(flat) * cx[faded].sum(0)
    torch.testing.assert_close(cy[faded], (1 - fade) * cx[faded] + shift)
    if tokens == 1 and fade == 1.0:
        cos = torch.nn.functional.cosine_similarity(cx[faded], cy[faded], dim=1)
        assert float(cos) > 0.999 and float(cy[faded].norm() / cx[faded].norm()) == pytest.approx(1 / len(flat))
    assert torch.equal(make("token_fade").apply(X, ctx()), make("token_fade").apply(X, ctx()))  # seeded
    assert make("token_fade", tokens=0).apply(X, ctx()) is X and make("token_fade", fade=0.0).apply(X, ctx()) is X
    v = torch.randn(5)
    assert make("token_fade").apply(v, ctx()) is v  # no token axes


@pytest.mark.parametrize(("tokens", "angle"), [(1, 90.0), (3, 45.0), (2, 180.0)])
def test_token_turn_keeps_each_norm_and_turns_a_few_tokens_by_the_angle(tokens, angle):
    """Only `tokens` rows change; each keeps its norm, and its cosine with what was computed is cos(angle)."""
    y = make("token_turn", tokens=tokens, angle=angle).apply(X, ctx())
    flat, new = X.reshape(-1, 8).double(), y.reshape(-1, 8).double()
    turned = (new - flat).norm(dim=1) > 1e-6
    assert int(turned.sum()) == tokens
    torch.testing.assert_close(new.norm(dim=1), flat.norm(dim=1))
    cos = torch.nn.functional.cosine_similarity(new[turned], flat[turned], dim=1)
    torch.testing.assert_close(cos, torch.full_like(cos, math.cos(math.radians(angle))), atol=1e-5, rtol=0)
    assert torch.equal(make("token_turn").apply(X, ctx()), make("token_turn").apply(X, ctx()))  # seeded
    assert not torch.equal(make("token_turn").apply(X, ctx()), make("token_turn").apply(X, ctx(step=4)))
    assert make("token_turn", tokens=0).apply(X, ctx()) is X and make("token_turn", angle=0.0).apply(X, ctx()) is X
    v = torch.randn(5)
    assert make("token_turn").apply(v, ctx()) is v  # no token axes
