"""Sweep executors: Ray tasks give the local executor's table; a failed run leaves the finished ones
tabulated and exits 1; no Ray, or an unreachable cluster: exit 2 with a located message."""

from __future__ import annotations

import csv
import socket
import sys

import pytest
import yaml

from sentinel.cli import main
from tests.conftest import TINY


def _scenario(tmp_path):
    data = dict(TINY, training=dict(TINY["training"], steps=6, eval_every=3))
    data["sweep"] = {"grid": {"training.lr": [0.001, 0.004]}, "seeds": 2}  # 4 tiny runs
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_ray_executor_writes_the_local_executors_table(tmp_path):
    ray = pytest.importorskip("ray")
    from sentinel.sweep import run_sweep

    path = _scenario(tmp_path)
    run_sweep(path, tmp_path / "local", jobs=2, progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        run_sweep(path, tmp_path / "ray", executor="ray", threads=1, progress=False)
    finally:
        ray.shutdown()
    local = (tmp_path / "local" / "sweep.csv").read_text()
    assert (tmp_path / "ray" / "sweep.csv").read_text() == local and len(local.splitlines()) == 5
    assert len(list((tmp_path / "ray").glob("points/*/seed-*/summary.json"))) == 4
    assert (tmp_path / "ray" / "sweep_summary.csv").read_text() == (
        tmp_path / "local" / "sweep_summary.csv"
    ).read_text()


def test_without_ray_or_with_an_unreachable_cluster_exit_2(tmp_path, capsys, monkeypatch):
    path = _scenario(tmp_path)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert (
        main(["sweep", str(path), "--out", str(tmp_path / "o"), "--executor", "ray", "--address", f"127.0.0.1:{port}"])
        == 2
    )
    err = capsys.readouterr().err
    assert f"--address 127.0.0.1:{port}: cannot reach a Ray cluster there" in err and "Traceback" not in err
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--address", "x:1"]) == 2
    assert "--address: only used with --executor ray" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--executor", "ray"]) == 2
    assert 'install it with pip install -e ".[ray]"' in capsys.readouterr().err
    assert not list((tmp_path / "o").glob("points/*/seed-*/summary.json"))


def test_a_failed_run_keeps_the_finished_ones_and_exits_1(tmp_path, capsys, monkeypatch):
    from sentinel.sweep import execute

    real = execute.execute_run

    def flaky(task, sink):
        if task.seed == 1 and task.point == 1:
            raise RuntimeError("node lost")
        return real(task, sink)

    monkeypatch.setattr(execute, "execute_run", flaky)
    path = _scenario(tmp_path)
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--jobs", "1", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "1 of 4 runs failed" in err and "node lost" in err and "Traceback" not in err
    rows = list(csv.DictReader(open(tmp_path / "o" / "sweep.csv")))
    assert len(rows) == 3  # the finished runs are tabulated and kept for the rerun
    monkeypatch.setattr(execute, "execute_run", real)
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--jobs", "1", "--quiet"]) == 0
    assert "3/4 runs already finished; resuming" in capsys.readouterr().err
