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

import math

import numpy as np
import torch

# OpenBLAS computes a matrix product of at most this many multiply-adds (M * N * K) in the calling thread
# (its SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD); a larger one wakes its thread pool (see `signature`).
BLAS_SINGLE_THREAD_MNK = 4 * 65536


class _Kernels:
    """`sentinel.detectors.kernels`, imported on first use: numba loads with the first message a verifier checks, not
    with the package. Its names then become this object's own attributes, so a call is a plain attribute lookup: an
    import statement per call runs importlib's Python code, ~8 us between training operations (issue-18 note,
    stop 40)."""

    def __getattr__(self, name: str):
        from sentinel.detectors import kernels as module

        self.__dict__.update((k, v) for k, v in vars(module).items() if not k.startswith("__"))
        return getattr(module, name)


kernels = _Kernels()

DISTANCES = ("l1", "l2_normalized", "sign_flip_ratio", "sliced_wasserstein", "z_mean", "skewness")
PAPER_DISTANCES = ("l1", "l2_normalized", "sign_flip_ratio", "sliced_wasserstein")
# Magnitudes (positive, right-skewed: they scale with the traffic), as opposed to the bounded sign_flip_ratio
# in [0, 1] and skewness in [0, 2]: `fence_scale: auto` fences these on a log scale. Of the token-level statistics
# (`tokens.py`) token_norm is a magnitude (a ratio of norms); align and align_tail are bounded in [0, 2] (1 - a
# cosine): on a log scale their honest spread near 0 (0.003 to 0.2 on byte-level text) would swamp the step to
# ~1 that a permutation makes.
MAGNITUDES = frozenset({"l1", "l2_normalized", "sliced_wasserstein", "z_mean", "token_norm"})


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
        self._work: dict[int, tuple[np.ndarray, ...]] = {}
        self._layouts: dict[tuple, Layout] = {}

    @property
    def num_projections(self) -> int:
        return self.theta.shape[0]

    def workspace(self, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reused float32 scratch arrays for m sampled tokens: (m, C) the tokens, (m, P) their projections, (m, P) the
        projections sorted along each column (fresh large temporaries cost page faults that dwarf the arithmetic)."""
        if m not in self._work:
            C, P = self.theta.shape[1], self.num_projections
            self._work[m] = tuple(np.empty((m, k), dtype=np.float32) for k in (C, P, P))
        return self._work[m]

    def index(self, n: int) -> np.ndarray:
        """Order-statistic positions of the Q levels in a sorted sample of n values."""
        if n not in self._index:
            self._index[n] = np.clip(np.floor(self.levels * n).astype(np.int64), 0, n - 1)
        return self._index[n]


def signature(
    x: torch.Tensor,
    proj: Projections,
    pooling: str,
    max_tokens: int | None = None,
    offset: int = 0,
    token_clip: float | None = None,
    norms: np.ndarray | None = None,
) -> np.ndarray:
    """Flat float64 signature of one payload of shape (..., C); pure, vectorised, no loop over data in Python.

    Computed on the CPU (the verifier is a CPU relay; a GPU payload is copied over once) in reused
    scratch buffers. The pooled mean uses every token; the higher moments, the slices and the median
    token norm of `token_clip` use every s-th token from `offset` (s = ceil(N / max_tokens)), which bounds
    the cost per message; the caller draws `offset` at random per message so a sender cannot know which
    of its tokens are looked at.
    Layout (see `Layout`): [pooled | skewness of the C features and P slices | sliced quantiles (P*Q)
    | ||pooled||^2]. `norms` (2,), when given, receives the squared median norm of the non-zero sampled
    tokens and the largest squared token norm, before clipping (the `token_norm` statistic, `tokens.py`).

    Token clipping (`token_clip`, winsorising token norms): a token longer than `token_clip` x the median
    norm of the non-zero sampled tokens (the upper median for an even count) is scaled down to that length,
    direction kept, before anything else. What it assumes about honest traffic: the tokens of one message
    have norms of one order of magnitude (dense traffic: the longest token of a microbatch is 2-3x the
    median). Compressed or unstable traffic breaks that (a 95% random mask rescales kept entries 20x, and
    the masked model's own activations and gradients then carry tokens 100-10^6x the median); a handful
    of such tokens would dominate every mean and moment of the signature, so their share is capped. Zero
    tokens (fully masked, or a zeroed message) are left out of the median so they cannot pull the cap down
    to zero.

    Cost: on tensors this size it is the number of calls, not the arithmetic (see `kernels.py`: between
    training operations each call starts cold). The clipping, sampling, pooling, projections and moments
    are one compiled call (`kernels.signature`), the quantiles numpy's sort and one more. Everything runs in
    the calling thread: the checks are many small operations, and threading them costs more than it saves.
    OpenBLAS wakes a thread pool of its own for a product above `BLAS_SINGLE_THREAD_MNK` multiply-adds, and
    its idle threads then busy-wait for a while: with a message every few milliseconds they never rest, and
    they take the cores from the training's torch threads (on a 2-core machine busy with other jobs,
    training with the detector ran 5 to 7 times slower than with OPENBLAS_NUM_THREADS=1). torch's pool is
    no better for work this small: one of its threads preempted by another process stalls the operation
    (~10 ms for a 128 x 128 x 32 product). So the projections are BLAS products in row blocks below the
    threshold.
    """
    return signed(x, proj, pooling, max_tokens, offset, token_clip, norms)[0]


def signed(
    x: torch.Tensor,
    proj: Projections,
    pooling: str,
    max_tokens: int | None = None,
    offset: int = 0,
    token_clip: float | None = None,
    norms: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """`signature`, and the sum of its entries: finite exactly when the payload is (the verifier's NaN / Inf check
    without another pass)."""
    C = x.shape[-1]
    t = x.detach() if x.requires_grad else x
    if t.dtype != torch.float32 or t.device.type != "cpu":
        t = t.to("cpu", torch.float32)
    tokens = t.numpy().reshape(-1, C)  # N, C (a view when possible)
    n = tokens.shape[0]
    stride = 1 if max_tokens is None or n <= max_tokens else -(-n // max_tokens)
    start = offset % stride
    feats, z, ordered = proj.workspace(len(range(start, n, stride)))  # the sampled tokens, their slices, sorted
    sig = np.empty(layout(x.shape, proj, pooling).size)
    if norms is None:
        norms = np.empty(2)
    clip = float(token_clip or 0.0)
    full = pooling == "full"
    kernels.signature(
        tokens, start, stride, clip, full, proj.theta_t, BLAS_SINGLE_THREAD_MNK, feats, z, ordered, sig, norms
    )
    ordered.sort(axis=0)
    total = kernels.finish_signature(ordered, proj.index(len(z)), tokens.size if full else C, sig)
    if not math.isfinite(total) and np.isfinite(tokens).all():
        sig = _rescaled(tokens, x.shape, proj, pooling, max_tokens, offset, token_clip, norms)
        total = float(np.add.reduce(sig))
    return sig, total


def _rescaled(tokens, shape, proj, pooling, max_tokens, offset, token_clip, norms) -> np.ndarray:
    """The signature of a finite payload whose float32 moments overflow (entries past ~1e12: cubes and squares
    exceed float32): computed on the payload scaled by a power of two that brings its largest entry to [0.5, 1),
    then scaled back in float64. A power of two scales float32 values exactly, so this is the signature the
    float32 computation would give with an unbounded exponent; the skewness and the clipping ratios do not
    depend on scale. Honest traffic can be this large (top-k compressed text traffic sent gradients of 1e14
    per entry, issue-18 note, stop 36), so overflow must not read as a NaN / Inf payload (certain evidence)."""
    _, e = np.frexp(np.abs(tokens).max())
    scaled = torch.from_numpy(np.ldexp(tokens, -int(e)).astype(np.float32).reshape(shape))
    sig = signature(scaled, proj, pooling, max_tokens, offset, token_clip, norms)
    L = layout(tuple(shape), proj, pooling)
    sig[L.pooled] = np.ldexp(sig[L.pooled], int(e))
    sig[L.quant] = np.ldexp(sig[L.quant], int(e))
    sig[L.sq_norm] = np.ldexp(sig[L.sq_norm], 2 * int(e))
    if norms is not None:
        norms[:] = np.ldexp(norms, 2 * int(e))
    return sig


def layout(x_shape: tuple[int, ...], proj: Projections, pooling: str) -> Layout:
    """The signature layout of payloads of this shape (built once per shape and pooling)."""
    key = (x_shape, pooling)
    if key not in proj._layouts:
        C = x_shape[-1]
        pooled = C if pooling == "token_mean" else int(np.prod(x_shape))
        P = proj.num_projections
        proj._layouts[key] = Layout(pooled, C + P, P * proj.num_quantiles)
    return proj._layouts[key]


def resolutions(names: tuple[str, ...], lay: Layout) -> np.ndarray:
    """The smallest step each named distance can take on signatures of this layout (0: continuous):
    `sign_flip_ratio` counts features, so it moves in steps of 1 / (pooled length)."""
    pooled = lay.pooled.stop - lay.pooled.start
    return np.array([1.0 / pooled if name == "sign_flip_ratio" else 0.0 for name in names])


def distances(sig: np.ndarray, base, names: tuple[str, ...]) -> np.ndarray:
    """The named distances (in order) between a signature and a `BaselineView` (one compiled pass computes
    all six, `kernels.all_distances`; their definitions are in the module docstring)."""
    L = base.layout
    out = np.empty(len(DISTANCES))
    kernels.all_distances(
        sig,
        (L.pooled.start, L.pooled.stop),
        (L.skew.start, L.skew.stop),
        (L.quant.start, L.quant.stop),
        base.pooled,
        base.pooled_sign,
        base.skew,
        base.skew_norm,
        base.quant,
        base.inv_rms,
        base.inv_var,
        out,
    )
    if names == DISTANCES:
        return out
    return out[[_INDEX[name] for name in names]]  # names are validated by the detector's Config


_INDEX = {name: i for i, name in enumerate(DISTANCES)}
