"""Real processes at scale and across "hosts": the 176-worker mesh, and two torchrun launches meeting by rendezvous."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.distributed.launch import launch
from sentinel.distributed.runtime import Options
from sentinel.eventlog import EventLog
from tests.distributed.helpers import REPO, assert_same_log, sim_reference, write_scenario

pytestmark = pytest.mark.slow
SCALE = REPO / "scenarios" / "scale" / "workers176.yaml"


@pytest.mark.timeout(900)
def test_the_176_worker_mesh_on_real_processes_equals_sim(tmp_path):
    """16 stages x 11 replicas on 17 processes (a verifier for the 15 boundaries + one rank per stage)."""
    overrides = ["training.steps=2", "training.eval_every=2"]
    summary = launch(
        str(SCALE),
        tmp_path / "dist",
        overrides,
        nproc=17,
        options=Options(timeout_s=240, verifiers=1),
        quiet=True,
        timeout_s=850,
        output=tmp_path / "dist.log",
    )
    assert summary["workers"]["total"] == 176
    sim = sim_reference(SCALE, overrides, tmp_path / "sim")
    assert_same_log(EventLog.load(tmp_path / "dist"), sim)
    assert len(sim.messages) == 2 * 2 * 15 * 22  # steps x directions x boundaries x microbatches


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(400)
def test_two_hosts_by_c10d_rendezvous_equal_sim(tmp_path):
    """Two torchrun launches (`--nnodes 2`, 3 processes each) meet through c10d rendezvous on this machine."""
    data = {
        "name": "two_hosts",
        "seed": 7,
        "model": {"layers": 3, "dim": 32, "heads": 2, "seq_len": 16},
        "data": {"source": "synthetic", "vocab": 32, "batch_size": 4, "val_batches": 2},
        "pipeline": {"stages": 3, "replicas": 2, "microbatches": 4, "schedule": "1f1b", "routing": "random"},
        "training": {"steps": 4, "lr": 3.0e-3, "warmup_steps": 2, "eval_every": 2},
        "detector": {"name": "sentinel", "warmup_steps": 1, "min_history": 4},
    }
    path = write_scenario(tmp_path, data)
    out, port = tmp_path / "dist", _free_port()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "sentinel-test",
        "--monitor-interval",
        "1",
        "-m",
        "sentinel.distributed",
        str(path),
        "--out",
        str(out),
        "--quiet",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    hosts = [
        subprocess.Popen(
            cmd,
            env=env,
            cwd=REPO,
            stdout=open(tmp_path / f"host{i}.log", "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for i in range(2)
    ]
    try:
        codes = [h.wait(timeout=360) for h in hosts]
    finally:
        for h in hosts:
            if h.poll() is None:
                os.killpg(h.pid, 9)
    assert codes == [0, 0], [Path(tmp_path / f"host{i}.log").read_text()[-2000:] for i in range(2)]
    assert_same_log(EventLog.load(out), sim_reference(path, [], tmp_path / "sim"))
