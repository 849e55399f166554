"""Bad hf model sections: exit 2 from `sentinel validate` with a located message, before any work."""

from __future__ import annotations

import json

import pytest
import yaml

pytest.importorskip("transformers")

from sentinel.cli import main  # noqa: E402
from sentinel.model.hf import build_model  # noqa: E402
from tests.unit.model.hf_tiny import CONFIGS, hf_base, hf_tiny  # noqa: E402


def _validate(tmp_path, data: dict, capsys) -> tuple[int, str]:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main(["validate", str(path)])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.err + out.out


def _with_config(family: str, **changes) -> dict:
    base = hf_base(family)
    cfg = base["model"]["hf"]["config"]
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return base


def _with(base: dict, section: str, **changes) -> dict:
    base.setdefault(section, {}).update(changes)
    return base


@pytest.mark.parametrize(
    "data,expected",
    [
        (
            _with_config("llama", model_type="lama"),
            "model.hf.config.model_type: unknown model_type 'lama' (did you mean 'llama'?); supported: gpt2, llama",
        ),
        (
            _with_config("llama", model_type="bert"),
            "model.hf.config.model_type: 'bert' is a transformers model sentinel does not split into stages yet",
        ),
        (_with_config("llama", model_type=None), "model.hf.config.model_type: required: one of gpt2, llama"),
        (
            _with_config("llama", hidden_size=100, num_attention_heads=3),
            "model.hf.config: the llama family rejects this config: The hidden size (100) is not a multiple of the "
            "number of attention heads (3)",
        ),
        (
            _with_config("llama", hiden_size=64),
            "model.hf.config.hiden_size: unknown key for llama (did you mean 'hidden_size'?)",
        ),
        (_with_config("gpt2", resid_pdrop=0.1), "model.hf.config.resid_pdrop: 0.1: dropout must be 0"),
        (
            _with(hf_base("llama"), "pipeline", stages=5),
            "pipeline.stages: 5 stages but the model has 4 decoder layers (model.hf.config)",
        ),
        (
            _with_config("llama", vocab_size=16),
            "data.tokenizer: the tokenizer's vocabulary (32) exceeds the model's vocab_size (16, model.hf.config)",
        ),
        (
            _with(_with_config("llama", vocab_size=64), "model", vocab=48),
            "model.vocab: 48 but model.hf.config sets vocab_size 64: remove one of them",
        ),
        (_with(hf_base("llama"), "model", dim=128), "model.dim: 128 is a builtin-model key; with model.source: hf"),
        (
            _with(_with_config("gpt2", n_positions=8), "model", seq_len=16),
            "model.seq_len: 16 exceeds the model's learned positions (n_positions 8, model.hf.config)",
        ),
        (_with(hf_base("gpt2"), "dp", sync="none"), "dp.sync: 'none': the tied embedding (first and last stage)"),
        ({"model": {"source": "hf", "hf": {}}}, "model.hf: give exactly one of model.hf.config"),
        (
            {"model": {"source": "hf", "hf": {"path": "/no/such/ckpt"}}},
            "model.hf.path: '/no/such/ckpt' is not a folder",
        ),
    ],
    ids=[
        "unknown_family",
        "unsupported_family",
        "no_model_type",
        "family_rejects",
        "typo",
        "dropout",
        "stages_gt_layers",
        "tokenizer_exceeds_model",
        "vocab_conflict",
        "builtin_key",
        "positions",
        "tied_without_allreduce",
        "neither_config_nor_path",
        "path_missing",
    ],
)
def test_bad_hf_sections_exit_2_located(tmp_path, capsys, data, expected):
    code, out = _validate(tmp_path, data, capsys)
    assert code == 2 and expected in out, out


@pytest.fixture
def checkpoint(tmp_path):
    sc = hf_tiny("llama")
    folder = tmp_path / "ckpt"
    build_model(sc.model, 32, seed=0).save_pretrained(folder)
    return folder


def _ckpt_scenario(folder) -> dict:
    base = hf_base("llama")
    base["model"]["hf"] = {"path": str(folder)}
    return base


def test_a_checkpoint_validates_and_prints_its_size(tmp_path, capsys, checkpoint):
    code, out = _validate(tmp_path, _ckpt_scenario(checkpoint), capsys)
    assert code == 0, out
    assert "model: hf llama, 39.2k parameters (10.3k, 9.28k, 9.28k, 10.3k per stage), width 32, vocab 32" in out


def test_a_folder_without_config_json(tmp_path, capsys, checkpoint):
    (checkpoint / "config.json").unlink()
    code, out = _validate(tmp_path, _ckpt_scenario(checkpoint), capsys)
    assert code == 2 and f"model.hf.path: {checkpoint}: no config.json" in out


def test_missing_weights(tmp_path, capsys, checkpoint):
    from safetensors.torch import load_file, save_file

    weights = load_file(checkpoint / "model.safetensors")
    del weights["model.layers.2.mlp.up_proj.weight"]
    save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
    code, out = _validate(tmp_path, _ckpt_scenario(checkpoint), capsys)
    assert code == 2 and "1 weights missing from the safetensors files, e.g. model.layers.2.mlp.up_proj.weight" in out


def test_mismatched_weights(tmp_path, capsys, checkpoint):
    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg["intermediate_size"] = 48
    (checkpoint / "config.json").write_text(json.dumps(cfg))
    code, out = _validate(tmp_path, _ckpt_scenario(checkpoint), capsys)
    assert (
        code == 2
        and "weights have the wrong shape, e.g. model.layers.0.mlp.gate_proj.weight [64, 32] (config wants [48, 32])"
        in out
    )


def test_pickle_checkpoints_are_refused(tmp_path, capsys, checkpoint):
    (checkpoint / "model.safetensors").rename(checkpoint / "pytorch_model.bin")
    code, out = _validate(tmp_path, _ckpt_scenario(checkpoint), capsys)
    assert code == 2 and "no *.safetensors weights (pytorch_model.bin are pickle files" in out


def test_without_the_extra_an_hf_scenario_exits_2_with_the_install_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sentinel.model.hf_config.available", lambda: False)
    code, out = _validate(tmp_path, hf_base("llama"), capsys)
    assert code == 2 and "model.source: 'hf' needs the optional transformers extra: pip install -e '.[hf]'" in out


def test_every_tiny_config_validates(tmp_path, capsys):
    for family in CONFIGS:
        code, out = _validate(tmp_path, hf_base(family), capsys)
        assert code == 0, out
