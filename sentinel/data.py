"""Built-in token sources: a seeded Markov source with a known entropy rate, and local text.

Both give the same interface: `vocab`, `optimum_loss` (the best achievable mean next-token loss in
nats, or None when unknown), `train_batch(step)` -> LongTensor (M, B, T+1), and a fixed held-out
`val_batches()`. A step's batch depends only on (seed, step), so twin runs see the same data order.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from sentinel.errors import ConfigError
from sentinel.scenario import Scenario


class MarkovSource:
    """Order-k Markov chain over `vocab` tokens, transitions drawn from Dirichlet(concentration).

    The chain starts from its stationary distribution, so every position is stationary and the
    optimum loss (the model predicting x_{t+1} from x_0..x_t) is known exactly: the entropy rate
    H(X_k | X_0..X_{k-1}) for targets with a full context, H(X_j | X_0..X_{j-1}) for the first k-1.
    """

    def __init__(self, vocab: int, order: int, concentration: float, seq_len: int, seed: int):
        self.vocab, self.order, self.seq_len = vocab, order, seq_len
        rng = np.random.default_rng([seed, 0xDA7A])
        self.probs = rng.dirichlet(np.full(vocab, concentration), size=vocab**order)  # V^k, V
        self.cdf = np.cumsum(self.probs, axis=1)
        self.cdf[:, -1] = 1.0
        self.stationary = self._stationary()  # V^k context distribution
        self.optimum_loss = self._optimum(seq_len)

    def _stationary(self) -> np.ndarray:
        V, k = self.vocab, self.order
        pi = np.full(V**k, 1.0 / V**k)
        P = self.probs.reshape((V,) * k + (V,))
        for _ in range(2000):  # power iteration over contexts: pi'(x_2..x_{k+1}) = sum_x1 pi(x_1..x_k) P
            new = np.einsum("a...,a...c->...c", pi.reshape((V,) * k), P).reshape(-1)
            if np.abs(new - pi).sum() < 1e-13:
                pi = new
                break
            pi = new
        return pi / pi.sum()

    @staticmethod
    def _entropy(p: np.ndarray) -> float:
        p = p[p > 0]
        return float(-(p * np.log(p)).sum())

    def _optimum(self, seq_len: int) -> float:
        V, k = self.vocab, self.order
        rate = float((self.stationary * -(np.where(self.probs > 0, self.probs * np.log(self.probs), 0)).sum(1)).sum())
        pi = self.stationary.reshape((V,) * k)
        per_pos = []
        for j in range(1, seq_len + 1):  # target x_j given x_0..x_{j-1}
            if j >= k:
                per_pos.append(rate)
            else:  # H(X_0..X_j) - H(X_0..X_{j-1}) from the stationary context marginals
                joint_j = pi.sum(axis=tuple(range(j + 1, k))) if j + 1 < k else pi
                joint_prev = pi.sum(axis=tuple(range(j, k)))
                per_pos.append(self._entropy(joint_j.reshape(-1)) - self._entropy(joint_prev.reshape(-1)))
        return float(np.mean(per_pos))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n sequences of seq_len + 1 tokens."""
        V, k, T = self.vocab, self.order, self.seq_len + 1
        out = np.empty((n, T), dtype=np.int64)
        ctx = rng.choice(V**k, size=n, p=self.stationary)
        for i in range(k):  # unpack the starting context, most significant token first
            out[:, i] = (ctx // V ** (k - 1 - i)) % V
        for t in range(k, T):
            u = rng.random(n)
            nxt = (self.cdf[ctx] < u[:, None]).sum(1)
            out[:, t] = np.minimum(nxt, V - 1)
            ctx = (ctx * V + out[:, t]) % V**k
        return out


class TextSource:
    """Byte-level tokens (vocab 256) from a local text file; the last `val_fraction` is held out.

    With no path it reads Python's own bundled documentation text (`pydoc_data.topics`, ~460 kB),
    so it needs no download.
    """

    def __init__(self, path: str | None, seq_len: int, val_fraction: float):
        if path is None:
            import pydoc_data.topics

            text = "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
            raw = text.encode("utf-8")
        else:
            raw = Path(path).read_bytes()
        self.vocab, self.seq_len, self.optimum_loss = 256, seq_len, None
        data = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
        split = int(len(data) * (1 - val_fraction))
        self.train, self.val = data[:split], data[split:]
        for name, part in (("training", self.train), ("validation", self.val)):
            if len(part) < seq_len + 2:
                raise ConfigError(
                    f"data.path: the {name} split of {path or 'the built-in corpus'} has {len(part)} bytes, "
                    f"fewer than seq_len + 2 = {seq_len + 2}; use a longer file or a smaller model.seq_len"
                )

    def sample(self, rng: np.random.Generator, n: int, split: str = "train") -> np.ndarray:
        data = self.train if split == "train" else self.val
        starts = rng.integers(0, len(data) - self.seq_len - 1, size=n)
        return np.stack([data[s : s + self.seq_len + 1] for s in starts])


class Dataset:
    """Per-step training batches and a fixed validation set for one scenario."""

    def __init__(self, scenario: Scenario):
        d, T = scenario.data, scenario.model.seq_len
        self.seed, self.batch_size, self.microbatches = scenario.seed, d.batch_size, scenario.pipeline.microbatches
        if d.source == "synthetic":
            self.source = MarkovSource(d.vocab, d.order, d.concentration, T, scenario.seed)
        else:
            self.source = TextSource(d.path, T, d.val_fraction)
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
