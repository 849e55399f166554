"""A scenario's model before any weight exists: its sizes, its parameter counts, and its problems.

dims(sc)       ModelDims(hidden, layers, vocab, ...): what the transport, detectors and the
               distributed backend need (the boundary tensor is (batch_size, seq_len, hidden))
describe(sc)   parameters (total and per stage), sizes and bytes per boundary message, from a
               model built on the `meta` device (no memory, no initialisation)
check(sc)      located problems of the model section (run by `sentinel validate`)
"""

from __future__ import annotations

from sentinel import data
from sentinel.errors import ConfigError
from sentinel.model import hf_config
from sentinel.model.base import ModelDims, Stage, num_params
from sentinel.model.builtin import ffn_hidden, meta_builtin_stages
from sentinel.scenario import Scenario, cross_check


def dims(sc: Scenario) -> ModelDims:
    """The model's sizes. The vocabulary: model.vocab, else the hf config's or checkpoint's, else the data's."""
    m = sc.model
    if m.source == "builtin":
        return ModelDims(
            source="builtin",
            family="builtin",
            hidden=m.dim,
            layers=m.layers,
            vocab=m.vocab or data.vocab_size(sc),
            seq_len=m.seq_len,
            ffn=ffn_hidden(m),
        )
    _require_hf()
    c = hf_config.resolve_config(m, m.vocab or hf_config.config_vocab(m) or data.vocab_size(sc))
    return ModelDims(
        source="hf",
        family=c.model_type,
        hidden=c.hidden_size,
        layers=c.num_hidden_layers,
        vocab=c.vocab_size,
        seq_len=m.seq_len,
        ffn=getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * c.hidden_size,  # GPT-2: 4 C
        tied=bool(getattr(c, "tie_word_embeddings", False)),
    )


def meta_stages(sc: Scenario) -> list[Stage]:
    """The scenario's stages on the `meta` device: shapes only."""
    d, S = dims(sc), sc.pipeline.stages
    if d.source == "builtin":
        return meta_builtin_stages(sc.model, d.vocab, S)
    from sentinel.model.hf import build_hf_stages  # needs the optional transformers extra

    return build_hf_stages(sc.model, d.vocab, S, sc.seed, device="meta")


def describe(sc: Scenario) -> dict:
    """Parameters (total, per stage), sizes and activation bytes per boundary message, without weights."""
    d = dims(sc)
    stages = meta_stages(sc)
    unique = {id(p): p.numel() for m in stages for _, p in m.global_named_parameters()}
    return {
        "source": d.source,
        "family": d.family,
        "hidden": d.hidden,
        "layers": d.layers,
        "vocab": d.vocab,
        "seq_len": d.seq_len,
        "tied_embeddings": d.tied,
        "params_total": sum(unique.values()),
        "params_per_stage": [num_params([m]) for m in stages],  # a tied head's copy counts in the last stage
        "layers_per_stage": [len(m.decoder_layers()) for m in stages],
        "ffn": d.ffn,  # MLP hidden width
        "activation_bytes_per_message": sc.data.batch_size * d.seq_len * d.hidden * 4,  # float32 (B, T, C)
    }


@cross_check
def check(sc: Scenario) -> list[tuple[str, str]]:
    """Located problems of the model section: sizes for builtin, everything about hf (see hf_config)."""
    m, S = sc.model, sc.pipeline.stages
    try:
        data_vocab = data.vocab_size(sc)
    except ConfigError:
        data_vocab = None  # data.check reports it
    if m.source == "hf":
        out = hf_config.check(m, S, m.seq_len, data_vocab)
        if not out and dims(sc).tied and S > 1 and sc.dp.sync != "allreduce":
            out.append(
                (
                    "dp.sync",
                    f"{sc.dp.sync!r}: the tied embedding (first and last stage) sums its two "
                    "gradients after the stage all-reduce; use dp.sync: allreduce or "
                    "model.hf.config.tie_word_embeddings: false",
                )
            )
        return out
    out = []
    if S > m.layers:
        out.append(
            (
                "pipeline.stages",
                f"{S} stages but model.layers is {m.layers}; "
                f"every stage needs a block: set pipeline.stages <= {m.layers} or raise model.layers",
            )
        )
    if m.dim % m.heads:
        out.append(("model.heads", f"model.dim ({m.dim}) must be divisible by model.heads ({m.heads})"))
    elif (m.dim // m.heads) % 2:
        out.append(("model.heads", f"head size dim/heads = {m.dim // m.heads} must be even for rotary positions"))
    if m.vocab is not None and data_vocab is not None and m.vocab < data_vocab:
        out.append(
            (
                "model.vocab",
                f"{m.vocab} is smaller than the data source's vocabulary ({data_vocab}); raise it or leave it unset",
            )
        )
    return out


def _require_hf() -> None:
    if not hf_config.available():
        raise ConfigError(f"model.source: 'hf' needs the optional transformers extra: {hf_config.INSTALL}")
