"""Tokenizers for text corpora: bytes, a byte-level BPE trained on the training split, or a local one.

    bytes   every byte is a token (vocab 256); no dependency
    bpe     byte-level BPE of `data.bpe_vocab` tokens trained with the `tokenizers` library on the
            training split only (offline, deterministic: no randomness is involved), plus one
            `<|endoftext|>` token between documents. Trained once per (training text, settings): the
            JSON is kept in the process and written to the result folder (`tokenizer-bpe-<key>.json`),
            where twins, sweeps' resumed points and resumed runs find it again
    hf      a transformers tokenizer from a local folder (`data.tokenizer_path`, default
            `model.hf.path`), `local_files_only`; its end-of-text token separates documents

`encode(texts)` -> one int64 array per document. The model's vocabulary follows `vocab` unless
`model.vocab` is set: bpe's is the configured size (known before training), hf's is `len(tokenizer)`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from pathlib import Path

import numpy as np

from sentinel.errors import ConfigError

INSTALL = "pip install -e '.[hf]'  (transformers, tokenizers, safetensors)"
EOT = "<|endoftext|>"
BPE_FORMAT = "byte-level-bpe-1"  # part of the cache key: bump it when training changes


class ByteTokenizer:
    name, vocab, eos = "bytes", 256, None
    separator = (10, 10)  # documents joined by a blank line

    def encode(self, docs: list[bytes]) -> list[np.ndarray]:
        return [np.frombuffer(d, dtype=np.uint8).astype(np.int64) for d in docs]


class BPETokenizer:
    """A trained `tokenizers.Tokenizer` (byte-level BPE); `vocab` is the configured size, >= the trained one."""

    name = "bpe"

    def __init__(self, tok, vocab: int, key: str):
        self.tok, self.vocab, self.key = tok, vocab, key
        self.eos = tok.token_to_id(EOT)
        self.separator = (self.eos,)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def save(self, folder: Path) -> Path:
        path = Path(folder) / f"tokenizer-bpe-{self.key}.json"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(self.tok.to_str())
            tmp.replace(path)  # atomic: parallel processes never read half a file
        return path


class HFTokenizer:
    name = "hf"

    def __init__(self, tok):
        self.tok, self.vocab, self.eos = tok, len(tok), tok.eos_token_id
        self.separator = (self.eos,) if self.eos is not None else ()

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        ids = self.tok(texts, add_special_tokens=False)["input_ids"]
        return [np.asarray(x, dtype=np.int64) for x in ids]


# -- BPE ----------------------------------------------------------------------------------------------
_TRAINED: dict[str, str] = {}  # cache key -> tokenizer JSON, for the runs of this process


def bpe_key(train_texts: list[str], vocab: int) -> str:
    h = hashlib.sha256(json.dumps({"format": BPE_FORMAT, "vocab": vocab}).encode())
    for t in train_texts:
        h.update(hashlib.sha256(t.encode("utf-8")).digest())
    return h.hexdigest()[:16]


def bpe(train_texts: list[str], vocab: int, cache_dir: Path | None = None) -> BPETokenizer:
    """The byte-level BPE for this training text: from this process, from `cache_dir`, or trained now."""
    tokenizers = _import("tokenizers", "data.tokenizer: 'bpe'")
    key = bpe_key(train_texts, vocab)
    cached = Path(cache_dir) / f"tokenizer-bpe-{key}.json" if cache_dir is not None else None
    if key not in _TRAINED and cached is not None and cached.is_file():
        _TRAINED[key] = cached.read_text()
    if key not in _TRAINED:
        _TRAINED[key] = _train_bpe(tokenizers, train_texts, vocab).to_str()
    out = BPETokenizer(tokenizers.Tokenizer.from_str(_TRAINED[key]), vocab, key)
    if cache_dir is not None:
        out.save(cache_dir)
    return out


def _train_bpe(tokenizers, texts: list[str], vocab: int):
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOT],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return tok


# -- transformers ---------------------------------------------------------------------------------------
def hf_tokenizer(folder: str) -> HFTokenizer:
    return HFTokenizer(_load_hf(folder))


@functools.lru_cache(maxsize=4)
def _load_hf(folder: str):
    transformers = _import("transformers", "data.tokenizer: 'hf'")
    transformers.logging.set_verbosity_error()
    if not Path(folder).is_dir():
        raise ConfigError(
            f"data.tokenizer_path: {folder!r} is not a folder: give a local tokenizer folder "
            "(tokenizer.json, or vocab.json + merges.txt); tokenizers are never downloaded"
        )
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as exc:
        raise ConfigError(
            f"data.tokenizer_path: cannot load a tokenizer from {folder} ({exc.__class__.__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); it needs "
            "tokenizer.json or vocab.json + merges.txt"
        ) from None


def _import(name: str, where: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ConfigError(f"{where} needs the optional transformers extra: {INSTALL}") from None
