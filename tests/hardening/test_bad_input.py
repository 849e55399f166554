"""Every bad input in the catalogue: the right exit code, a located message, no traceback, no hang,
bounded memory, and nothing written by a refused command (tests/hardening/catalogue.py)."""

from __future__ import annotations

import pytest

from tests.hardening.catalogue import CASES, Workspace, check_outcome, make_report_base
from tests.hardening.harness import Harness


@pytest.fixture(scope="module")
def harness():
    return Harness()


@pytest.fixture(scope="module")
def report_base(tmp_path_factory):
    return make_report_base(tmp_path_factory.mktemp("report"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, harness, report_base, tmp_path):
    ws = Workspace(tmp_path, report_base)
    argv = case.argv(ws)
    outcome = harness.run(argv, cwd=tmp_path, timeout=120)
    broken = check_outcome(case, ws, outcome)
    assert not broken, f"{case.id}: {'; '.join(broken)}\n{outcome.describe()}"
