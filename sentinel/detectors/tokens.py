"""Token-level evidence: what the pooled signature cannot see.

Every pooled statistic of `distances.py` (per-feature means, moments, sliced quantiles of the token cloud)
is a function of the *multiset* of token vectors: it does not change when a sender reorders its tokens
along the sequence or the batch, exchanges whole sequences or microbatches, or alters a handful of
tokens among hundreds. Three statistics look at tokens one by one (all "larger = more anomalous"):

    token_norm   max_i |x_i| / median_i |x_i|         (few tokens scaled up; measured before clipping)
    align        1 - mean_i cos(y_i - ybar, r_i - rbar)   (the relation between what a stage received and
    align_tail   1 - min_i  cos(y_i - ybar, r_i - rbar)    what it sent, token by token)

For `align`, y is the message and r what its sender received for the same microbatch
(`DetectorEnv.sender_inputs`): the input activation of a forward message, the gradient it received for
a backward message. What it assumes about honest traffic: a transformer stage adds to a residual stream,
h_out = h_in + F(h_in), and back-propagates through it, g_out = g_in + J_F^T g_in, so token i of the
output points, after removing the message's mean token, roughly where token i of its input did (cosine
0.95-0.98 on the built-in model, per stream steady to +-0.01). Any permutation of tokens (sequence,
batch, a sequence or a microbatch exchanged), any replacement (random, constant, stale, another
microbatch's output) and any sign change breaks that token-wise match; `align_tail` sees a few tokens
tampered among many (a single flipped token takes the minimum from ~0.8 to ~-0.9). Not covered: the
first stage's activations (its input is token ids) and the last stage's gradients (it receives no
gradient), and a sender that computes a different residual update F' of the same size (a semantic attack
only recomputation catches: `duplication`, `toploc`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

TOKEN_STATS = ("token_norm", "align", "align_tail")
RELATION_STATS = frozenset({"align", "align_tail"})  # NaN where the sender's input is not available


def token_norm(norms: np.ndarray) -> float:
    """max |x_i| / median |x_i| from `signature`'s (median^2, max^2) of the token norms (1 for a zero message)."""
    med, top = float(norms[0]), float(norms[1])
    if med > 0:
        return math.sqrt(top / med)
    return 1.0 if top == 0 else math.inf


def _tokens(x: torch.Tensor) -> np.ndarray:
    t = x.detach()
    if t.dtype != torch.float32 or t.device.type != "cpu":
        t = t.to("cpu", torch.float32)
    return np.ascontiguousarray(t.numpy().reshape(-1, x.shape[-1]))  # N, C


def relation(payload: torch.Tensor, reference: torch.Tensor | None, out: np.ndarray) -> bool:
    """Writes (align, align_tail) of `payload` against `reference` to `out` (2,); False (out untouched) when
    there is no comparable reference (none, token ids, another shape)."""
    if reference is None or not torch.is_floating_point(reference) or reference.shape != payload.shape:
        return False
    from sentinel.detectors import kernels

    kernels.relation(_tokens(payload), _tokens(reference), out)
    return True


def reference_of(env, msg) -> torch.Tensor | None:
    """What the sender of `msg` received that its output should match token by token: the input activation
    (forward) or the received gradient (backward); None where the backend offers no `sender_inputs`."""
    hook = getattr(env, "sender_inputs", None)
    got = hook(msg) if hook is not None else None
    if got is None:
        return None
    x_in, grad_in = got
    return x_in if int(msg.role) == 0 else grad_in
