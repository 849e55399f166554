"""Parity: the same scenario and seed give the same run on real processes (`dist`) as in one (`sim`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sentinel.cli import main
from sentinel.distributed.launch import launch
from sentinel.distributed.runtime import Options
from sentinel.eventlog import EventLog
from tests.distributed.helpers import (
    ATTACKED,
    DROP_SUSPECT,
    QUICKSTART,
    SMALL,
    assert_same_log,
    delivered_flags,
    sim_reference,
    write_scenario,
)

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_quickstart_on_five_processes_matches_sim(tmp_path):
    """4 stages x 2 replicas on 4 worker ranks (two replicas each) + the relay, through `sentinel run`."""
    overrides = [*SMALL, "training.steps=4", "training.eval_every=2"]
    args = ["run", str(QUICKSTART), "--backend", "dist", "--nproc", "5", "--out", str(tmp_path / "dist"), "--quiet"]
    for item in overrides:
        args += ["--set", item]
    assert main(args) == 0
    dist_log = EventLog.load(tmp_path / "dist")
    assert_same_log(dist_log, sim_reference(QUICKSTART, overrides, tmp_path / "sim"))
    assert len(dist_log.messages) == 4 * 2 * 3 * 4  # steps x directions x boundaries x microbatches
    dist_sum = json.loads((tmp_path / "dist" / "summary.json").read_text())
    sim_sum = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert dist_sum["backend"] == "dist" and sim_sum["backend"] == "sim"
    assert dist_sum["training"] == sim_sum["training"]
    assert dist_sum["transport"]["bytes_sent"] == sim_sum["transport"]["bytes_sent"]
    for name in ("events.csv", "report.md", "loss.png", "dist_timing.json"):
        assert (tmp_path / "dist" / name).is_file()


@pytest.mark.timeout(300)
def test_attacked_and_defended_scenario_on_six_processes_matches_sim(tmp_path):
    """Same tampered messages, flags, bans and replacement; the replacement's state crosses ranks."""
    path = write_scenario(tmp_path, ATTACKED)
    summary = launch(
        str(path),
        tmp_path / "dist",
        nproc=6,
        options=Options(timeout_s=60),
        quiet=True,
        timeout_s=280,
        output=tmp_path / "dist.log",
    )
    sim = sim_reference(path, [], tmp_path / "sim")
    dist_log = EventLog.load(tmp_path / "dist")
    assert_same_log(dist_log, sim)
    # the comparison is not vacuous: the attack acted, was flagged, and its worker banned and replaced
    assert len(sim.ground_truth) > 0 and sim.attacks == ["scaling"]
    flagged = set(sim.verdicts["msg"][sim.verdicts["flagged"]])
    assert set(sim.ground_truth["msg"]) <= flagged
    banned = [sim.workers[i] for i in sim.bans["worker"]]
    assert "s1r2" in banned  # (this short run may also ban an honest replica: parity is what is tested)
    replacement = sim.workers[sim.bans["replaced_by"][banned.index("s1r2")]]
    assert replacement.startswith("s1r") and replacement not in {"s1r0", "s1r1", "s1r2"}
    assert replacement in {dist_log.workers[i] for i in np.unique(dist_log.messages["sender"])}
    assert summary["detection"]["workers"]["banned"] == banned
    assert summary["workers"]["malicious"] == ["s1r2"]


