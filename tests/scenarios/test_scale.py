"""The paper-sized (176) and larger (512) meshes run in the sim backend, with memory linear in workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel import scenario
from sentinel.engine.sim import SimEngine
from sentinel.model import num_params

SCALE = Path(__file__).resolve().parents[2] / "scenarios" / "scale"


@pytest.mark.parametrize("name,workers", [("workers176", 176), ("workers512", 512)])
def test_scale_scenarios_run_a_step(name, workers):
    sc = scenario.load(SCALE / f"{name}.yaml", ["training.steps=1"])
    eng = SimEngine(sc)
    assert len(eng.workers.ids) == workers == sc.num_workers
    loss = eng.train_step()
    assert loss == loss  # finite: not NaN
    S, M = sc.pipeline.stages, sc.pipeline.microbatches
    assert len(eng.log.messages) == 2 * (S - 1) * M
    # parameters held grow linearly: R copies of one model, nothing per pair of workers
    one_copy = num_params([eng.replicas[eng.workers.live_in_stage(s)[0]].module for s in range(S)])
    assert num_params([r.module for r in eng.replicas.values()]) == one_copy * sc.pipeline.replicas
