"""End to end: an open-loop run yields ROC curves, AUROC in summary.json, a recommended threshold, and its
closed-loop confirmation; the clean twin reports the FPR, false bans and ARL0 of the same defence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sentinel import runner
from sentinel.eventlog import EventLog
from sentinel.scoring.metrics import checked_messages
from sentinel.scoring.report import rebuild
from sentinel.scoring.roc import rule_scores
from sentinel.scoring.summary import threshold_rule

ATTACKED = (
    "pipeline.replicas=3",
    "training.steps=24",
    "detector.name=sentinel",
    "detector.warmup_steps=4",
    "detector.min_history=8",
    "adversary.placement=explicit",
    "adversary.workers=[s1r0]",
    "adversary.attacks=[{name: bias, role: activation, start: 8, b: 2.0}]",
)  # one attacker: with two on a route, the downstream one's messages are paused after the first flag


def test_open_loop_run_reports_auroc_a_recommended_k_and_its_confirmation(tmp_path, tiny_scenario):
    sc = tiny_scenario(*ATTACKED, "detector.mode=open_loop", "scoring.twins=[clean]")
    summary = runner.run(sc, tmp_path, progress=False)
    roc = summary["detection"]["roc"]
    assert roc["mode"] == "open_loop"
    for name in ("l1", "sliced_wasserstein", "align", "evidence"):
        assert 0.0 <= roc["statistics"][name]["auroc"] <= 1.0
    rule = roc["rule"]
    assert rule["auroc"] > 0.9  # a bias of 2 (activations are RMS-normalised to ~1) stands out
    rec = rule["recommended"]
    assert rec["threshold"] >= rule["exact_from"] and rec["fpr"] <= sc.scoring.target_fpr
    conf = roc["confirmation"]
    assert conf["threshold"] == rec["threshold"] and conf["fpr"] is not None
    confirm = EventLog.load(tmp_path / "confirm")
    assert confirm.meta["malicious"] == summary["workers"]["malicious"]
    clean = summary["detection"]["clean_twin"]
    assert clean["checked"] > 0 and clean["steps"] == 24 and "arl0" in clean
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert "curves" not in on_disk["detection"]["roc"]  # curves live in roc_curves.json, plotted in roc.png
    assert (tmp_path / "roc.png").is_file() and "rule" in json.loads((tmp_path / "roc_curves.json").read_text())
    assert "Closed-loop confirmation" in (tmp_path / "report.md").read_text()
    # `sentinel report` recomputes the same numbers from the saved logs, no retraining
    again = rebuild(tmp_path)["detection"]["roc"]
    assert again["rule"]["auroc"] == rule["auroc"] and again["confirmation"]["fpr"] == conf["fpr"]


def test_the_rule_reproduces_the_closed_loop_runs_own_flags(tiny_scenario):
    """At the configured k the decision score flags exactly the messages the detector flagged."""
    sc = tiny_scenario(*ATTACKED)
    engine = runner.build_engine(sc)
    engine.run()
    log = engine.log
    rule = threshold_rule(sc)
    s = rule_scores(checked_messages(log), log.verdicts.as_arrays(), rule)
    flagged = log.verdicts["flagged"].astype(bool)
    assert flagged.any() and np.array_equal(s > rule["value"], flagged)


def test_thresholds_command_combines_attacks_and_seeds_of_an_open_loop_sweep(tmp_path, capsys):
    """One call answers "which k keeps the clean FPR <= target with recall >= R on every attack"."""
    import csv

    import yaml

    from sentinel.cli import main
    from sentinel.sweep import run_sweep
    from tests.conftest import TINY

    bias = [{"name": "bias", "role": "activation", "start": 6, "b": 2.0}]
    data = dict(TINY, training=dict(TINY["training"], steps=14, eval_every=7))
    data["pipeline"] = dict(TINY["pipeline"], replicas=3)
    data["detector"] = {"name": "sentinel", "warmup_steps": 3, "min_history": 6, "mode": "open_loop"}
    data["scoring"] = {"twins": ["clean"], "confirm": False}
    data["adversary"] = {"fraction": 0.34, "protect": ["first", "last"], "attacks": bias}
    data["sweep"] = {
        "grid": {"adversary.attacks": [bias, [{"name": "constant", "role": "gradient", "start": 6}]]},
        "seeds": 2,
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    run_sweep(tmp_path / "s.yaml", tmp_path / "sweep", jobs=2, progress=False)
    closed = tmp_path / "closed"
    assert (
        main(
            [
                "run",
                str(tmp_path / "s.yaml"),
                "--out",
                str(closed),
                "--quiet",
                "--set",
                "detector.mode=closed_loop",
                "--set",
                "training.steps=8",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(
            [
                "thresholds",
                str(tmp_path / "sweep"),
                str(closed),
                "--target-fpr",
                "0.05",
                "--min-recall",
                "0.5",
                "--out",
                str(tmp_path / "th"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "4 open-loop runs, seeds 0, 1, 2 attacks. Clean FPR on the clean twin" in out
    assert "closed loop: its verdicts are exact only at the threshold it ran" in out
    rows = list(csv.DictReader(open(tmp_path / "th" / "thresholds.csv")))
    decision = json.loads((tmp_path / "th" / "thresholds.json").read_text())
    chosen = [i for i, r in enumerate(rows) if float(r["k"]) == decision["chosen_k"]][0]
    assert float(rows[chosen]["fpr_mean"]) <= 0.05 and all(float(r["fpr_mean"]) > 0.05 for r in rows[:chosen])
    assert decision["chosen_k"] >= decision["k_min"] and set(decision["attacks"]) == {
        "bias/activation",
        "constant/gradient",
    }
    assert min(decision["recall"].values()) == pytest.approx(decision["worst_recall"])
    assert (tmp_path / "th" / "thresholds.png").is_file() and (tmp_path / "th" / "thresholds.md").is_file()
    assert main(["thresholds", str(tmp_path / "nothing")]) == 2
