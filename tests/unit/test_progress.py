"""Progress off a terminal: a line every 10% and every 30 s, with an ETA; the thread policy."""

from __future__ import annotations

import io

import pytest

from sentinel.errors import ConfigError
from sentinel.parallel import thread_count
from sentinel.progress import Progress, duration


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_lines_every_ten_percent_and_every_thirty_seconds_with_an_eta():
    clock, out = Clock(), io.StringIO()
    p = Progress(100, "run", stream=out, tty=False, clock=clock, heartbeat=False)
    for _ in range(25):
        clock.t += 1.0
        p.update(1, "step")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("[run] 10% 10/100 steps, 10s elapsed, ETA 1m30s (step)")
    assert lines[1].startswith("[run] 20% 20/100 steps")
    clock.t += 45.0  # a long silent step: the next update prints although no 10% mark was crossed
    p.update(1)
    assert out.getvalue().splitlines()[-1].startswith("[run] 26% 26/100 steps, 1m10s elapsed, ETA")
    p.close()
    assert out.getvalue().splitlines()[-1].startswith("[run] 26%")  # no duplicate final line


def test_heartbeat_prints_while_nothing_moves():
    import time

    out = io.StringIO()
    p = Progress(10, "bench", unit="runs", stream=out, tty=False, every_s=0.2)
    p.update(0)
    time.sleep(0.7)
    p.close()
    assert out.getvalue().count("[bench] 0% 0/10 runs") >= 2


def test_silent_progress_prints_nothing_and_duration_reads_well():
    out = io.StringIO()
    p = Progress(10, "x", enabled=False, stream=out, tty=False, heartbeat=False)
    p.update(10)
    p.close()
    assert out.getvalue() == ""
    assert (duration(5), duration(187), duration(3725)) == ("5s", "3m07s", "1h02m")


def test_thread_policy(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("sentinel.parallel.cpu_count", lambda: 8)
    assert thread_count(1) == (8, "8 cores // 1 jobs") and thread_count(3)[0] == 2 and thread_count(16)[0] == 1
    assert thread_count(2, requested=3) == (3, "--threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert thread_count(2) == (1, "OMP_NUM_THREADS")
    with pytest.raises(ConfigError, match="--threads: 0"):
        thread_count(1, requested=0)
