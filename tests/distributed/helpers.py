"""Shared by the multi-process tests: tiny scenarios, the sim reference run and the log comparison."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import yaml

from sentinel import runner, scenario
from sentinel.eventlog import EventLog

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"
SMALL = ["model.dim=32", "model.seq_len=16", "data.batch_size=4", "data.val_batches=2"]

# Attacked + defended: one malicious replica (s1r2, alone on its rank with --nproc 6) sign-flips and scales
# what it sends from step 6; SENTINEL flags it, the response bans it after two strikes and replaces it by a
# fresh replica -- hosted on the banned worker's rank, initialised from s1r0's state on another rank.
ATTACKED = {
    "name": "attacked_defended",
    "seed": 3,
    "model": {"layers": 3, "dim": 32, "heads": 2, "seq_len": 16},
    "data": {"source": "synthetic", "vocab": 32, "batch_size": 4, "val_batches": 2},
    "pipeline": {"stages": 3, "replicas": 3, "microbatches": 4, "schedule": "gpipe", "routing": "random"},
    "training": {"steps": 11, "lr": 3.0e-3, "warmup_steps": 2, "eval_every": 5},
    "adversary": {
        "placement": "explicit",
        "workers": ["s1r2"],
        "attacks": [{"name": "scaling", "role": "both", "alpha": -4.0, "start": 6}],
    },
    "detector": {"name": "sentinel", "warmup_steps": 3, "min_history": 6},
    # plain strike counting (no peer test), so a few strikes ban and the replacement path is exercised
    "response": {"on_flag": "drop", "ban_after": 2, "replace_banned": True, "ban_pvalue": 1.0, "attribution": "sender"},
}

# `on_flag: drop_suspect`: the attacker's first flagged activation is delivered, its later ones dropped
DROP_SUSPECT = {
    **ATTACKED,
    "name": "drop_suspect",
    "adversary": {
        "placement": "explicit",
        "workers": ["s1r2"],
        "attacks": [{"name": "scaling", "role": "activation", "alpha": -4.0, "start": 6}],
    },
    "response": {"on_flag": "drop_suspect"},
}


def delivered_flags(log) -> list[bool]:
    """Per flagged activation of DROP_SUSPECT's attacker (crossing into the last stage), in order: whether it was
    delivered (the last stage computed on it and sent a gradient back for its microbatch)."""
    m, v = log.messages, log.verdicts
    flagged = dict(zip(v["msg"].tolist(), v["flagged"].tolist()))
    sent = set(zip(m["step"].tolist(), m["mb"].tolist(), m["boundary"].tolist(), m["role"].tolist()))
    out = []
    for i in np.argsort(m["id"], kind="stable"):
        if flagged.get(int(m["id"][i])) and int(m["role"][i]) == 0 and log.workers[int(m["sender"][i])] == "s1r2":
            out.append((int(m["step"][i]), int(m["mb"][i]), int(m["boundary"][i]), 1) in sent)
    return out


# Three stages, one replica each: the smallest mesh that runs on four processes.
LINE = {
    "name": "line",
    "seed": 0,
    "model": {"layers": 3, "dim": 32, "heads": 2, "seq_len": 16},
    "data": {"source": "synthetic", "vocab": 32, "batch_size": 4, "val_batches": 2},
    "pipeline": {"stages": 3, "replicas": 1, "microbatches": 4, "schedule": "1f1b", "routing": "fixed"},
    "training": {"steps": 5, "lr": 3.0e-3, "warmup_steps": 2, "eval_every": 5},
}


def write_scenario(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sim_reference(path: Path, overrides: list[str], out: Path) -> EventLog:
    """The sim run of the same scenario, on one thread like each dist rank (so numbers match bit for bit)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runner.run(scenario.load(path, overrides), out, progress=False)
    finally:
        torch.set_num_threads(threads)
    return EventLog.load(out)


def assert_same_log(dist: EventLog, sim: EventLog) -> None:
    """Same messages, tampered messages, verdicts, bans; losses, evals and scores to float tolerance."""
    assert dist.workers == sim.workers
    assert dist.attacks == sim.attacks
    for table in EventLog.TABLES:
        a, b = getattr(dist, table).as_arrays(), getattr(sim, table).as_arrays()
        assert a.keys() == b.keys(), table
        for col in a:
            if a[col].dtype.kind == "f":
                torch.testing.assert_close(
                    torch.from_numpy(a[col]),
                    torch.from_numpy(b[col]),
                    rtol=1e-5,
                    atol=1e-6,
                    equal_nan=True,
                    msg=f"{table}.{col}",
                )
            else:
                np.testing.assert_array_equal(a[col], b[col], err_msg=f"{table}.{col}")
