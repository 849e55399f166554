"""End to end: SENTINEL on small paper scenarios (closed loop, open loop, clean) with the default config."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel import scenario
from sentinel.runner import build_engine, malicious_workers
from sentinel.scoring.metrics import message_metrics, worker_metrics

PAPER = Path(__file__).resolve().parents[2] / "scenarios" / "paper"


def run(name: str, *overrides: str):
    sc = scenario.load(
        PAPER / f"{name}.yaml", ["detector.name=sentinel", "scoring.twins=[]", "training.steps=40", *overrides]
    )
    engine = build_engine(sc)
    engine.run()
    return engine, malicious_workers(engine)


@pytest.mark.slow
def test_gradient_sign_flip_attackers_are_banned_and_nobody_else():
    """The paper's zero-recall case: -g on the backward direction."""
    engine, malicious = run("scaling_gradient")
    w = worker_metrics(engine.log, malicious)
    assert sorted(w["banned"]) == sorted(malicious) and w["false_bans"] == 0


@pytest.mark.slow
def test_paper_distances_alone_miss_the_gradient_sign_flip():
    """Before/after: with only the paper's mean-pooled distances (no skewness), -g looks honest."""
    engine, malicious = run("scaling_gradient", "detector.distances=[l1,l2_normalized,sign_flip_ratio]")
    m = message_metrics(engine.log)
    assert m["recall"] is not None and m["recall"] < 0.2


@pytest.mark.slow
def test_clean_run_has_few_flags_and_no_bans():
    engine, _ = run("bias_activation", "adversary.attacks=[]")
    m = message_metrics(engine.log)
    assert m["fpr"] <= 0.02 and len(engine.log.bans) == 0


@pytest.mark.slow
def test_open_loop_records_but_never_acts():
    engine, malicious = run("constant_activation", "detector.mode=open_loop")
    v = engine.log.verdicts
    assert v["flagged"].sum() > 0 and len(engine.log.bans) == 0
    assert all(engine.workers.live)
