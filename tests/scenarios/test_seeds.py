"""Seeds as an axis: per-seed rows, 95% intervals, paired deltas to the reference point, `run --seeds`,
parallel twins equal sequential ones, and bad seeds / references rejected before anything runs."""

from __future__ import annotations

import csv
import json

import pytest
import yaml
from scipy import stats as sps

from sentinel.cli import main
from tests.conftest import TINY

SHORT = dict(TINY, training=dict(TINY["training"], steps=6, eval_every=3))


def _write(tmp_path, data, name="s.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_seeds_give_per_seed_rows_t_intervals_and_paired_deltas_to_the_reference(tmp_path):
    from sentinel.sweep import run_sweep

    data = dict(
        SHORT, sweep={"grid": {"training.lr": [0.001, 0.004]}, "seeds": [3, 5], "reference": {"training.lr": 0.001}}
    )
    run_sweep(_write(tmp_path, data), tmp_path / "out", jobs=2, progress=False)
    rows = list(csv.DictReader(open(tmp_path / "out" / "sweep.csv")))
    assert [(r["training.lr"], r["seed"]) for r in rows] == [
        ("0.001", "3"),
        ("0.001", "5"),
        ("0.004", "3"),
        ("0.004", "5"),
    ]
    assert all((tmp_path / "out" / r["run"] / "metrics.csv").is_file() for r in rows)
    loss = {(r["training.lr"], r["seed"]): float(r["final_val_loss"]) for r in rows}
    summary = {r["training.lr"]: r for r in csv.DictReader(open(tmp_path / "out" / "sweep_summary.csv"))}
    s = summary["0.004"]
    vals = [loss[("0.004", "3")], loss[("0.004", "5")]]
    low, high = sps.t.interval(0.95, 1, loc=sum(vals) / 2, scale=sps.sem(vals))
    assert s["n_seeds"] == "2" and float(s["final_val_loss_mean"]) == pytest.approx(sum(vals) / 2)
    assert (float(s["final_val_loss_ci_low"]), float(s["final_val_loss_ci_high"])) == (
        pytest.approx(low),
        pytest.approx(high),
    )
    diffs = [loss[("0.004", k)] - loss[("0.001", k)] for k in ("3", "5")]  # paired by seed
    assert float(s["delta_final_val_loss_mean"]) == pytest.approx(sum(diffs) / 2) and s["reference"] == "0.001"
    assert float(summary["0.001"]["delta_final_val_loss_mean"]) == 0.0
    md = (tmp_path / "out" / "sweep.md").read_text()
    assert "95% Student-t interval over seeds" in md and "(reference)" in md
    assert "n/a: no worker attacked" in md or "n/a: no clean twin" in md  # undefined values say why


def test_run_with_seeds_and_parallel_twins_equal_the_sequential_run(tmp_path, capsys):
    data = dict(
        SHORT,
        pipeline=dict(TINY["pipeline"], replicas=3),
        scoring={"twins": ["clean", "undefended"]},
        detector={"name": "sentinel", "warmup_steps": 2, "min_history": 4},
        adversary={
            "fraction": 0.34,
            "protect": ["first", "last"],
            "attacks": [{"name": "constant", "role": "activation", "start": 3}],
        },
    )
    path = _write(tmp_path, data)
    assert main(["run", str(path), "--out", str(tmp_path / "one"), "--quiet"]) == 0
    assert main(["run", str(path), "--out", str(tmp_path / "two"), "--quiet", "--jobs", "2"]) == 0
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two"))
    assert a["impact"] == b["impact"] and a["detection"]["clean_twin"] == b["detection"]["clean_twin"]
    assert a["detection"]["messages"] == b["detection"]["messages"]
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(tmp_path / "seeds"), "--seeds", "2", "--quiet", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "One scenario x 2 seeds (seeds 0, 1)" in out and "| all seeds | 2 |" in out
    assert json.loads((tmp_path / "seeds" / "seed-0" / "summary.json").read_text())["impact"] == a["impact"]
    assert json.loads((tmp_path / "seeds" / "seed-1" / "summary.json").read_text())["seed"] == 1
    assert len(list((tmp_path / "seeds" / "twins").glob("clean-*/events.npz"))) == 2  # one per seed


@pytest.mark.parametrize(
    "args, sweep, message",
    [
        (["--seeds", "0"], {}, "--seeds: 0 seeds; must be between 1 and 10000"),
        (["--seeds", "-3"], {}, "--seeds: -3 seeds"),
        ([], {"seeds": [0, -1]}, "sweep.seeds[1]: must be >= 0, got -1"),
        ([], {"seeds": [2**63]}, "sweep.seeds[0]: must be <= 9223372036854775807, got 9223372036854775808"),
        (["--set", f"seed={2**63 - 2}", "--seeds", "5"], {}, "seeds must stay below 2**63"),
        ([], {"seeds": [1, 1]}, "seeds [1] listed twice"),
        ([], {"reference": {"training.lr": 0.5}}, "sweep.reference.training.lr: 0.5 is not one of the grid's values"),
        (
            [],
            {"reference": {"detector.k": 3}},
            "sweep.reference.detector.k: not a grid key; the grid varies training.lr",
        ),
    ],
)
def test_bad_seeds_and_references_exit_2_located_before_anything_runs(tmp_path, capsys, args, sweep, message):
    data = dict(SHORT, sweep={"grid": {"training.lr": [0.001, 0.002]}, **sweep})
    assert main(["sweep", str(_write(tmp_path, data)), "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "o" / "points").exists()


def test_with_jobs_2_the_twins_train_in_another_process_beside_the_run(tmp_path, monkeypatch):
    import os
    from pathlib import Path

    from sentinel import runner, scenario

    real, pids = runner.run_twin, tmp_path / "pids"

    def spy(*args, **kwargs):
        with open(pids, "a") as f:  # written from whichever process trains the twin
            f.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "run_twin", spy)
    sc = scenario.validate(dict(SHORT, scoring={"twins": ["clean"]}))
    runner.run(sc, Path(tmp_path / "out"), progress=False, jobs=2)
    assert pids.read_text().split() != [str(os.getpid())] and len(pids.read_text().split()) == 1
