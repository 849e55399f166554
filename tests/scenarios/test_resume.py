"""Checkpoints in sim: a run killed mid-way and resumed equals the uninterrupted run, bit for bit."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from attacks import ATTACKS, Attack
from sentinel import runner, scenario
from sentinel.cli import main
from sentinel.eventlog import EventLog

REPO = Path(__file__).resolve().parents[2]

# Every stateful part at once: SENTINEL (windows, EMAs, replay memory), the response policy (strikes, bans, a
# replacement), an attack with a replay buffer, asynchrony with look-ahead (weight queues), compressed DP sync
# (error feedback) and the network clock.
BUSY = {
    "name": "busy",
    "seed": 5,
    "model": {"layers": 3, "dim": 32, "heads": 2, "seq_len": 16},
    "data": {"source": "synthetic", "vocab": 32, "batch_size": 4, "val_batches": 2},
    "pipeline": {"stages": 3, "replicas": 3, "microbatches": 4, "schedule": "1f1b", "routing": "random"},
    "training": {"steps": 30, "lr": 3.0e-3, "warmup_steps": 2, "eval_every": 10},
    "adversary": {
        "placement": "explicit",
        "workers": ["s1r2"],
        "attacks": [
            {"name": "delay", "role": "activation", "start": 6, "d": 3},
            {"name": "scaling", "role": "gradient", "start": 9, "alpha": -3.0},
        ],
    },
    "detector": {"name": "sentinel", "warmup_steps": 3, "min_history": 6},
    "response": {"replace_banned": True},
    "dp": {"compression": {"method": "topk", "fraction": 0.2}},
    "transport": {"async": {"max_staleness": 1, "lookahead": True}},
}


def _same(a: EventLog, b: EventLog) -> None:
    assert a.workers == b.workers and a.attacks == b.attacks
    for table in EventLog.TABLES:
        x, y = getattr(a, table).as_arrays(), getattr(b, table).as_arrays()
        assert x.keys() == y.keys(), table
        for col in x:
            np.testing.assert_array_equal(x[col], y[col], err_msg=f"{table}.{col}")  # NaN == NaN here


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_run_resumes_exactly(tmp_path):
    path = tmp_path / "busy.yaml"
    path.write_text(yaml.safe_dump(BUSY, sort_keys=False))
    killed = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "sentinel.cli",
        "run",
        str(path),
        "--out",
        str(killed),
        "--quiet",
        "--checkpoint-every",
        "4",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, cwd=REPO)
    deadline = time.monotonic() + 300
    while not (killed / "checkpoints" / "step-000008" / "COMPLETE").is_file():
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint at step 8"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "summary.json").is_file()  # it really died mid-run
    assert main(["run", str(path), "--out", str(tmp_path / "resumed"), "--quiet", "--resume", str(killed)]) == 0
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runner.run(scenario.load(path), tmp_path / "whole", progress=False)
    finally:
        torch.set_num_threads(threads)
    whole, resumed = EventLog.load(tmp_path / "whole"), EventLog.load(tmp_path / "resumed")
    _same(resumed, whole)
    assert len(whole.ground_truth) and len(whole.bans) and whole.bans["replaced_by"][0] >= 0  # not vacuous


class Unsaveable(Attack):
    """Holds an open file: its state cannot be checkpointed (tests only: registered for one test, so the conformance
    suite, which parametrises over the registry at collection, never meets it whatever the order of collection)."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        pass

    def __init__(self, config=None):
        super().__init__(config)
        self.handle = open(os.devnull)  # noqa: SIM115

    def apply(self, x, ctx):
        return x


def test_a_plug_in_without_state_support_refuses_checkpoints_with_its_name(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(Unsaveable, "registry_name", "test_unsaveable", raising=False)  # as `register_attack` sets
    monkeypatch.setitem(ATTACKS._entries, "test_unsaveable", Unsaveable)  # both undone after the test
    path = tmp_path / "u.yaml"
    data = {
        **BUSY,
        "training": {**BUSY["training"], "steps": 2},
        "adversary": {**BUSY["adversary"], "attacks": [{"name": "test_unsaveable"}]},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--quiet", "--checkpoint-every", "1"]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint-every" in err and "plug-in 'test_unsaveable'" in err and ".handle" in err


def test_resume_from_a_folder_without_checkpoints_is_a_located_error(tmp_path, capsys):
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(BUSY, sort_keys=False))
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--resume", str(tmp_path)]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err
