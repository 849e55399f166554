"""Tiny transformers configs (one per supported family) and scenarios built on them, for tests."""

from __future__ import annotations

import copy

from tests.conftest import TINY, tiny

# Four layers so S=4 puts one decoder layer on each stage; T=16 > sliding_window=8, so the sliding masks matter.
CONFIGS = {
    "llama": {
        "model_type": "llama",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "gpt2": {"model_type": "gpt2", "n_embd": 32, "n_layer": 4, "n_head": 4, "n_positions": 32},  # tied embeddings
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "use_sliding_window": True,
        "sliding_window": 8,
        "max_window_layers": 2,
    },
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "sliding_window": 8,
    },
}


def hf_base(family: str, **hf) -> dict:
    """conftest's TINY scenario with a transformers model of `family` (vocab from the data: 32)."""
    base = copy.deepcopy(TINY)
    base["model"] = {"source": "hf", "seq_len": 16, "hf": {"config": copy.deepcopy(CONFIGS[family]), **hf}}
    return base


def hf_tiny(family: str, *overrides: str):
    return tiny(*overrides, base=hf_base(family))
