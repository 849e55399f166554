"""The attack scenario library: every file validates, says what it studies, and covers every attack."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel import scenario

ROOT = Path(__file__).resolve().parents[3] / "scenarios"
FILES = sorted((ROOT / "paper").glob("*.yaml")) + sorted((ROOT / "adaptive").glob("*.yaml"))
PAPER = ["constant", "random", "scaling", "random_sign", "bias", "delay", "invisible_noise"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_scenario_validates_and_says_what_it_studies(path):
    text = path.read_text()
    assert text.startswith("# ") and "Studies" in text.split("\nname:")[0], f"{path}: needs a top comment"
    sc = scenario.load(path)
    assert sc.adversary.attacks and sc.name


def test_paper_library_has_both_directions_of_every_paper_attack_and_the_mixed_setting():
    names = {p.stem for p in (ROOT / "paper").glob("*.yaml")}
    assert {f"{a}_{r}" for a in PAPER for r in ("activation", "gradient")} | {"mixed"} <= names
    mixed = scenario.load(ROOT / "paper" / "mixed.yaml")
    assert len({a.name for a in mixed.adversary.attacks}) >= 3 and len({a.role for a in mixed.adversary.attacks}) == 2


LIBRARY = [
    "alie",
    "ipm",
    "replay_other",
    "target_corruption",
    "fence_evasion",
    "slow_drift",
    "warmup_poisoning",
    "intermittent",
    "sparse",
    "same_direction",
    "undo_pair",
]


def test_every_literature_adaptive_and_collusion_attack_has_a_scenario():
    used = {a.name for p in FILES for a in scenario.load(p).adversary.attacks}
    assert set(PAPER + LIBRARY) <= used
