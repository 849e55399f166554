"""Fuzz test: hypothesis draws mutations of the scenario library and CLI flags (tests/hardening/fuzzing.py);
every command exits 0 or 2, prints no traceback, does not hang, stays under the memory cap, refuses in
`run` / `sweep` what `validate` refused (writing nothing), and never accepts a case that is bad by
construction. Bounded to about a minute; `python -m tests.fuzz --cases 1500` runs the long version."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hardening.fuzzing import judge, make_case
from tests.hardening.harness import Harness

HARNESS: Harness | None = None


@pytest.fixture(scope="module", autouse=True)
def harness():
    global HARNESS
    HARNESS = Harness()
    yield HARNESS
    HARNESS = None


@settings(
    max_examples=120, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(rng=st.randoms(use_true_random=False))
def test_fuzz_scenarios_and_flags(rng: random.Random):
    with tempfile.TemporaryDirectory(prefix="sentinel-fuzz-") as tmp:
        case = make_case(rng, Path(tmp))
        verdict = judge(case, Path(tmp), HARNESS, timeout=120)
    assert verdict.ok, f"{case.source} {case.mutations} flags={case.flags}\n{verdict.commands}\n{verdict.detail}"
