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
    t = bench.alternate({"a": Trainer, "b": Trainer}, reps=2, steps=3,
                        after=lambda name, trainer, s: seen.append((name, trainer.steps, s >= 0)))
    assert set(t) == {"a", "b"} and all(v >= 0 for v in t.values())
    assert seen == [("a", 4, True), ("b", 4, True)] * 2  # one untimed warm-up step, then the timed ones
