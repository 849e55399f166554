"""Every paper attack, on activations and on gradients, measurably hurts undefended training.

One tiny 4-stage pipeline, one replica per stage, the malicious worker s2r0 (a middle stage, the
paper's threat model keeps stages 0 and 3 honest; with one replica every microbatch crosses it, which
isolates each attack's effect). No detector. The attack starts after 2 honest steps; the final
validation loss must exceed the clean twin's by MARGIN. Run with `-s` to print the table of deltas:

    python -m pytest -q -s tests/scenarios/test_attack_damage.py
"""

from __future__ import annotations

import copy

import pytest
import torch

from sentinel import scenario
from sentinel.runner import build_engine

PAPER = ["constant", "random", "scaling", "random_sign", "bias", "delay", "invisible_noise"]
PARAMS = {"delay": {"d": 3}}  # the default d = 10 would replay mostly pre-training messages in 30 steps
MARGIN = 0.02  # nats; the smallest delta measured when this test was written is 0.068 (invisible_noise, gradient)
STEPS = 30
BASE = {
    "name": "damage",
    "seed": 0,
    "model": {"layers": 4, "dim": 32, "heads": 2, "seq_len": 16},
    "data": {"source": "synthetic", "vocab": 32, "batch_size": 4, "val_batches": 2},
    "pipeline": {"stages": 4, "replicas": 1, "microbatches": 2, "routing": "random"},
    "training": {"steps": STEPS, "lr": 3.0e-3, "warmup_steps": 2, "eval_every": STEPS},
    "detector": {"name": "none"},
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one intra-op thread is faster and immune to CPU contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _final_val_loss(attack: str | None = None, role: str | None = None) -> float:
    data = copy.deepcopy(BASE)
    if attack is not None:
        data["adversary"] = {
            "placement": "explicit",
            "workers": ["s2r0"],
            "allow_dishonest_majority": True,  # 1 of 1 replica
            "attacks": [{"name": attack, "role": role, "start": 2, **PARAMS.get(attack, {})}],
        }
    engine = build_engine(scenario.validate(data))
    return engine.run()["final_val_loss"]


@pytest.fixture(scope="module")
def clean_loss(_one_thread) -> float:
    loss = _final_val_loss()
    print("\n| attack | role | clean val loss | attacked val loss | delta |\n|---|---|---|---|---|")
    return loss


@pytest.mark.parametrize("role", ["activation", "gradient"])
@pytest.mark.parametrize("attack", PAPER)
def test_undefended_attack_raises_final_val_loss(attack, role, clean_loss):
    attacked = _final_val_loss(attack, role)
    delta = attacked - clean_loss
    print(f"| {attack} | {role} | {clean_loss:.4f} | {attacked:.4f} | {delta:+.4f} |")
    assert delta > MARGIN, f"{attack} on {role}s: val loss {attacked:.4f} vs clean {clean_loss:.4f}"
