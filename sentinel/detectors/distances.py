"""What SENTINEL measures on a message: a pooled signature, and distances to the stream's baseline.

A message payload x has shape (..., C): B x T tokens of C features. Its **signature** holds

- `pooled`: the per-feature mean over tokens, (C,)  [pooling `token_mean`], or x flattened [`full`];
- `skew`: the standardised third moment over tokens of each of the C features and of each of the P
  slices below, (C + P,): kappa = E[d^3] / E[d^2]^1.5, d = value - mean. Odd in x: a sign flip negates
  it; the slices add mixed third moments the per-feature ones miss;
- `quant`: quantile functions of the token cloud projected on P fixed random unit directions,
  (P, Q): the 1-D marginals that sliced Wasserstein compares.

The **baseline** of a stream is the bias-corrected EMA of signatures (see `baseline.Baseline`); an EMA
of quantile functions is the 1-D Wasserstein barycenter, so comparing quantiles is exact W1.

Distances, each "larger = more anomalous":
    l1                 mean_f |p_f - mu_f|                              (paper: mean absolute difference)
    l2_normalized      ||p - mu||_2 / sqrt(EMA ||p||^2)                 (scale-free normalised L2)
    sign_flip_ratio    mean_f [sign p_f != sign mu_f]                   (paper)
    sliced_wasserstein mean_{q,j} |Q_x(q; theta_j) - Qbar(q; theta_j)|   (paper; token cloud, W1 per slice)
    z_mean             sqrt(mean_f (p_f - mu_f)^2 / var_f)              (ours: per-feature standardised shift)
    skewness           1 - cos(kappa, kappa_bar)                         (ours: sign of the odd moments)

Why the last two (the paper's misses): the per-feature mean of a backward gradient is almost
zero-mean noise (its cosine with the EMA is ~0.1 in our runs), so the mean-pooled distances (l1, l2,
sign ratio) cannot tell g from -g, and the sliced distance only sees the flip through the asymmetry of
the token distribution. The softmax cross-entropy makes gradients strongly *skewed* per feature
(dL/dlogits = p - onehot), consistently across microbatches (cosine ~0.5 with the EMA), and kappa(-g) =
-kappa(g): `skewness` sees a sign flip as a cosine of ~-0.5, random sign flips as ~0. A small bias
b added to every coordinate hides inside l1 / l2 when a few features have large natural fluctuations;
`z_mean` divides each feature's shift by that feature's own spread, so the bias counts in every
quiet feature.
"""

from __future__ import annotations

import numpy as np
import torch

DISTANCES = ("l1", "l2_normalized", "sign_flip_ratio", "sliced_wasserstein", "z_mean", "skewness")
PAPER_DISTANCES = ("l1", "l2_normalized", "sign_flip_ratio", "sliced_wasserstein")


class Layout:
    """Where each part of a signature lives in one flat vector (so an EMA update is two ops)."""

    def __init__(self, pooled: int, dim: int, num_quant: int):
        self.pooled = slice(0, pooled)
        self.skew = slice(pooled, pooled + dim)
        self.quant = slice(pooled + dim, pooled + dim + num_quant)
        self.sq_norm = pooled + dim + num_quant
        self.size = self.sq_norm + 1


class Projections:
    """The sliced-Wasserstein slices: P random unit directions (drawn once from the seed) and Q levels."""

    def __init__(self, dim: int, num_projections: int, num_quantiles: int, seed: int):
        gen = torch.Generator().manual_seed(int(seed))
        theta = torch.randn(num_projections, dim, generator=gen)
        self.theta = (theta / theta.norm(dim=1, keepdim=True)).numpy().astype(np.float32)  # P, C
        self.theta_t = np.ascontiguousarray(self.theta.T)  # C, P
        self.levels = (np.arange(num_quantiles) + 0.5) / num_quantiles
        self.num_quantiles = num_quantiles
        self._index: dict[int, np.ndarray] = {}
        self._work: dict[tuple, np.ndarray] = {}

    @property
    def num_projections(self) -> int:
        return self.theta.shape[0]

    def workspace(self, shape: tuple[int, int], slot: int) -> np.ndarray:
        """A reused float32 scratch array (fresh large temporaries cost page faults that dwarf the arithmetic)."""
        key = (shape, slot)
        if key not in self._work:
            self._work[key] = np.empty(shape, dtype=np.float32)
        return self._work[key]

    def ones(self, n: int) -> np.ndarray:
        key = ((n,), -1)
        if key not in self._work:
            self._work[key] = np.ones(n, dtype=np.float32)
        return self._work[key]

    def index(self, n: int) -> np.ndarray:
        """Order-statistic positions of the Q levels in a sorted sample of n values."""
        if n not in self._index:
            self._index[n] = np.clip(np.floor(self.levels * n).astype(np.int64), 0, n - 1)
        return self._index[n]


