"""The transformers model families sentinel splits into stages, and where each keeps its parts.

A family is data: the module paths of the token embedding, the decoder layers, the final norm, the
learned position embedding (GPT-2) or the rotary embedding (Llama-likes), the modules inside a layer
that write into the residual stream, the dropout keys of its config, and which attention mask each
layer takes. `HFStage` rebuilds per stage what the family's model-level `forward` computes once
(position ids, rotary tables, causal or sliding-window masks) from these facts, so a stage computes
exactly what its slice of the unsplit model computes. Adding a family that follows one of these
layouts is one entry here (plus a tiny-config test in tests/unit/model/test_hf.py).

This module imports nothing from transformers, so the schema can name the families without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
    embed: str  # token embedding, (V, C)
    layers: str  # nn.ModuleList of decoder layers
    norm: str  # final norm before the LM head
    residual_writers: tuple[str, ...]  # per layer: output projections added into the residual stream
    dropouts: tuple[str, ...]  # config keys forced to 0 (runs are deterministic)
    positions: str | None = None  # learned absolute position embedding (T_max, C), added after the token one
    rotary: str | None = None  # rotary embedding module: (hidden, position_ids) -> (cos, sin) for every layer
    mask_kind: Callable[[object, int], str] = lambda config, i: FULL  # layer i's mask, as the model picks it


def _qwen2_mask(config, i: int) -> str:
    return config.layer_types[i]  # Qwen2Model: causal_mask_mapping[config.layer_types[i]]


def _mistral_mask(config, i: int) -> str:
    return FULL if config.sliding_window is None else SLIDING  # MistralModel: one mask function for all layers


_LLAMA_LIKE = dict(
    embed="model.embed_tokens",
    layers="model.layers",
    norm="model.norm",
    rotary="model.rotary_emb",
    residual_writers=("self_attn.o_proj", "mlp.down_proj"),
    dropouts=("attention_dropout",),
)

FAMILIES: dict[str, Family] = {
    "llama": Family(**_LLAMA_LIKE),
    "mistral": Family(**_LLAMA_LIKE, mask_kind=_mistral_mask),
    "qwen2": Family(**_LLAMA_LIKE, mask_kind=_qwen2_mask),
    "gpt2": Family(
        embed="transformer.wte",
        layers="transformer.h",
        norm="transformer.ln_f",
        positions="transformer.wpe",
        residual_writers=("attn.c_proj", "mlp.c_proj"),
        dropouts=("attn_pdrop", "resid_pdrop", "embd_pdrop", "summary_first_dropout"),
    ),
}
