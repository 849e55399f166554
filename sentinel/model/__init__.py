"""Models split into pipeline stages: the built-in Llama-style decoder, or a transformers causal LM.

    build_stages(cfg, vocab, S, seed)   [Stage] * S; weights depend on the seed only, not on S
    dims(scenario)                      ModelDims: hidden width, layers, vocabulary (no model built)
    describe(scenario)                  parameters per stage, bytes per boundary message (meta device)
    global_parameters(stages)           name -> tensor with names independent of the split
    model_hooks(scenario)               step hooks the model needs (tied embeddings over S > 1 stages)

`model.source: builtin` (sentinel/model/builtin.py) needs torch only; `model.source: hf`
(sentinel/model/hf.py) needs the `[hf]` extra and is imported only when used.
"""

from __future__ import annotations

from sentinel.errors import ConfigError
from sentinel.model import hf_config
from sentinel.model.base import ModelDims, Stage, global_parameters, loss_fn, num_params, split_layers
from sentinel.model.builtin import BuiltinStage, build_builtin_stages, ffn_hidden
from sentinel.model.facts import check, describe, dims
from sentinel.model.tied import TiedEmbeddings
from sentinel.scenario import ModelConfig


def build_stages(cfg: ModelConfig, vocab: int, num_stages: int, seed: int) -> list[Stage]:
    """The model split into `num_stages` stages (`vocab` from `dims(scenario).vocab`)."""
    if cfg.source == "builtin":
        return build_builtin_stages(cfg, vocab, num_stages, seed)
    if not hf_config.available():  # optional dependency: imported only for hf scenarios
        raise ConfigError(f"model.source: 'hf' needs the optional transformers extra: {hf_config.INSTALL}")
    from sentinel.model.hf import build_hf_stages

    return build_hf_stages(cfg, vocab, num_stages, seed)


def model_hooks(scenario) -> list:
    """Step hooks the model needs, run first after DP sync: `TiedEmbeddings` for a tied matrix over S > 1."""
    if scenario.pipeline.stages > 1 and dims(scenario).tied:
        return [TiedEmbeddings()]
    return []


__all__ = [
    "BuiltinStage",
    "ModelDims",
    "Stage",
    "TiedEmbeddings",
    "build_stages",
    "check",
    "describe",
    "dims",
    "ffn_hidden",
    "global_parameters",
    "loss_fn",
    "model_hooks",
    "num_params",
    "split_layers",
]
