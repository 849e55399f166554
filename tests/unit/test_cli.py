from __future__ import annotations

import csv
import json
import subprocess
import sys

import yaml

from sentinel.cli import main
from tests.conftest import TINY

SUMMARY_KEYS = {
    "scenario",
    "seed",
    "backend",
    "workers.total",
    "workers.malicious",
    "training.initial_val_loss",
    "training.final_val_loss",
    "training.steps",
    "detection.messages.tp",
    "detection.messages.fp",
    "detection.messages.fn",
    "detection.messages.tn",
    "detection.messages.precision",
    "detection.messages.recall",
    "detection.messages.f1",
    "detection.messages.fpr",
    "detection.workers.precision",
    "detection.workers.recall",
    "detection.workers.f1",
    "detection.workers.banned",
    "detection.workers.false_bans",
    "detection.workers.median_steps_to_ban",
    "impact.clean_val_loss",
    "impact.undefended_val_loss",
    "impact.defended_val_loss",
    "transport.bytes_sent",
    "transport.sim_time_s",
    "cost.wall_s",
    "cost.detector_s",
}


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        out[f"{prefix}{k}"] = v
    return out


def test_run_writes_the_result_folder(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    assert main(["run", str(sc), "--out", str(out), "--set", "training.steps=4", "--quiet"]) == 0
    for f in ("summary.json", "events.csv", "events.npz", "loss.png", "report.md", "scenario.yaml", "metrics.csv"):
        assert (out / f).is_file(), f
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(_flat(summary))
    assert summary["training"]["steps"] == 4 and summary["workers"]["total"] == 4
    assert summary["transport"]["bytes_sent"] > 0
    assert yaml.safe_load((out / "scenario.yaml").read_text())["training"]["steps"] == 4
    assert "val loss" in capsys.readouterr().out


def test_a_run_with_twins_prints_one_progress_with_an_eta_off_a_terminal(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(dict(TINY, scoring={"twins": ["clean", "undefended"]})))
    assert main(["run", str(sc), "--out", str(tmp_path / "out"), "--set", "training.steps=10"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[tiny]")]
    assert len(lines) >= 10 and lines[-1].startswith("[tiny] 100% 30/30 steps")  # run + 2 twins, one progress
    assert all(" elapsed, ETA " in line for line in lines) and any("clean: step" in line for line in lines)


def test_list_and_describe(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "aggregators:" in out and "mean" in out and "codecs:" in out and "identity" in out
    assert main(["describe", "mean"]) == 0
    assert "aggregators/mean" in capsys.readouterr().out
    assert main(["describe", "meen"]) == 2
    assert "did you mean 'mean'" in capsys.readouterr().err
    assert main(["list", "atacks"]) == 2
    assert "did you mean 'attacks'" in capsys.readouterr().err


def test_console_script_bad_flag_exits_2_without_traceback():
    p = subprocess.run([sys.executable, "-m", "sentinel.cli", "run"], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "usage:" in p.stderr


def test_failed_run_saves_partial_log_and_exits_1(tmp_path, capsys, monkeypatch):
    from sentinel.engine import sim

    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(TINY))
    real = sim.SimEngine.train_step

    def boom(self):
        if self.step == 2:
            raise FloatingPointError("simulated blow-up")
        return real(self)

    monkeypatch.setattr(sim.SimEngine, "train_step", boom)
    out = tmp_path / "out"
    assert main(["run", str(sc), "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "failed at step 2" in err and "simulated blow-up" in err and "Traceback" not in err
    assert (out / "events.npz").is_file() and "simulated blow-up" in (out / "failure.txt").read_text()


def test_report_rebuilds_saved_results_without_retraining(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    assert main(["run", str(sc), "--out", str(out), "--set", "training.steps=3", "--quiet"]) == 0
    before = json.loads((out / "summary.json").read_text())
    (out / "summary.json").unlink()
    (out / "report.md").unlink()
    assert main(["report", str(out), str(out)]) == 0
    after = json.loads((out / "summary.json").read_text())
    assert after["training"] == before["training"] and after["detection"] == before["detection"]
    assert (out / "report.md").is_file() and "| run | final val loss" in capsys.readouterr().out
    assert main(["report", str(out), "--csv", str(tmp_path / "all.csv")]) == 0
    row = next(csv.DictReader(open(tmp_path / "all.csv")))
    assert row["run"] == str(out) and float(row["final_val_loss"]) == after["training"]["final_val_loss"]
    assert main(["report", str(tmp_path)]) == 2