EVERY_FEATURE = {  # what the relay backend refused: asynchrony, sparse averaging, the subspace codec; and more
    "name": "every_feature",
    "seed": 1,
    "model": {"layers": 3, "dim": 32, "heads": 2, "seq_len": 16},
    "data": {"source": "synthetic", "vocab": 32, "batch_size": 4, "val_batches": 2},
    "pipeline": {"stages": 3, "replicas": 3, "microbatches": 4, "schedule": "1f1b", "routing": "random"},
    "training": {"steps": 6, "lr": 3.0e-3, "warmup_steps": 2, "eval_every": 3},
    "transport": {
        "codec": {"name": "subspace", "rate": 4, "project_weights": True},
        "async": {"max_staleness": 1, "lookahead": True},
    },
    "dp": {"sync": "sparse_avg", "sparse_avg": {"every": 2, "fraction": 0.5, "delay": 1}},
    "adversary": {
        "placement": "explicit",
        "workers": ["s1r1"],
        "attacks": [{"name": "scaling", "role": "both", "start": 3, "alpha": -2.0}],
    },
    "detector": {"name": "sentinel", "warmup_steps": 2, "min_history": 4},
    "response": {"on_flag": "accept"},  # a verifier forwards before it judges (Relay.carry's `early`)
}
COMPRESSED = {  # DP compression with a robust aggregator, random masking, byte-level text, a DP-axis attack
    **EVERY_FEATURE,
    "name": "compressed",
    "seed": 2,
    "data": {"source": "text", "batch_size": 4, "val_batches": 2},
    "pipeline": {**EVERY_FEATURE["pipeline"], "schedule": "gpipe"},
    "transport": {"codec": {"name": "random_mask", "keep": 0.5}},
    "dp": {"compression": {"method": "low_rank", "rank": 2}, "aggregator": "median"},
    "adversary": {
        "placement": "explicit",
        "workers": ["s1r1"],
        "attacks": [
            {"name": "delay", "role": "activation", "start": 2, "d": 1},
            {"name": "ipm", "role": "dp_gradient", "start": 1},
        ],
    },
    "response": {"replace_banned": True},
}


SPARSE_AFTER_BAN = {  # a worker banned before the first averaging round: its process still takes part in it
    **EVERY_FEATURE,
    "name": "sparse_after_ban",
    "seed": 3,
    "transport": {},
    "response": {},
    "dp": {"sync": "sparse_avg", "sparse_avg": {"every": 5, "fraction": 0.5}},
    "adversary": {
        "placement": "explicit",
        "workers": ["s1r1"],
        "attacks": [{"name": "delay", "role": "activation", "start": 1, "d": 1}],
    },
    "detector": {"name": "sentinel"},
}


def test_sparse_after_ban_bans_before_its_averaging_round(tmp_path):
    """SPARSE_AFTER_BAN's premise (sim only): s1r1 is banned before step 4's round, so on real processes its process
    joins that round's all-gather with no replica of its own (a gloo size mismatch once killed it there)."""
    sim = sim_reference(write_scenario(tmp_path, SPARSE_AFTER_BAN), [], tmp_path / "sim")
    assert [sim.workers[i] for i in sim.bans["worker"]] == ["s1r1"] and int(sim.bans["step"][0]) < 4


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "data,nproc",
    [(EVERY_FEATURE, 7), (COMPRESSED, None), (SPARSE_AFTER_BAN, None), (DROP_SUSPECT, None)],
    ids=["async_sparse_subspace", "dp_compression_mask", "sparse_after_ban", "drop_suspect"],
)
def test_features_once_sim_only_match_sim(tmp_path, data, nproc):
    """Every engine feature runs on real processes with sim's numbers (nproc None: a verifier per boundary)."""
    path = write_scenario(tmp_path, data)
    launch(
        str(path),
        tmp_path / "dist",
        nproc=nproc,
        options=Options(timeout_s=60),
        quiet=True,
        timeout_s=380,
        output=tmp_path / "dist.log",
    )
    sim = sim_reference(path, [], tmp_path / "sim")
    assert_same_log(EventLog.load(tmp_path / "dist"), sim)
    assert len(sim.ground_truth) > 0 and len(sim.verdicts) > 0  # not vacuous
    if data is DROP_SUSPECT:  # the suspects every verifier rank reads come from the coordinator (StepEnd)
        delivered = delivered_flags(sim)
        assert delivered[0] and not all(delivered)
