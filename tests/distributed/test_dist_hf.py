"""A transformers model on real processes: the same run as `sim` (4 stages x 1 replica on 5 processes)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from sentinel.cli import main  # noqa: E402
from sentinel.eventlog import EventLog  # noqa: E402
from tests.distributed.helpers import assert_same_log, sim_reference, write_scenario  # noqa: E402
from tests.unit.model.hf_tiny import hf_base  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_llama_on_five_processes_matches_sim(tmp_path):
    data = hf_base("llama")
    data.update(name="hf_line", training={"steps": 4, "lr": 3.0e-3, "warmup_steps": 2, "eval_every": 2})
    data["pipeline"].update(routing="fixed")
    path = write_scenario(tmp_path, data)
    args = ["run", str(path), "--backend", "dist", "--nproc", "5", "--out", str(tmp_path / "dist"), "--quiet"]
    assert main(args) == 0
    dist_log = EventLog.load(tmp_path / "dist")
    assert_same_log(dist_log, sim_reference(path, [], tmp_path / "sim"))
    assert len(dist_log.messages) == 4 * 2 * 3 * 4  # steps x directions x boundaries x microbatches
    dist_sum = json.loads((tmp_path / "dist" / "summary.json").read_text())
    sim_sum = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert dist_sum["training"] == sim_sum["training"]


@pytest.mark.timeout(300)
def test_tied_embeddings_over_stages_match_sim(tmp_path):
    """GPT-2's tied embedding over 3 stages x 2 replicas: the first and the last stage's processes sum the copies'
    gradients as sim does."""
    data = {**hf_base("gpt2"), "name": "tied", "seed": 3}
    data["pipeline"] = {**data["pipeline"], "stages": 3, "replicas": 2, "routing": "random"}
    data["training"] = {"steps": 4, "lr": 3.0e-3, "warmup_steps": 2, "eval_every": 2}
    path = write_scenario(tmp_path, data)
    assert main(["run", str(path), "--backend", "dist", "--out", str(tmp_path / "dist"), "--quiet"]) == 0
    sim = sim_reference(path, [], tmp_path / "sim")
    assert_same_log(EventLog.load(tmp_path / "dist"), sim)
