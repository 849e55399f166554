"""Faults, not hangs: malformed payloads are flagged and attributed; a dead or stalled rank ends the run
in bounded time with a message naming it, the partial EventLog on disk; a checkpoint resumes the run."""

from __future__ import annotations

import csv
import os
import signal
import threading
import time

import pytest

from sentinel.distributed.launch import launch
from sentinel.distributed.runtime import Options
from sentinel.errors import RunError
from sentinel.eventlog import EventLog
from tests.distributed.helpers import LINE, assert_same_log, sim_reference, write_scenario

pytestmark = pytest.mark.slow

FAULTS = {  # kind -> (worker, step): one each, on different links, both directions
    "shape": ("s1r0", 1),
    "dtype": ("s2r0", 1),
    "nan": ("s0r0", 2),
    "bytes": ("s1r0", 2),
    "oversize": ("s2r0", 3),
    "manifest": ("s0r0", 3),
}


@pytest.mark.timeout(240)
def test_malformed_payloads_are_flagged_and_attributed_not_fatal(tmp_path):
    path = write_scenario(tmp_path, {**LINE, "detector": {"name": "norm_zscore"}, "response": {"ban_after": 100}})
    faults = tuple(f"{kind}:{w}:{step}" for kind, (w, step) in FAULTS.items())
    summary = launch(
        str(path),
        tmp_path / "out",
        nproc=4,
        options=Options(timeout_s=60, faults=faults),
        quiet=True,
        timeout_s=220,
        output=tmp_path / "out.log",
    )
    assert summary["training"]["steps"] == LINE["training"]["steps"]  # the run finished
    with open(tmp_path / "out" / "events.csv") as f:
        rows = list(csv.DictReader(f))
    for kind, (worker, step) in FAULTS.items():
        hit = [r for r in rows if r["tampered_by"] == f"fault_{kind}"]
        assert len(hit) == 1, kind
        row = hit[0]
        assert row["sender"] == worker and int(row["step"]) >= step and row["flagged"] == "1", (kind, row)
        assert row["score_integrity"] == "1", kind  # the relay's wire checks, or the verifier's (NaN)
        assert (row.get("score_wire_reject") == "1") == (kind != "nan"), kind
    assert summary["detection"]["messages"]["tp"] == len(FAULTS)


def _launch_in_thread(**kwargs) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def go():
        try:
            result["summary"] = launch(**kwargs)
        except Exception as exc:  # the test inspects it
            result["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, result


def _wait_for(predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the run to get going"
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_killed_rank_ends_the_run_and_a_checkpoint_resumes_it(tmp_path):
    """SIGKILL one worker rank mid-run; then resume from the step-2 checkpoint and finish as sim does.

    Steps 0-1 are warm-up steps, whose learning rate does not depend on `training.steps`: the killed
    run (500 steps) and the resumed one (4 steps) agree up to the checkpoint.
    """
    long = write_scenario(tmp_path, {**LINE, "name": "long", "training": {**LINE["training"], "steps": 500}})
    out = tmp_path / "killed"
    thread, result = _launch_in_thread(
        scenario_path=str(long),
        out=out,
        nproc=4,
        quiet=True,
        timeout_s=250,
        options=Options(timeout_s=30, checkpoint_every=2),
        output=tmp_path / "k.log",
    )
    _wait_for(lambda: (out / "checkpoints" / "step-000002" / "COMPLETE").is_file(), 200)
    os.kill(int((out / "ranks" / "rank2" / "pid").read_text()), signal.SIGKILL)  # hosts s1r0
    killed_at = time.monotonic()
    thread.join(90)
    assert not thread.is_alive(), "the run did not end after a rank died"
    assert time.monotonic() - killed_at < 90
    err = result.get("error")
    assert isinstance(err, RunError) and "rank 2 (worker s1r0)" in str(err), err
    assert "rank 2" in (out / "failure.txt").read_text()
    partial = EventLog.load(out)  # what was logged so far, merged from the ranks' parts
    assert len(partial.messages) >= 2 * 2 * 2 * 4 and len(partial.losses) >= 2 * 4

    short = write_scenario(tmp_path, LINE)  # same scenario, 5 steps
    launch(
        str(short),
        tmp_path / "resumed",
        nproc=4,
        quiet=True,
        timeout_s=200,
        output=tmp_path / "r.log",
        options=Options(timeout_s=60, resume=str(out / "checkpoints" / "step-000002")),
    )
    assert_same_log(EventLog.load(tmp_path / "resumed"), sim_reference(short, [], tmp_path / "sim"))


@pytest.mark.timeout(200)
def test_stalled_rank_is_named_after_the_timeout(tmp_path):
    path = write_scenario(tmp_path, {**LINE, "training": {**LINE["training"], "steps": 200}})
    t0 = time.monotonic()
    with pytest.raises(RunError, match=r"rank 2 \(worker s1r0\) stalled") as info:
        launch(
            str(path),
            tmp_path / "out",
            nproc=4,
            options=Options(timeout_s=6, faults=("stall:s1r0:2",)),
            quiet=True,
            timeout_s=180,
            output=tmp_path / "out.log",
        )
    assert time.monotonic() - t0 < 180
    assert "step 2" in str(info.value)
    log = EventLog.load(tmp_path / "out")
    assert len(log.messages) >= 2 * 2 * 2 * 4 and (tmp_path / "out" / "failure.txt").is_file()
