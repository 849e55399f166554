"""Conformance over every registered proof: its files, its Result, its determinism, and the CLI."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import proofs
from proofs import CHECKS, Result
from proofs.__main__ import main

PROOFS_DIR = Path(proofs.__file__).parent
SECTIONS = ("## Statement", "## Assumptions", "## Proof", "## Where the testbed departs", "## References")


@pytest.fixture(scope="module")
def results() -> dict[str, Result]:
    """Each check run once with seed 0 (shared by the tests below)."""
    return {name: check(0) for name, check in CHECKS.items()}


@pytest.mark.parametrize("name", list(CHECKS))
def test_check_passes_with_fixed_seed(results: dict[str, Result], name: str) -> None:
    result = results[name]
    assert result.name == name
    assert result.ok, result.line()
    assert all(math.isfinite(v) for v in (result.bound, result.measured, result.margin))
    assert result.margin >= 0, result.line()


@pytest.mark.parametrize("name", list(CHECKS))
def test_markdown_has_every_section(name: str) -> None:
    text = (PROOFS_DIR / f"{name}.md").read_text()
    missing = [s for s in SECTIONS if s not in text]
    assert not missing, f"{name}.md lacks {missing}"


@pytest.mark.parametrize("name", ["honest_majority", "ema_drift"])  # the cheap ones, run twice
def test_check_is_deterministic(results: dict[str, Result], name: str) -> None:
    assert CHECKS[name](0) == results[name]


def test_main_prints_one_line_per_check_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--only", "ema_drift", "--seed", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("[PASS] ema_drift")
    assert lines[1] == "all checks passed (seed 3)"


def test_main_exits_nonzero_when_a_check_fails(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    failing = Result(name="ema_drift", statement="s", bound=1.0, measured=2.0, margin=-1.0, ok=False)
    monkeypatch.setitem(CHECKS, "ema_drift", lambda seed: failing)
    assert main(["--only", "ema_drift"]) == 1
    assert "[FAIL] ema_drift" in capsys.readouterr().out


def test_run_all_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="Unknown check"):
        proofs.run_all(only=["honest_majorty"])
