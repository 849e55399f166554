"""Per-step training batches and a fixed validation set for one scenario, from a Markov source or text.

Every source gives `vocab`, `optimum_loss` (the best achievable mean next-token loss in nats, or None
when unknown) and `sample`; `Dataset` turns it into `train_batch(step)` -> LongTensor (M, B, T+1) and
a fixed held-out `val_batches()`. A step's batch depends only on (seed, step), so twin runs see the
same data order.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from sentinel.data import tokenizer as tk
from sentinel.data.corpus import decode, read_corpus, split
from sentinel.data.markov import MarkovSource
from sentinel.data.text import TextSource
from sentinel.errors import ConfigError
from sentinel.scenario import Scenario, cross_check


def tokenizer_path(scenario: Scenario) -> str | None:
    """The folder of a `tokenizer: hf` tokenizer: data.tokenizer_path, else the model's checkpoint folder."""
    return scenario.data.tokenizer_path or scenario.model.hf.path


def text_source(scenario: Scenario, cache_dir: Path | None = None) -> TextSource:
    d = scenario.data
    return TextSource(
        d.path,
        scenario.model.seq_len,
        d.val_fraction,
        tokenizer=d.tokenizer,
        text_field=d.text_field,
        seed=scenario.seed,
        bpe_vocab=d.bpe_vocab,
        tokenizer_path=tokenizer_path(scenario),
        cache_dir=cache_dir,
        min_train_tokens=d.batch_size * (scenario.model.seq_len + 1),
    )


class Dataset:
    """Per-step training batches and a fixed validation set for one scenario.

    `cache_dir`: where a trained BPE tokenizer is looked for (and written), e.g. the result folder.
    """

    def __init__(self, scenario: Scenario, cache_dir: Path | None = None):
        d, T = scenario.data, scenario.model.seq_len
        self.seed, self.batch_size, self.microbatches = scenario.seed, d.batch_size, scenario.pipeline.microbatches
        if d.source == "synthetic":
            self.source = MarkovSource(d.vocab, d.order, d.concentration, T, scenario.seed)
        else:
            self.source = text_source(scenario, cache_dir)
        self.vocab = self.source.vocab
        self.optimum_loss = self.source.optimum_loss
        rng = np.random.default_rng([scenario.seed, 0x7A1])
        n_val = d.val_batches * d.batch_size
        val = self._sample(rng, n_val, "val")
        self._val = torch.from_numpy(val).view(d.val_batches, d.batch_size, T + 1)

    def _sample(self, rng: np.random.Generator, n: int, split: str) -> np.ndarray:
        if isinstance(self.source, TextSource):
            return self.source.sample(rng, n, split)
        return self.source.sample(rng, n)

    def train_batch(self, step: int) -> torch.Tensor:
        """LongTensor (M, B, T+1) for this step; depends only on (seed, step)."""
        rng = np.random.default_rng([self.seed, 0x7EA, step])
        x = self._sample(rng, self.microbatches * self.batch_size, "train")
        return torch.from_numpy(x).view(self.microbatches, self.batch_size, -1)

    def val_batches(self) -> torch.Tensor:
        """LongTensor (num_val_batches, B, T+1), fixed for the run."""
        return self._val


def uniform_loss(vocab: int) -> float:
    return math.log(vocab)


def vocab_size(scenario: Scenario) -> int:
    """The data's vocabulary, known without tokenizing: the Markov source's, 256, bpe_vocab, or len(tokenizer)."""
    d = scenario.data
    if d.source == "synthetic":
        return d.vocab
    if d.tokenizer == "bytes":
        return 256
    if d.tokenizer == "bpe":
        return d.bpe_vocab
    return tk.hf_tokenizer(tokenizer_path(scenario)).vocab


def prepare(scenario: Scenario, out_dir: Path) -> None:
    """Train (or find) the scenario's BPE tokenizer and keep it in the result folder, before any run starts."""
    d = scenario.data
    if d.source == "text" and d.tokenizer == "bpe":
        parts = split(read_corpus(d.path, d.text_field), d.val_fraction, scenario.seed, char_boundary=True)
        tk.bpe(decode(parts, read_corpus(d.path, d.text_field).origin)[0], d.bpe_vocab, out_dir)


@cross_check
def check(scenario: Scenario) -> list[tuple[str, str]]:
    """Every located problem with the data section, before any work (a BPE is not trained here: a corpus
    too small once tokenized is reported when the run builds its data, still before training)."""
    d, out = scenario.data, []
    if d.source == "synthetic":
        for key, value, default in (
            ("path", d.path, None),
            ("tokenizer", d.tokenizer, "bytes"),
            ("tokenizer_path", d.tokenizer_path, None),
        ):
            if value != default:
                out.append((f"data.{key}", "only used with data.source: text"))
        if d.vocab**d.order > 2_000_000:
            out.append(
                (
                    "data.order",
                    f"vocab**order = {d.vocab**d.order} Markov contexts is too many "
                    "(max 2,000,000); lower data.vocab or data.order",
                )
            )
        return out
    if d.tokenizer_path is not None and d.tokenizer != "hf":
        out.append(("data.tokenizer_path", f"only used with data.tokenizer: hf (it is {d.tokenizer!r})"))
    if d.tokenizer == "hf" and tokenizer_path(scenario) is None:
        out.append(
            (
                "data.tokenizer_path",
                "required with data.tokenizer: hf: a local tokenizer folder (or set "
                "model.hf.path to a checkpoint folder that holds one)",
            )
        )
    try:
        if d.tokenizer == "bpe":
            tk._import("tokenizers", "data.tokenizer: 'bpe'")
        elif d.tokenizer == "hf" and tokenizer_path(scenario) is not None:
            vocab_size(scenario)
        if d.tokenizer == "bytes":
            text_source(scenario)  # exact: byte tokens are the bytes
        else:
            _check_text(scenario)
    except ConfigError as exc:
        out += [tuple(p.split(": ", 1)) if ": " in p else ("data", p) for p in exc.problems]
    return out


def _check_text(scenario: Scenario) -> None:
    """UTF-8, and a training split that could hold one batch (a byte-level token covers at least a byte)."""
    d, T = scenario.data, scenario.model.seq_len
    corpus = read_corpus(d.path, d.text_field)
    parts = split(corpus, d.val_fraction, scenario.seed, char_boundary=True)
    decode(parts, corpus.origin)
    bound = sum(len(doc) + 1 for doc in parts.train)  # tokens <= bytes (+ one separator per document)
    if bound < d.batch_size * (T + 1):
        raise ConfigError(
            f"data.path: the training split of {corpus.origin} has {bound} bytes, so fewer tokens than the one "
            f"batch it needs (batch_size x (seq_len + 1) = {d.batch_size * (T + 1)}); use a longer corpus, or "
            "a smaller model.seq_len or data.batch_size"
        )
