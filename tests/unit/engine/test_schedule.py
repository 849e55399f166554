"""Schedules are data: their invariants hold for every (S, M) without running any model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.engine.schedule import Action, execute, gpipe, make_schedule, one_f_one_b
from sentinel.errors import ConfigError

SIZES = st.tuples(st.integers(1, 12), st.integers(1, 16))


def _simulate(per_stage):
    """Run with the real dependency rules of the engine; returns the global order."""
    done = set()

    def ready(a: Action) -> bool:
        if a.kind == "F":
            return a.stage == 0 or (a.stage - 1, "F", a.mb) in done
        last = a.stage == len(per_stage) - 1
        return (a.stage, "F", a.mb) in done and (last or (a.stage + 1, "B", a.mb) in done)

    return execute(per_stage, ready, lambda a: done.add(tuple(a)))


@pytest.mark.parametrize("make", [gpipe, one_f_one_b])
@given(sizes=SIZES)
def test_every_microbatch_once_forward_before_backward(make, sizes):
    S, M = sizes
    sched = make(S, M)
    assert len(sched) == S
    for s, acts in enumerate(sched):
        assert all(a.stage == s for a in acts)
        assert sorted(a.mb for a in acts if a.kind == "F") == list(range(M))
        assert [a.mb for a in acts if a.kind == "B"] == list(range(M))  # backwards in mb order
        pos = {(a.kind, a.mb): i for i, a in enumerate(acts)}
        assert all(pos[("F", m)] < pos[("B", m)] for m in range(M))


@pytest.mark.parametrize("make", [gpipe, one_f_one_b])
@given(sizes=SIZES)
def test_schedule_runs_without_deadlock_and_respects_dependencies(make, sizes):
    S, M = sizes
    order = _simulate(make(S, M))
    assert len(order) == 2 * S * M
    seen = set()
    for a in order:
        if a.kind == "F" and a.stage > 0:
            assert (a.stage - 1, "F", a.mb) in seen
        if a.kind == "B" and a.stage < S - 1:
            assert (a.stage + 1, "B", a.mb) in seen
        seen.add(tuple(a))


@given(sizes=SIZES)
def test_1f1b_bounds_in_flight_microbatches(sizes):
    S, M = sizes
    for s, acts in enumerate(one_f_one_b(S, M)):
        in_flight = peak = 0
        for a in acts:
            in_flight += 1 if a.kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak <= min(S - s, M)


def test_actions_print_like_torch_pipelining():
    assert str(Action(2, "F", 0)) == "2F0"
    assert [str(a) for a in one_f_one_b(2, 2)[0]] == ["0F0", "0F1", "0B0", "0B1"]
    assert [str(a) for a in one_f_one_b(2, 2)[1]] == ["1F0", "1B0", "1F1", "1B1"]


def test_deadlock_is_reported():
    with pytest.raises(RuntimeError, match="deadlock"):
        execute([[Action(0, "B", 0)]], lambda a: False, lambda a: None)


def test_unknown_schedule():
    with pytest.raises(ConfigError, match="valid: gpipe, 1f1b"):
        make_schedule("zigzag", 2, 2)
