"""The realistic family end to end: a transformers model on BPE text through `sentinel run`, twins included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from sentinel.cli import main  # noqa: E402

LIBRARY = Path(__file__).resolve().parents[2] / "scenarios" / "realistic"
SHRINK = [
    "model.seq_len=16",
    "model.hf.config.hidden_size=64",
    "model.hf.config.intermediate_size=128",
    "model.hf.config.num_hidden_layers=4",
    "data.bpe_vocab=512",
    "training.steps=6",
    "training.eval_every=3",
    "adversary.attacks[0].start=3",
    "detector.warmup_steps=2",
    "detector.min_history=4",
]


@pytest.mark.parametrize("path", sorted(LIBRARY.rglob("*.yaml")), ids=lambda p: str(p.relative_to(LIBRARY)))
def test_every_realistic_scenario_validates(path, capsys):
    gpu = ["--backend", "dist", "--nproc", "5", "--force"] if path.parent.name == "gpu" else []  # over this budget
    assert main(["validate", str(path), *gpu]) == 0
    assert "model: hf " in capsys.readouterr().out  # the size estimate names the transformers family


def test_the_realistic_scenario_runs_with_its_twins(tmp_path, capsys):
    args = ["run", str(LIBRARY / "llama_bpe.yaml"), "--out", str(tmp_path / "out"), "--quiet"]
    for item in SHRINK:
        args += ["--set", item]
    assert main(args) == 0
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["training"]["steps"] == 6 and summary["workers"]["total"] == 12
    assert summary["impact"]["clean_val_loss"] is not None and summary["impact"]["undefended_val_loss"] is not None
    assert summary["training"]["final_val_loss"] < summary["training"]["initial_val_loss"]
    assert len(list(out.glob("tokenizer-bpe-*.json"))) == 1  # trained once, kept beside the results
    assert summary["detection"]["messages"]["tp"] + summary["detection"]["messages"]["fn"] > 0  # the attack acted
