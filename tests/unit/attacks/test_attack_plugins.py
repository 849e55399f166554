"""Third-party attacks: the README's "write your own attack" example runs as written, and an attack
registered through the `sentinel.attacks` entry-point group works in scenarios and the CLI."""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import re
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml

from attacks import Attack, register_attack
from sentinel import cli, runner, scenario
from sentinel.config import spec
from sentinel.registry import ATTACKS

README = Path(__file__).resolve().parents[3] / "README.md"
BASE = {
    "seed": 0,
    "model": {"layers": 4, "dim": 16, "heads": 2, "seq_len": 8},
    "data": {"source": "synthetic", "vocab": 16, "batch_size": 2, "val_batches": 1},
    "pipeline": {"stages": 4, "replicas": 3, "microbatches": 3, "routing": "fixed"},
    "training": {"steps": 4, "warmup_steps": 1, "eval_every": 4},
}


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made by a test vanish after it."""
    monkeypatch.setattr(ATTACKS, "_entries", dict(ATTACKS._entries))


def _blocks(lang: str) -> list[str]:
    section = README.read_text().split("## Write your own attack", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def _run_example(monkeypatch) -> types.ModuleType:
    """Execute the README's python block as a module (as a user's file would be)."""
    module = types.ModuleType("readme_example")
    monkeypatch.setitem(sys.modules, "readme_example", module)
    exec(compile(_blocks("python")[0], str(README), "exec"), module.__dict__)
    return module


def test_readme_example_is_about_twenty_lines_and_runs_in_a_scenario(scratch_registry, monkeypatch, capsys):
    assert len([ln for ln in _blocks("python")[0].splitlines() if ln.strip()]) <= 20
    _run_example(monkeypatch)
    data = copy.deepcopy(BASE)
    data.update(yaml.safe_load(_blocks("yaml")[0]))
    sc = scenario.validate(data)
    engine = runner.build_engine(sc)
    engine.run()
    gt = engine.log.ground_truth
    assert len(gt) > 0 and {engine.log.attacks[i] for i in gt["attack"]} == {"top_flip"}
    assert set(gt["step"].tolist()) == {2, 3}
    assert cli.main(["describe", "top_flip"]) == 0
    assert "share: float = 0.1" in capsys.readouterr().out


def test_readme_example_attack_flips_the_largest_coordinates(scratch_registry, monkeypatch):
    example = _run_example(monkeypatch)
    a = example.TopFlip(example.TopFlip.Config(share=0.25))
    x = torch.tensor([1.0, -4.0, 2.0, 0.5])
    assert torch.equal(a.apply(x, None), torch.tensor([1.0, 4.0, 2.0, 0.5]))


class _FakeEntryPoint:
    name, group = "halve", "sentinel.attacks"

    @staticmethod
    def load():
        @register_attack("third_party_halve")
        class Halve(Attack):
            """Halve the message (a third-party attack loaded from an entry point)."""

            @dataclasses.dataclass(frozen=True, kw_only=True)
            class Config:
                factor: float = spec(0.5, gt=0, help="multiplier")

            def apply(self, x, ctx):
                return x * self.config.factor

        return Halve


def test_entry_point_attack_works_in_scenarios_and_the_cli(scratch_registry, monkeypatch, capsys):
    real = importlib.metadata.entry_points

    def fake(**kw):
        return [_FakeEntryPoint()] if kw.get("group") == "sentinel.attacks" else real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    monkeypatch.setattr(ATTACKS, "_loaded", False)  # look the entry points up again
    assert "third_party_halve" in ATTACKS
    data = copy.deepcopy(BASE)
    data["adversary"] = {"fraction": 0.34, "attacks": [{"name": "third_party_halve", "role": "both", "factor": 0.25}]}
    sc = scenario.validate(data)
    assert sc.adversary.attacks[0].params() == {"factor": 0.25}
    engine = runner.build_engine(sc)
    engine.run()
    assert len(engine.log.ground_truth) > 0
    assert cli.main(["list", "attacks"]) == 0
    assert "third_party_halve" in capsys.readouterr().out
    assert cli.main(["describe", "third_party_halve"]) == 0
    out = capsys.readouterr().out
    assert "entry point" in out and "factor: float = 0.5" in out
    data["adversary"]["attacks"][0]["factr"] = 1
    with pytest.raises(scenario.ConfigError, match="did you mean 'factor'"):
        scenario.validate(data)


def test_cli_lists_and_describes_every_attack_of_the_library(capsys):
    names = [
        "constant",
        "random",
        "scaling",
        "random_sign",
        "bias",
        "delay",
        "invisible_noise",
        "alie",
        "ipm",
        "replay_other",
        "target_corruption",
        "fence_evasion",
        "slow_drift",
        "warmup_poisoning",
        "intermittent",
        "sparse",
        "same_direction",
        "undo_pair",
    ]
    assert cli.main(["list", "attacks"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[1:] if ln.strip()}
    for name in names:
        assert name in lines and len(lines[name].split()) > 3, f"{name}: needs a one-line description"
        assert cli.main(["describe", f"attacks/{name}"]) == 0
        out = capsys.readouterr().out
        assert "Formula" in out and "parameters:" in out, name
