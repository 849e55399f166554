"""Token-level evidence: what the pooled signature cannot see.

Every pooled statistic of `distances.py` (per-feature means, moments, sliced quantiles of the token cloud)
is a function of the *multiset* of token vectors: it does not change when a sender reorders its tokens
along the sequence or the batch, exchanges whole sequences or microbatches, or alters a handful of
tokens among hundreds. Nine statistics look at tokens one by one, and a tenth relates a whole sparse message to its
sender's input (all "larger = more anomalous"; judged by default: align, align_tail, gain_low, match, gain_centred
(activations), retain and retain_high (gradients), carry (gradients, where the codec drops entries); token_norm and
gain_high on request):

    token_norm   max_i |x_i| / median_i |x_i|         (few tokens scaled up; measured before clipping)
    align        1 - mean_i cos(y_i - ybar, r_i - rbar)   (the relation between what a stage received and
    align_tail   1 - min_i  cos(y_i - ybar, r_i - rbar)    what it sent, token by token)
    gain_low     max_i (m - g_i)    g_i = log(|y_i| / |r_i|), a token's gain from what the sender received to what
    gain_high    max_i (g_i - m)    it sent, m the median gain: a token that lost (shrunk, zeroed) or gained
                 over typical i     magnitude against the message's other tokens, whatever its direction;
                                    gain_high over the tokens that received a typical magnitude only,
                                    |r_i| <= e^0.5 x the median (on squared norms: `kernels.TYPICAL_RECEIVED`)

A direction test cannot see a token scaled by a positive factor: its cosine with its input is unchanged (and a
shrunk token's, after centring, moves little). Its gain does move. Honest gains are lopsided: a stage's backward
pass moves gradient magnitude *onto* a few tokens (g_out = g_in + J^T g_in, J^T summing what later tokens send
back), and these are tokens that already received far more than the others: over all tokens the gain reached e^2.7
on honest byte-level text (e^3.5 on other seeds) and e^2.4 on the realistic Llama, where two gradient tokens scaled
x10 (e^2.3) hid; over the tokens that received at most 1.65x the median (92% of them on text, all but 1 in 2,000 on
the Llama) it stayed at or below e^1.5 (text) and e^0.6 (Llama) per message over its first 80 steps, and 99-100%
of messages with two random tokens scaled x10 stand above every honest one. So gain_high judges those tokens only (a
tampered token that received much more than the others is left to the other statistics). It is judged on request
only: once the Llama trains (steps 60-180 of 200) its honest gain_high outran the windows on both directions and
doubled the clean message FPR. An honest token seldom *loses* magnitude against the others (gain_low <= 0.4 on
gradients of both, <= 1.1 on activations), so gain_low sees tokens shrunk (x 0.05: 3.0) or zeroed (a zero norm
counts as 1e-30: gain_low ~ 69 + log |r_i|). Neither is judged on the first stage (its input is token ids, with no
magnitude to compare).

    gain_centred max_i (m' - g'_i)  g'_i = log(|y_i - ybar| / |r_i - rbar|): gain_low of the centred tokens

A token replaced by the message's mean token (the others shifted so the pooled mean is kept, `token_fade`) is, after
centring, its old centred self scaled by 1 / N (N tokens): its direction is kept, so every cosine is, and where the
tokens share a large mean (a residual stream's activations) its norm as sent barely moves, so gain_low does not see
it either. Its centred gain falls by log N. On held-out Markdown and Debian package bytes (8 layers x 40, 40-token
activation messages) such a token gave gain_centred ~5.1 against honest maxima of 0.2-0.8 per stream, and its
attackers went from 13.5-22 steps to ban (5 of 12 never) to 1 (issue-18 note, stop 42). Judged on activations only
by default (`gradient_skip`): a gradient's mean token is small, so gain_low sees a faded gradient token, while the
centred gains of tokens whose gradient is near the mean one make an honest tail that doubled the gradients' flags.
Not on the first stage.

    retain       max_i (m'' - a_i)  a_i = <y_i, r_i> / |r_i|^2, the share of its own input a token carries on (as
                                    sent, not centred), m'' its median; i over the tokens that received a typical
                                    magnitude (median / TYPICAL_RECEIVED^2 <= |r_i|^2 <= TYPICAL_RECEIVED x median)

A residual stage passes its input on: h_out = h_in + F(h_in) forward, g_out = g_in + J_F^T g_in backward, so a_i = 1 +
<u_i, r_i> / |r_i|^2 for the update u_i it adds. An update roughly orthogonal to the input leaves a_i ~ 1 however
large it is, while it takes the token's cosine with its input down: a gradient token's update is J_F^T g, what later
tokens send back through attention and the MLP, and once a model trains it can be as large as the token's own
gradient, so `align_tail`'s honest tail grows with training. A token whose direction an attacker changes (random
signs, a rotation, another token's vector) carries ~none of its input on: a_i ~ 0. On held-out HTML bytes (6 layers x
48, a 5 x 3 mesh, seed 91, steps 25-70) the honest gradients' align_tail reached maxima of 0.78-1.12 per stream and
a token given random signs sat at 1.04-1.24 (median), within or just beyond that tail; its retain was 1.06-1.27
against honest maxima of 0.35-0.58. A share is a fraction of the input, so shortfalls closer than RETAIN_RESOLUTION
(0.02) are not judged a spread. It was 0.05, from a false ban (held-out Python bytes, 12 x 96, seed 21: a stream's
honest shares sat within 0.02 of each other early in training, and their drift to 0.1-0.3 banned a replica); with
the sequential test's later guards that run bans nobody at 0.02 (FPR 0.14%). At 0.05 the floor, not the honest
spread, set the tail's scale where a deep stage's honest maxima were 0.01-0.07: two gradient tokens turned 45 or 60
degrees (retain ~0.29 and ~0.5, 4-7x the honest maxima) got p ~ 1e-3 per message, and took 21.5 and 9.3 steps to ban
(`generalisation/turn_angles.yaml`, seeds 0-2); at 0.02, 15.5 and 4.7, the clean twins unchanged (stop 46). A token
that received almost nothing has a share made of its update alone, whatever its sign: over every token, retain
raised the activations' honest flags of 40 held-out runs (Markdown and dpkg bytes) from 68 to 102; over the tokens
that received at least 1/e of the median, 66 (issue-18 note, stop 43). Nor is a token that received far more than a typical one (|r_i|^2 above e x the median,
as for gain_high): the loss leans on it, and the stage's own update of it can be several times its input and point
against it. On byte-level text with one layer a stage (4 x 64, the paper mesh) such tokens gave honest shares of -1.7
and -2.6 (|r_i|^2 at 33 and 6.5 x the median) in stage-wide excursions over training steps 25-55, retain up to 4.8 where
its median was 0.07; over the tokens within e x the median the stream's maximum was 1.0 (issue-18 note, stop 44). An
attacker who turns only such tokens is not seen by retain. Judged on gradients only by default (`activation_skip`):
as a model trains, the spread of its activation tokens' shares grows with its residual updates, and in an
asynchronous mesh with stragglers (`compression/attacks_async.yaml`, seed 5) both honest replicas left in a stage
drifted from ~0.15 to 0.3-0.5 within ten steps and one was banned (again with the upper bound: stop 44). Judged on activations too, an activation token turned by 90 degrees
(`token_turn`) on the paper mesh with byte-level text is banned 5.5 steps into an attack from step 10 (20.5
without) and 6.5 into one from step 30 (7 without). Not judged where the codec drops entries (top-k, random masks:
`DetectorEnv.zeroed_roles`): a share is then the overlap of the sender's mask with its input's, and judged there
retain took the message FPR of random masks on byte-level text (4 x 64, seeds 0-1) from 0.05-0.42% to 0.36-1.22%.
Nor where it projects tokens onto a subspace (`DetectorEnv.projected_roles`): a share is then the update seen through
k of d dimensions (honest retain of 1.8-3.0 median and up to 99 under subspace rate 32 on the same text).
Not covered: a token given an update orthogonal to its input (noise, a different residual update of a typical size),
which is what an honest update looks like, and a tampered token that received almost nothing. Not on the first stage.

    retain_high  max_i (a_i - m'')  over the same tokens: a token that carries on more of its own input than the
                                    message's median token

A token scaled up by an attacker keeps its direction, so no cosine moves, and a gradient token's honest gain is
lopsided (`gain_high`, on request only: its honest tail outran the windows once the realistic Llama trained). Its share
of its own input does move, by the factor: two gradient tokens scaled x10 on the built-in text (`wrapped_text.yaml`,
seed 0, open loop) gave retain_high ~9 (median of the tampered messages) against honest maxima of 2.4 and 1.1 on the
two attacked boundaries, where gain_high gave 2.3 against 1.7 and 1.2; they took 43 steps to ban (one attacker of two
never, on two of three seeds) without it. On the realistic Llama (8 x 256, BPE-2048, seed 0) the honest maxima grew
from ~0.1 (steps 6-60) to 0.4-0.75 (steps 120-200) as it trained; gain_high's from ~0.1 to 1.4-1.8; retain's from ~0.1
to 0.3-1.1. Judged on gradients only by default (`activation_skip`, as retain), and not where a codec drops entries or
projects tokens (as retain). Not on the first stage.

    carry        1 - cos(y, r) over the entries both carry   (the whole message against what its sender received, on
                                    the entries where neither is zero; judged only where the codec drops entries)

Where a codec drops entries (top-k, random masks: `DetectorEnv.zeroed_roles`) no token of a message arrives whole:
retain and retain_high are not judged there, a token shares ~q^2 of its entries with its input (q the keep rate) for the
cosines of align and match to compare, and a gradient attacker that flips or scrambles signs was seen by the pooled
distances alone: sign flips on gradients (`compression/paper_gradient.yaml`, synthetic, seeds 0-1) took 12-33 steps to
ban under random masks keeping 10% and 5% (2 of 8 attackers never banned) and 11.5-25.5 under top-k 10%, random signs
6-39 under the masks (3 of 8 never banned) and 23.5-29.5 under top-k 10%.
What a stage passes on survives sparsification where both its input and its output kept an entry: a random mask's kept
entries of a gradient and of the gradient its sender received overlap on ~q^2 of them (82 of 8,192 at q = 0.1, 20 at
0.05; top-k 10%: ~700, its large entries are the same ones on both sides of a residual stage), and there the message
points where its input does. Over those entries the honest cosine sat at a median of 0.6-1.0 per stream (1.00 on
activations), a sign-flipped message at minus its honest self, random signs at ~0: as the share of honest messages at or
below it, a sign-flipped gradient message stood at p < 0.001 (median) at every boundary but one (random masks at q =
0.05 across the first boundary, where a message and its sender's input share ~21 entries: 0.015); random signs at 0.007
and below under q = 0.1 and top-k 10% (open loop, seed 0, issue-18 note, stop 47). Honest messages do sometimes point
against their input there: once in ~250 a stage-wide burst of a huge gradient. The cosine, not a t-statistic of the
products (sum over their root sum of squares): one or two large products dominate each message, and it separated no
better (worse on invisible noise: a median p of 0.2 against 0.004 at q = 0.1). An empty overlap (top-k 1%: most
messages) gives cos 0, a value the stream's windows see often, so it says nothing. Judged on gradients only by default
(`activation_skip`): judged on activations too (`compression/paper_activation.yaml` under the same four codecs, seeds
0-1, 56 runs) it made no measurable difference (steps to ban -0.6 [-1.8, +0.7], message FPR +0.02 [-0.01, +0.05]
points). Only where the codec drops entries, not on the first stage (token ids) nor the last stage's gradients (none
received). Closed loop on the same sweep (56 runs): attackers never banned 10 of 112 -> 4 (the four under top-k 1% with
a bias), steps to ban -2.4 [-3.8, -1.0], message FPR +0.05 [+0.03, +0.08] points, 0 false bans (README, `carry`).

    match        max_i log[(1 - cos(y_i, r_i)) / (1 - max_j cos(y_i, r_j))]   (both centred; j != i over the tokens
                 that received a typical magnitude; each 1 - cos floored at MATCH_FLOOR; i and j over the sampled
                 tokens, and on a message longer than the sample also i over every token, j over its neighbours)

`align_tail` asks whether output token i points where its own input does; `match` asks whether some *other* input
token explains it better. On text a deep stage's neighbouring tokens are alike, so a token overwritten by its
neighbour's output still points roughly where its own input does: on held-out C-header bytes (12 layers x 96, 6 x 4
mesh) one such token per activation message moved align_tail to a median of 0.13-0.39 against an honest 99th
percentile of 0.2-0.72, and the attackers took 17-48 steps to ban (two never were). The neighbour's input explains
it ~10x better than its own (match 3.4-4.5 against honest maxima of 1.2-1.7 on three of the four boundaries). Honest
matches stay low because a stage's residual update is small: a token's own input explains it better than any other
token's, up to near-ties between near-identical tokens (repeated bytes at a shallow stage: honest match up to 1.8
there). Two honest exceptions shaped the definition:
- the ratio, not the difference of the cosines: the difference's honest tail followed the spread of the own cosine,
  and judged by default it flagged 12-13 honest messages per 80-step run against 1-5 for the ratio;
- only inputs of a typical magnitude explain another token (as `gain_high`): a backward pass moves gradient from the
  tokens that received far more than the others onto the tokens they attend to, so an honest output token can point
  where a big receiver's input does (byte-level text, 4 layers: 1 - cos 1.65 to its own input, 0.23 to that of a
  token that received 6.7x the median; match 2.0, flagged). With every input as a candidate the clean message FPR
  of byte-level text on the paper mesh rose from 0.35% to 0.54% over seeds 0-7 (one seed at 1.13%: flags on the
  gradients, cascading once a flagged microbatch was dropped); with typical inputs only, 0.41% (issue-18 note, stop
  33).
Not on the first stage (no input vectors) nor the last stage's gradients (none received). m^2 C multiply-adds per
message, m the sampled tokens (`max_tokens`), at most MATCH_TOKENS of them (with `max_tokens: null`, every k-th); on a
message of N tokens that leaves some out, also N 2 MATCH_REACH C: every token against the inputs of its MATCH_REACH
(4) neighbours on each side (the local match of `kernels.relation`), where a copied token most often comes from. A
copy's token and its source both had to be in the sample before: a quarter of the 256-token messages of a BPE model
(8 layers x 64, a 4 x 4 mesh) under the default `max_tokens`, and a one-token copy from up to three positions back took
11.8 steps to ban on average (seeds 31-38; 4.5-17.5, one attacker never banned); with every token in view, 3.0
(2.0-5.5), and three random tokens 8.6 -> 3.8 (issue-18 note, stop 35).

For `align`, y is the message and r what its sender received for the same microbatch
(`DetectorEnv.sender_inputs`): the input activation of a forward message, the gradient it received for
a backward message. What it assumes about honest traffic: a transformer stage adds to a residual stream,
h_out = h_in + F(h_in), and back-propagates through it, g_out = g_in + J_F^T g_in, so token i of the
output points, after removing the message's mean token, roughly where token i of its input did (cosine
0.95-0.98 on the built-in model, per stream steady to +-0.01). Any permutation of tokens (sequence,
batch, a sequence or a microbatch exchanged), any replacement (random, constant, stale, another
microbatch's output) and any sign change breaks that token-wise match; `align_tail` sees a few tokens
tampered among many (a single flipped token takes the minimum from ~0.8 to ~-0.9). align, align_tail and the gains
read every token of the message (linear in it, as the pooled mean; on the first stage, below, the sampled tokens): a
k-token edit is always in view, however long the message (when they read the tokens the moments sample, every s-th,
an edit was in view with probability ~k / s per message, and the honest messages between drained the sequential
evidence). Not covered: the first stage's activations (its input is token ids) and the last stage's gradients (it receives no
gradient), and a sender that computes a different residual update F' of the same size (a semantic attack
only recomputation catches: `duplication`, `toploc`).

The first stage receives token ids, not vectors: there `align` / `align_tail` compare each sampled output token
(projected on the signature's P sliced-Wasserstein directions) with the running mean output of its input
token id (`IdRelation`, learned from accepted messages), both centred by the stream's running mean token. The
embedding dominates a first stage's output, so a token's output points where its id's usually does (on the
built-in model 1 - cos ~0.003 on the synthetic source, ~0.1 on byte-level text), and a permuted or replaced
token does not (~1). Still not covered: the last stage's gradients.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sentinel.detectors.calibration import LOG_FLOOR
from sentinel.detectors.distances import BLAS_SINGLE_THREAD_MNK as BLOCK
from sentinel.detectors.distances import kernels

GAIN_STATS = ("gain_low", "gain_high")
RETAIN_STATS = ("retain", "retain_high")
CARRY_STATS = ("carry",)  # the whole message against its sender's input, where the codec drops entries (`carry`)
TOKEN_STATS = ("token_norm", "align", "align_tail", *GAIN_STATS, "match", "gain_centred", *RETAIN_STATS, *CARRY_STATS)
NOT_ON_IDS = (*GAIN_STATS, "match", "gain_centred", *RETAIN_STATS, *CARRY_STATS)  # the first stage's input: token ids
RELATION = ("align", "align_tail", *GAIN_STATS, "match", "gain_centred", *RETAIN_STATS)  # what `relation` writes
RELATION_STATS = frozenset((*RELATION, *CARRY_STATS))  # NaN where the sender's input is not available
MATCH_FLOOR = 1e-4  # `match`: a cosine within this of 1 is as good as equal
# `match` is a log ratio, so like a log-scaled statistic (calibration.LOG_FLOOR) it is not judged on a finer scale
# than 1%: where its honest values all sit at 0 (no other token explains any output token better than its own), a
# token explained 1.7% better is not a spread. With the default 1e-12 floor such windows made match 0.017 and 0.046
# p ~ 1e-44 and 1e-120 on a straggler's gradients (16 x 11 async mesh), and two messages banned it.
MATCH_RESOLUTION = LOG_FLOOR
RETAIN_RESOLUTION = 0.02  # `retain` is a share of a token's input: shortfalls closer than 2% of it are not a spread
CARRY_RESOLUTION = 0.02  # `carry` is 1 - a cosine: differences under 0.02 are not a spread
MATCH_TOKENS = 256  # `match` compares every pair of at most this many tokens (the default `max_tokens` is 128)
MATCH_REACH = 4  # ... and, on longer messages, every token with the inputs of this many neighbours on each side


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


def has_reference(payload: torch.Tensor, reference: torch.Tensor | None) -> bool:
    """Whether `reference` is vectors `relation` can compare `payload` with: floating point, of the same shape."""
    return reference is not None and torch.is_floating_point(reference) and reference.shape == payload.shape


def relation(
    payload: torch.Tensor,
    reference: torch.Tensor | None,
    out: np.ndarray,
    max_tokens: int | None = None,
    offset: int = 0,
    skip_zero: bool = False,
) -> bool:
    """Writes (align, align_tail[, gain_low, gain_high[, match[, gain_centred[, retain[, retain_high]]]]]) of
    `payload` against `reference` to `out` (2, 4, 5, 6, 7 or 8 entries); False (out untouched) when there is no
    comparable reference (none, token ids, another shape).
    align, align_tail, the gains, retain and retain_high read every token (N C work); match compares every pair of the tokens the
    signature's moments sample (every s-th from `offset`, s = ceil(N / max_tokens); at most MATCH_TOKENS of them) and,
    when that leaves tokens out, also every token with its MATCH_REACH neighbours on each side (the local match).
    `skip_zero`: tokens exactly zero in the payload or the reference are left out of align, align_tail, the gains
    and retain (traffic whose codec drops tokens whole: `DetectorEnv.zeroed_roles`)."""
    if not has_reference(payload, reference):
        return False
    y, r = _tokens(payload), _tokens(reference)
    n = y.shape[0]
    start, stride, reach = 0, 1, 0
    if out.shape[0] > 4:  # m^2 C work: at most MATCH_TOKENS of the sampled tokens (every k-th of them)
        stride = 1 if max_tokens is None or n <= max_tokens else -(-n // max_tokens)
        m = len(range(offset % stride, n, stride))
        stride *= -(-m // MATCH_TOKENS)
        start = offset % stride
        reach = MATCH_REACH if stride > 1 else 0  # tokens left out of the pairs: each against its neighbours
    local = kernels.relation(y, r, out, skip_zero, start, stride, reach, MATCH_FLOOR, kernels.TYPICAL_RECEIVED, BLOCK)
    if reach:
        out[4] = max(out[4], local)
    return True


def carry(payload: torch.Tensor, reference: torch.Tensor | None) -> float:
    """1 - cos(payload, reference) over the entries where neither is zero (1.0 when there is none); NaN when there is
    no comparable reference (`has_reference`)."""
    if not has_reference(payload, reference):
        return math.nan
    return 1.0 - kernels.kept_cosine(_tokens(payload).reshape(-1), _tokens(reference).reshape(-1))


def match(y: np.ndarray, r: np.ndarray, start: int = 0, stride: int = 1) -> float:
    """max_i log[(1 - cos(y_i, r_i)) / (1 - max_j cos(y_i, r_j))] over rows start, start + stride, ... of the tokens
    y, r (N, C), both centred by their own mean token, j != i over the tokens that received a typical magnitude
    (|r_j|^2 <= `kernels.TYPICAL_RECEIVED` x the median, as sent, not centred: as `gain_high`), each 1 - cos floored
    at MATCH_FLOOR: how many times better some other input token explains output token i than its own input does (0
    with fewer than two tokens of non-zero centred norm)."""
    out = np.empty(5)
    kernels.relation(y, r, out, False, start, stride, 0, MATCH_FLOOR, kernels.TYPICAL_RECEIVED, BLOCK)
    return float(out[4])


def sample_rows(n: int, max_tokens: int | None, offset: int) -> slice:
    """The rows the signature's moments sample: every s-th of n from offset % s, s = ceil(n / max_tokens)."""
    stride = 1 if max_tokens is None or n <= max_tokens else -(-n // max_tokens)
    return slice(offset % stride, None, stride)


def is_token_ids(reference, payload: torch.Tensor) -> bool:
    """Whether the sender's input is token ids for this payload (the first stage): integers of its (B, T) shape."""
    return reference is not None and not torch.is_floating_point(reference) and reference.shape == payload.shape[:-1]


class IdRelation:
    """The first stage's relation to its input token ids: the running mean output (projected) of each token id.

    State: `table` (V, K) and `weight` (V,), plain arrays grown to the largest id seen (at most `MAX_IDS`; larger
    ids are ignored), so table[v] / weight[v] is the bias-corrected exponential mean (decay `beta` per occurrence).
    """

    MAX_IDS = 1 << 20

    def __init__(self, dim: int, beta: float):
        self.beta = beta
        self.table = np.zeros((0, dim))
        self.weight = np.zeros(0)
        self.center = np.zeros(dim + 1)  # the running mean token (bias-corrected by its last entry, a weight)

    def _grow(self, ids: np.ndarray) -> None:
        top = int(ids.max()) + 1 if len(ids) else 0
        if top > len(self.weight) and len(self.weight) < self.MAX_IDS:
            size = min(self.MAX_IDS, max(top, 2 * len(self.weight), 64))
            self.table = np.concatenate([self.table, np.zeros((size - len(self.weight), self.table.shape[1]))])
            self.weight = np.concatenate([self.weight, np.zeros(size - len(self.weight))])

    def judge(self, z: np.ndarray, ids: np.ndarray, out: np.ndarray) -> bool:
        """Writes (align, align_tail) of the projected sampled tokens `z` (m, K) against their ids (m,); False when
        none of the ids was seen before."""
        if self.center[-1] <= 0:
            out[:] = np.nan
            return False
        kernels.id_relation(z, ids, self.table, self.weight, self.center[:-1] / self.center[-1], out)
        return bool(out[0] == out[0])

    def learn(self, z: np.ndarray, ids: np.ndarray) -> None:
        self._grow(ids)
        kernels.id_learn(z, ids, self.table, self.weight, self.center, self.beta)


def reference_of(env, msg) -> torch.Tensor | None:
    """What the sender of `msg` received that its output should match token by token: the input activation or
    token ids (forward), the received gradient (backward); None where the backend offers no `sender_inputs`."""
    got = env.sender_inputs(msg) if env.sender_inputs is not None else None
    if got is None:
        return None
    return got.x if int(msg.role) == 0 else got.grad
