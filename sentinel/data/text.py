"""A tokenized text corpus: training and validation token streams, sampled as random windows.

Each split's documents are tokenized and joined into one stream (separated by the tokenizer's
end-of-text token, or a blank line for bytes); a sequence is a window of seq_len + 1 tokens at a
seeded random offset. The tokenized streams are kept per process, keyed by the corpus and the
settings, so twins and repeated runs of one process tokenize once.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from sentinel.data import tokenizer as tk
from sentinel.data.corpus import Corpus, decode, read_corpus, split
from sentinel.errors import ConfigError

_STREAMS: dict[tuple, tuple[np.ndarray, np.ndarray, int]] = {}  # settings -> (train, val, vocab)


class TextSource:
    """Token windows from a text corpus (`sentinel.data.corpus`) and a tokenizer (`sentinel.data.tokenizer`).

    With the defaults it is today's byte-level source: vocab 256, the tail `val_fraction` of a single
    text held out; with no path it reads Python's bundled documentation (no download).
    """

    def __init__(
        self,
        path: str | None,
        seq_len: int,
        val_fraction: float,
        *,
        tokenizer: str = "bytes",
        text_field: str = "text",
        seed: int = 0,
        bpe_vocab: int = 4096,
        tokenizer_path: str | None = None,
        cache_dir: Path | None = None,
        min_train_tokens: int = 0,
    ):
        self.seq_len, self.optimum_loss = seq_len, None
        corpus = read_corpus(path, text_field)
        key = (_digest(corpus), tokenizer, bpe_vocab, tokenizer_path, val_fraction, seed)
        if key not in _STREAMS:
            if len(_STREAMS) >= 8:
                _STREAMS.pop(next(iter(_STREAMS)))
            _STREAMS[key] = _tokenize(corpus, val_fraction, seed, tokenizer, bpe_vocab, tokenizer_path, cache_dir)
        self.train, self.val, self.vocab = _STREAMS[key]
        need = seq_len + 2
        batch = max(need, min_train_tokens)
        if len(self.train) < batch or len(self.val) < need:
            raise ConfigError(
                f"data.path: {corpus.origin} has {len(self.train)} training and {len(self.val)} validation "
                f"{tokenizer} tokens (data.val_fraction {val_fraction}); the splits each need model.seq_len + 2 = "
                f"{need}, the training split one batch (batch_size x (seq_len + 1) = {batch}); use a longer "
                "corpus, a smaller model.seq_len or data.batch_size, or another data.val_fraction"
            )

    def sample(self, rng: np.random.Generator, n: int, split: str = "train") -> np.ndarray:
        data = self.train if split == "train" else self.val
        starts = rng.integers(0, len(data) - self.seq_len - 1, size=n)
        return np.stack([data[s : s + self.seq_len + 1] for s in starts])


def _digest(corpus: Corpus) -> str:
    h = hashlib.sha256()
    for d in corpus.documents:
        h.update(hashlib.sha256(d).digest())
    return h.hexdigest()


def _tokenize(
    corpus: Corpus,
    val_fraction: float,
    seed: int,
    tokenizer: str,
    bpe_vocab: int,
    tokenizer_path: str | None,
    cache_dir: Path | None,
) -> tuple[np.ndarray, np.ndarray, int]:
    parts = split(corpus, val_fraction, seed, char_boundary=tokenizer != "bytes")
    if tokenizer == "bytes":
        tok, train, val = tk.ByteTokenizer(), list(parts.train), list(parts.val)
    else:
        train, val = decode(parts, corpus.origin)
        tok = tk.bpe(train, bpe_vocab, cache_dir) if tokenizer == "bpe" else tk.hf_tokenizer(tokenizer_path)
    sep = np.asarray(tok.separator, dtype=np.int64)
    return _join(tok.encode(train), sep), _join(tok.encode(val), sep), tok.vocab


def _join(docs: list[np.ndarray], sep: np.ndarray) -> np.ndarray:
    """One stream: doc_0 sep doc_1 sep ... doc_n."""
    pieces = []
    for i, d in enumerate(docs):
        if i:
            pieces.append(sep)
        pieces.append(d)
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
