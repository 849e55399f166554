"""Transformers configs for `model.source: hf`: resolve them, and check a scenario's before any work.

`resolve_config(cfg, vocab)` gives the config a model is built from: `model.hf.config` (a mapping with
`model_type` and that family's keys) through `AutoConfig.for_model`, or a local folder's config.json
(`local_files_only`; never the hub). Dropout is forced to 0 and the KV cache off. `check(sc, data_vocab)`
returns every located problem: the missing extra, unknown families and keys, configs the family
rejects, checkpoints without config.json or with missing or mismatched safetensors weights (read from
the files' headers: no tensor is loaded).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

import torch

from sentinel.model.hf_families import FAMILIES
from sentinel.registry import did_you_mean
from sentinel.scenario import ModelConfig

INSTALL = "pip install -e '.[hf]'  (transformers, tokenizers, safetensors)"
SUPPORTED = ", ".join(sorted(FAMILIES))
BUILTIN_ONLY = ("layers", "dim", "heads", "ffn_hidden")  # builtin-model keys that mean nothing with source: hf


def available() -> bool:
    """Whether the [hf] extra is installed (without importing transformers: the builtin path stays light)."""
    return importlib.util.find_spec("transformers") is not None


@functools.lru_cache(maxsize=1)
def _auto():
    """(AutoConfig, AutoModelForCausalLM), imported on first use: transformers takes seconds to import."""
    import transformers

    transformers.logging.set_verbosity_error()  # no notes about generation defaults or token ids out of range
    return transformers.AutoConfig, transformers.AutoModelForCausalLM


def resolve_config(cfg: ModelConfig, vocab: int | None):
    """The transformers config to build from (a fresh copy: callers may change it)."""
    hf = cfg.hf
    key = json.dumps(hf.config, sort_keys=True, default=str) if hf.config is not None else None
    return copy.deepcopy(_resolve(key, hf.path, hf.attn_implementation, vocab))


@functools.lru_cache(maxsize=16)
def _resolve(config_json: str | None, path: str | None, attn: str, vocab: int | None):
    if path is not None:
        config = _auto()[0].from_pretrained(path, local_files_only=True)
    else:
        kw = json.loads(config_json)
        model_type = kw.pop("model_type")
        if "vocab_size" not in kw and vocab is not None:
            kw["vocab_size"] = vocab
        config = _auto()[0].for_model(model_type, **kw)
    for key in FAMILIES[config.model_type].dropouts:
        setattr(config, key, 0.0)
    config.use_cache = False
    config._attn_implementation = attn
    return config


def config_vocab(cfg: ModelConfig) -> int | None:
    """The vocabulary the hf section fixes (its `vocab_size`, or the checkpoint's), else None."""
    if cfg.hf.config is not None:
        return cfg.hf.config.get("vocab_size")
    if cfg.hf.path is not None:
        return read_config_json(cfg.hf.path).get("vocab_size")
    return None


def read_config_json(path: str) -> dict[str, Any]:
    """config.json of a checkpoint folder as a mapping ({} when unreadable: `check` reports why)."""
    try:
        data = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# -- checks -------------------------------------------------------------------------------------------
def check(cfg: ModelConfig, num_stages: int, seq_len: int, data_vocab: int | None) -> list[tuple[str, str]]:
    """Every problem with an hf model section, located; [] when it builds."""
    if not available():
        return [("model.source", f"'hf' needs the optional transformers extra: {INSTALL}")]
    hf, out = cfg.hf, []
    defaults = ModelConfig()
    for key in BUILTIN_ONLY:
        if getattr(cfg, key) != getattr(defaults, key):
            out.append(
                (
                    f"model.{key}",
                    f"{getattr(cfg, key)!r} is a builtin-model key; with model.source: hf the "
                    "architecture comes from model.hf (e.g. hidden_size, num_hidden_layers): remove it",
                )
            )
    if (hf.config is None) == (hf.path is None):
        return out + [
            (
                "model.hf",
                "give exactly one of model.hf.config (a transformers config, random init) or "
                "model.hf.path (a local checkpoint folder)",
            )
        ]
    problems = _check_mapping(hf.config) if hf.config is not None else _check_folder(hf.path)
    if problems:
        return out + problems
    where = "model.hf.config" if hf.config is not None else f"model.hf.path: {hf.path}/config.json"
    fixed = config_vocab(cfg)
    if cfg.vocab is not None and fixed is not None and cfg.vocab != fixed:
        out.append(("model.vocab", f"{cfg.vocab} but {where} sets vocab_size {fixed}: remove one of them"))
    vocab = cfg.vocab or fixed or data_vocab
    try:
        config = resolve_config(cfg, vocab)
        with torch.device("meta"):
            _auto()[1].from_config(config)
    except Exception as exc:  # the family's own validation: heads vs hidden size, layer types, ...
        return out + [(where.split(":")[0], f"the {_model_type(cfg)} family rejects this config: {_first_line(exc)}")]
    out += _check_sizes(config, where, num_stages, seq_len, data_vocab)
    if hf.path is not None:
        out += check_weights(hf.path, config)
    return out


def _check_mapping(mapping: dict[str, Any]) -> list[tuple[str, str]]:
    model_type = mapping.get("model_type")
    if not isinstance(model_type, str):
        return [("model.hf.config.model_type", f"required: one of {SUPPORTED}")]
    problems = _check_family(model_type, "model.hf.config.model_type")
    if problems:
        return problems
    auto_config = _auto()[0]
    cls = type(auto_config.for_model(model_type))
    known = {f.name for f in dataclasses.fields(cls)} | set(cls.attribute_map) | {"model_type"}
    other = {k: v for k, v in mapping.items() if k not in known}
    try:  # a key transformers stores verbatim is a typo; a legacy key it converts (rope_theta) is not
        stored = auto_config.for_model(model_type, **other).to_dict()
    except Exception:
        stored = other
    out = [
        (f"model.hf.config.{k}", f"unknown key for {model_type}{did_you_mean(k, sorted(known))}")
        for k in other
        if k in stored
    ]
    for key in FAMILIES[model_type].dropouts:
        if mapping.get(key, 0) not in (0, 0.0):
            out.append(
                (
                    f"model.hf.config.{key}",
                    f"{mapping[key]!r}: dropout must be 0 (runs are deterministic; "
                    "sentinel sets it to 0): remove the key",
                )
            )
    return out


def _check_family(model_type: str, where: str) -> list[tuple[str, str]]:
    if model_type in FAMILIES:
        return []
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type in CONFIG_MAPPING:
        return [
            (
                where,
                f"{model_type!r} is a transformers model sentinel does not split into stages yet; "
                f"supported: {SUPPORTED}",
            )
        ]
    return [
        (
            where,
            f"unknown model_type {model_type!r}{did_you_mean(model_type, sorted(FAMILIES))}; supported: {SUPPORTED}",
        )
    ]


def _check_folder(path: str) -> list[tuple[str, str]]:
    folder = Path(path)
    if not folder.is_dir():
        return [
            (
                "model.hf.path",
                f"{path!r} is not a folder: give a local checkpoint folder (config.json + "
                "*.safetensors); models are never downloaded",
            )
        ]
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        return [
            (
                "model.hf.path",
                f"{path}: no config.json; a checkpoint folder holds config.json and *.safetensors "
                "(save one with model.save_pretrained(folder))",
            )
        ]
    try:
        data = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return [("model.hf.path", f"{cfg_file}: unreadable config ({_first_line(exc)})")]
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if not isinstance(model_type, str):
        return [("model.hf.path", f"{cfg_file}: no model_type; supported: {SUPPORTED}")]
    return _check_family(model_type, f"model.hf.path: {cfg_file}: model_type")


def _check_sizes(config, where: str, num_stages: int, seq_len: int, data_vocab: int | None) -> list[tuple[str, str]]:
    out = []
    layers = config.num_hidden_layers
    if num_stages > layers:
        out.append(
            (
                "pipeline.stages",
                f"{num_stages} stages but the model has {layers} decoder layers ({where}); "
                f"every stage needs one: set pipeline.stages <= {layers}",
            )
        )
    if data_vocab is not None and data_vocab > config.vocab_size:
        out.append(
            (
                "data.tokenizer",
                f"the tokenizer's vocabulary ({data_vocab}) exceeds the model's vocab_size "
                f"({config.vocab_size}, {where}): use a smaller tokenizer or a model with a larger vocabulary",
            )
        )
    if config.model_type == "gpt2" and seq_len > config.n_positions:
        out.append(
            (
                "model.seq_len",
                f"{seq_len} exceeds the model's learned positions (n_positions "
                f"{config.n_positions}, {where}): lower model.seq_len",
            )
        )
    return out


def check_weights(path: str, config) -> list[tuple[str, str]]:
    """Missing or mismatched weights, from the safetensors headers (names and shapes; nothing loaded)."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in Path(path).glob("*.bin"))
        extra = (
            f" ({', '.join(pickled)} are pickle files, which sentinel never loads: convert them to safetensors)"
            if pickled
            else ""
        )
        return [("model.hf.path", f"{path}: no *.safetensors weights{extra}")]
    found: dict[str, tuple[int, ...]] = {}
    try:
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    found[k] = tuple(st.get_slice(k).get_shape())
    except Exception as exc:
        return [("model.hf.path", f"{path}: unreadable safetensors file ({_first_line(exc)})")]
    with torch.device("meta"):
        model = _auto()[1].from_config(config)
    prefix = model.base_model_prefix + "."
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    missing, mismatched = [], []
    for name, p in model.state_dict().items():  # a tied head is listed under both names
        shape = found.get(name, found.get(name.removeprefix(prefix)))
        if shape is None:
            if not (tied and name == "lm_head.weight"):
                missing.append(name)
        elif shape != tuple(p.shape):
            mismatched.append(f"{name} {list(shape)} (config wants {list(p.shape)})")
    out = []
    if missing:
        out.append(
            (
                "model.hf.path",
                f"{path}: {len(missing)} weights missing from the safetensors files, e.g. "
                f"{', '.join(missing[:3])}: the checkpoint does not match its config.json",
            )
        )
    if mismatched:
        out.append(
            (
                "model.hf.path",
                f"{path}: {len(mismatched)} weights have the wrong shape, e.g. "
                f"{'; '.join(mismatched[:3])}: the checkpoint does not match its config.json",
            )
        )
    return out


def _model_type(cfg: ModelConfig) -> str:
    if cfg.hf.config is not None:
        return str(cfg.hf.config.get("model_type"))
    return str(read_config_json(cfg.hf.path).get("model_type"))


def _first_line(exc: BaseException) -> str:
    """The cause's message, one line (transformers wraps its validators' errors)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    return text[0] if text else exc.__class__.__name__
