"""End to end: the token-level attack class is caught and banned fast, the honest cost stays low on text, and
the baselines (TOPLOC-style commitments, river drift detectors) run in a scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel import scenario
from sentinel.detectors.stagewise import STATISTICS
from sentinel.runner import build_engine, malicious_workers
from sentinel.scoring.metrics import message_metrics, worker_metrics

TABLE1 = Path(__file__).resolve().parents[2] / "scenarios" / "paper" / "table1.yaml"


def run(*overrides: str):
    sc = scenario.load(TABLE1, ["scoring.twins=[]", "training.steps=24", *overrides])
    engine = build_engine(sc)
    engine.run()
    return engine, malicious_workers(engine)


@pytest.mark.slow
@pytest.mark.parametrize("role", ["activation", "gradient"])
def test_token_permutations_are_banned_within_five_steps(role):
    engine, malicious = run(f"adversary.attacks=[{{name: token_permute, role: {role}, start: 10}}]")
    w = worker_metrics(engine.log, malicious)
    assert sorted(w["banned"]) == sorted(malicious) and w["false_bans"] == 0
    assert w["max_steps_to_ban"] <= 5


@pytest.mark.slow
@pytest.mark.parametrize("factor", [0.0, 0.05, 10.0])
def test_a_few_gradient_tokens_zeroed_shrunk_or_scaled_up_are_banned_within_five_steps(factor):
    """Tokens rescaled keep their direction (align_tail does not see them) but not their gain over the gradient the
    sender received: shrunk or zeroed ones lose it (gain_low), scaled-up ones gain it (gain_high, over the tokens that
    received a typical magnitude; on request). Without gain_low, x 0.05 was not banned in these 24 steps (zeroed: 3
    steps, where the centred direction of a zero token still moves align_tail); without gain_high, x10 was not."""
    attack = f"{{name: few_tokens, role: gradient, start: 10, attack: scaling, params: {{alpha: {factor}}}, tokens: 3}}"
    extra = [f"detector.distances=[{','.join((*STATISTICS, 'gain_high'))}]"] if factor > 1 else []  # on request
    engine, malicious = run(f"adversary.attacks=[{attack}]", *extra)
    w = worker_metrics(engine.log, malicious)
    assert sorted(w["banned"]) == sorted(malicious) and w["false_bans"] == 0
    assert w["max_steps_to_ban"] <= 5


@pytest.mark.slow
@pytest.mark.parametrize("role", ["activation", "gradient"])
def test_a_token_copied_from_its_neighbour_is_banned_within_five_steps(role):
    """One token per message overwritten by its left neighbour's (`token_copy`), on text, where neighbouring tokens
    are alike: the copy still points roughly where its own input does (align_tail barely moves), but the neighbour's
    input explains it far better (`match`). Without match neither role's attackers were banned in these 24 steps.
    The bar is the issue's, a median of five steps: since each sender is judged against its peers' windows, the slower
    activation attacker of this seed took 6 steps instead of 5 (over seeds 0-5 of this run, the 12 attackers' steps
    to ban moved by +0.08 on average, from -2 to +1: no measurable difference), and since every ban waits a step for
    its stage's consensus (stop 57) 8: its own wait, and its upstream attacker's, whose tampered inputs taint its
    messages (only their relation evidence counts) a step longer."""
    engine, malicious = run("data.source=text", f"adversary.attacks=[{{name: token_copy, role: {role}, start: 10}}]")
    w = worker_metrics(engine.log, malicious)
    assert sorted(w["banned"]) == sorted(malicious) and w["false_bans"] == 0
    assert w["median_steps_to_ban"] <= 5 and w["max_steps_to_ban"] <= 8


@pytest.mark.slow
def test_a_token_faded_to_the_mean_token_is_banned_within_five_steps():
    """One activation token per message replaced by the message's mean token, the pooled mean kept (`token_fade`), on
    text: after centring it is its old self scaled by 1 / (B T), so every cosine and, where tokens share a large mean,
    its gain as sent stay put; its centred gain falls by log(B T) (`gain_centred`). Without gain_centred neither
    attacker of this run was banned in its 24 steps (3 steps with it; on the synthetic source the gain as sent sees it
    too, both banned in 1)."""
    engine, malicious = run("data.source=text", "adversary.attacks=[{name: token_fade, role: activation, start: 10}]")
    w = worker_metrics(engine.log, malicious)
    assert sorted(w["banned"]) == sorted(malicious) and w["false_bans"] == 0
    assert w["median_steps_to_ban"] <= 5


@pytest.mark.slow
def test_a_gradient_token_turned_away_from_what_it_received_is_banned_within_five_steps():
    """One gradient token per message turned by 90 degrees, its norm kept (`token_turn`), on text. A backward pass mixes
    tokens, so once the model trains honest gradient tokens turn away from what they received, and `align_tail`'s honest
    tail reaches the turned token's. An honest token still carries its own received gradient on (the update a stage
    adds is roughly orthogonal to it); the turned one carries none (`retain`). Without retain this run's attackers
    took 3 and 14 steps."""
    engine, malicious = run("data.source=text", "adversary.attacks=[{name: token_turn, role: gradient, start: 10}]")
    w = worker_metrics(engine.log, malicious)
    assert sorted(w["banned"]) == sorted(malicious) and w["false_bans"] == 0
    assert w["median_steps_to_ban"] <= 5


@pytest.mark.slow
def test_honest_text_traffic_keeps_the_false_alarm_rate_low():
    engine, _ = run("data.source=text", "adversary.attacks=[]", "training.steps=40")
    assert message_metrics(engine.log)["fpr"] <= 0.01 and len(engine.log.bans) == 0


@pytest.mark.slow
def test_toploc_audits_catch_a_sign_flip_as_certain_evidence():
    engine, malicious = run(
        "detector.name=toploc", "detector.p=1.0", "adversary.attacks=[{name: scaling, role: activation, start: 10}]"
    )
    w = worker_metrics(engine.log, malicious)
    assert sorted(w["banned"]) == sorted(malicious) and w["false_bans"] == 0
    assert sum(v.detector.commitment_bytes for v in engine.verifiers.values()) > 0


@pytest.mark.slow
def test_river_drift_detectors_run_on_sentinels_statistics():
    """ADWIN flags each attacker once its own sequence of statistics changes. river's ADWIN needs a long history
    before it can cut its window (a jump from 0 to 1 after 12 values was never signalled; after 50, 21 values later),
    so the attack starts after 40 steps (~50 messages a sender). It used to start at step 10 of 24: the one flag the
    test saw came from an honest replica at step 23, and a change to the consensus took even that away (stop 48)."""
    pytest.importorskip("river")
    engine, malicious = run(
        "training.steps=70",
        "detector.name=river_adwin",
        "adversary.attacks=[{name: random, role: activation, start: 40}]",
    )
    v, m = engine.log.verdicts.as_arrays(), engine.log.messages.as_arrays()
    row = {int(i): j for j, i in enumerate(m["id"])}
    flagged = {
        (engine.log.workers[m["sender"][row[int(i)]]], int(m["step"][row[int(i)]])) for i in v["msg"][v["flagged"]]
    }
    assert "score_drifts" in v
    assert all(any(w == bad and step >= 40 for w, step in flagged) for bad in malicious)


def test_a_missing_river_is_a_located_error_with_the_install_command(monkeypatch):
    import sentinel.detectors.drift as drift
    from sentinel.errors import ConfigError

    monkeypatch.setattr(drift, "river_missing", lambda: f"needs the optional dependency river: {drift.INSTALL}")
    with pytest.raises(ConfigError, match=r"detector\.name: .*pip install -e \"\.\[river\]\""):
        scenario.load(TABLE1, ["detector.name=river_kswin"])