def signature(x: torch.Tensor, proj: Projections, pooling: str, max_tokens: int | None = None,
              offset: int = 0) -> np.ndarray:
    """Flat float64 signature of one payload of shape (..., C); pure, vectorised, no loop over data.

    Computed on the CPU (the verifier is a CPU relay; a GPU payload is copied over once) with numpy in
    reused scratch buffers: on tensors this size the cost is the number of operations, not arithmetic.
    The pooled mean uses every token; the higher moments and the slices use every s-th token from
    `offset` (s = ceil(N / max_tokens)), which bounds the cost per message; the caller draws `offset`
    at random per message so a sender cannot know which of its tokens are looked at.
    Layout (see `Layout`): [pooled | skewness of the C features and P slices | sliced quantiles (P*Q)
    | ||pooled||^2].
    """
    C = x.shape[-1]
    tokens = x.detach().reshape(-1, C).to("cpu", torch.float32).numpy()  # N, C (a view when possible)
    n = tokens.shape[0]
    stride = 1 if max_tokens is None or n <= max_tokens else -(-n // max_tokens)
    sample = tokens[offset % stride :: stride]
    m = sample.shape[0]
    both = proj.workspace((m, C + proj.num_projections), 0)  # features and slices share the moment code
    both[:, :C] = sample
    both[:, C:] = sample @ proj.theta_t  # the token cloud along each direction
    mean = both.mean(axis=0)
    d = np.subtract(both, mean, out=proj.workspace(both.shape, 1))
    d2 = np.multiply(d, d, out=proj.workspace(both.shape, 2))
    m2 = d2.mean(axis=0)
    skew = np.multiply(d2, d, out=d2).mean(axis=0) / np.maximum(m2 * np.sqrt(m2), 1e-30)  # 0 if constant
    quant = np.sort(both[:, C:], axis=0)[proj.index(m)].T  # P, Q
    if pooling == "full":
        pooled = tokens.reshape(-1)
    elif stride == 1:
        pooled = mean[:C]
    else:
        pooled = proj.ones(n) @ tokens / n  # every token (a BLAS gemv)
    pooled = pooled.astype(np.float64)
    return np.concatenate((pooled, skew, quant.reshape(-1), [pooled @ pooled]))


def layout(x_shape: tuple[int, ...], proj: Projections, pooling: str) -> Layout:
    C = x_shape[-1]
    pooled = C if pooling == "token_mean" else int(np.prod(x_shape))
    P = proj.num_projections
    return Layout(pooled, C + P, P * proj.num_quantiles)


def distances(sig: np.ndarray, base, names: tuple[str, ...]) -> np.ndarray:
    """The named distances (in order) between a signature and a `BaselineView`."""
    L = base.layout
    p = sig[L.pooled]
    diff = p - base.pooled
    out = np.empty(len(names))
    for i, name in enumerate(names):
        if name == "l1":
            out[i] = np.abs(diff).mean()
        elif name == "l2_normalized":
            out[i] = np.sqrt(diff @ diff) * base.inv_rms
        elif name == "sign_flip_ratio":
            out[i] = (np.sign(p) != base.pooled_sign).mean()
        elif name == "sliced_wasserstein":
            out[i] = np.abs(sig[L.quant] - base.quant).mean()
        elif name == "z_mean":
            out[i] = np.sqrt((diff * diff * base.inv_var).mean())
        elif name == "skewness":
            s = sig[L.skew]
            out[i] = 1.0 - (s @ base.skew) / max(np.sqrt(s @ s) * base.skew_norm, 1e-30)
        else:  # names are validated by the detector's Config
            raise KeyError(name)
    return out
