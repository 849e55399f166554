"""A seeded order-k Markov token source whose optimum loss (its entropy rate) is known exactly."""

from __future__ import annotations

import numpy as np


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
