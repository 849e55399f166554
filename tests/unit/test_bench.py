"""The benchmark harness (the benchmarks themselves run with `sentinel bench`)."""

from __future__ import annotations

from sentinel import bench


def test_alternate_times_every_trainer_in_turn_and_shows_each_one():
    class Trainer:
        def __init__(self):
            self.steps = 0

        def train_step(self):
            self.steps += 1

    seen = []
    t = bench.alternate(
        {"a": Trainer, "b": Trainer},
        reps=2,
        steps=3,
        after=lambda name, trainer, s: seen.append((name, trainer.steps, s >= 0)),
    )
    assert set(t) == {"a", "b"} and all(v >= 0 for v in t.values())
    assert seen == [("a", 4, True), ("b", 4, True)] * 2  # one untimed warm-up step, then the timed ones


def test_figures_taken_above_the_core_count_are_flagged_and_cpu_time_is_recorded(monkeypatch, capsys):
    class Trainer:
        def train_step(self):
            sum(range(2000))

    cpu: dict = {}
    bench.alternate({"a": Trainer, "b": Trainer}, reps=2, steps=2, cpu=cpu)
    assert len(cpu["a"]) == len(cpu["b"]) == 2 and all(v >= 0 for v in cpu["a"])
    loads = iter([0.5, 0.7, 3.9, 4.1])
    monkeypatch.setattr(bench.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(bench, "BENCHMARKS", [lambda quick: {"idle_ratio": 1.0}, lambda quick: {"busy_ratio": 2.0}])
    monkeypatch.setattr("sentinel.parallel.cpu_count", lambda: 2)
    out = bench.run_all(quick=True)
    assert out["idle_ratio"] == 1.0 and "idle_ratio" not in out["flags"]
    assert "load average of 4.1 > 2 cores" in out["flags"]["busy_ratio"]
    assert "load average 3.90 on 2 cores" in capsys.readouterr().err
