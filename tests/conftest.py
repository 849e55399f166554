"""Shared test helpers: tiny scenarios that train in a second or two."""

from __future__ import annotations

import os

import pytest
import torch

from sentinel import scenario

# One thread: tiny test models are faster single-threaded, and tests that spawn processes
# (sweeps, torch.distributed) would otherwise oversubscribe the 2 cores.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # the thread policy (sentinel/parallel.py) and subprocesses follow it


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject.toml): one test process per core, at most 8. Each holds torch (and transformers), and
    a real-process test in one of them starts up to 16 more: more workers would buy memory pressure, not speed."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, 8))


TINY = {
    "name": "tiny",
    "seed": 0,
    "model": {"layers": 4, "dim": 32, "heads": 2, "seq_len": 16},
    "data": {"source": "synthetic", "vocab": 32, "batch_size": 4, "val_batches": 2},
    "pipeline": {"stages": 4, "replicas": 1, "microbatches": 4, "schedule": "1f1b", "routing": "random"},
    "training": {"steps": 12, "lr": 3.0e-3, "warmup_steps": 2, "eval_every": 6},
}


def tiny(*overrides: str, base: dict | None = None) -> scenario.Scenario:
    """A validated tiny scenario with `key=value` overrides."""
    return scenario.validate(base or TINY, list(overrides))


@pytest.fixture
def tiny_scenario():
    return tiny
