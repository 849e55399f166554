"""Response policies: what the mesh does with a verdict (the `response` section of a scenario).

    on_flag: drop        the flagged microbatch is dropped from this step (deliver None)
             drop_suspect  dropped only when its sender is already suspect: it sent a flagged message within
                         the last `strike_window` steps, or its sequential evidence (`sequential.py`) stands at
                         DEFER_SHARE of the threshold or above, as of the end of the previous step. A sender's
                         first flag is delivered (it is a strike and evidence like any other); payloads no
                         honest worker sends (`certain`: NaN, Inf, a replay) are always dropped
             substitute  the detector's stand-in is delivered: for SENTINEL, a flagged *gradient* is
                         replaced by its baseline (the EMA of accepted gradients of that stream, as in
                         the paper); an activation has no meaningful statistical stand-in (the
                         receiver would train on a fabricated input), so a flagged activation falls
                         back to drop, as does anything the detector has no stand-in for yet.
                         Duplication-style detectors substitute their trusted recomputation (exact)
             accept      deliver anyway (strikes and bans still apply)

Why `drop_suspect`: an honest flag marks a rare microbatch, and dropping it can cost more than delivering it. On
held-out Perl source (GPT-2, 6 layers x 96, byte-level, a 4 x 4 mesh, seed 352) the honest traffic of steps 15-23
was flagged as the model left its first training phase; one of those flags dropped an activation microbatch at step
15, and that drop alone (forced in a run that drops nothing else) raised step 17's training loss from 3.65 to 4.22,
where dropping one of four other microbatches of steps 14-16 instead moved it by at most 0.004 (not traced further;
likely Adam's second moments, which had not seen what that microbatch carried). Under `drop` the spike drew more
flags (the message FPR 2.1% against 0.97% delivering every flag), the windows learned its values, and attacks that
began at step 20 were judged against those fattened tails: three activation tokens mixed with others took 23-37
steps to ban instead of 1-8. The price of delivering a first flag is one step of an attack that the detector saw: on
the paper table with byte-level text (seeds 0-2) the attackers' first activations reach the later stages, and the
defended runs end +0.026 [+0.015, +0.037] nats above `drop` (bias on activations: 2.5 -> 11 steps to ban; an honest
replica banned 40 steps after a constant attacker, in a run whose message FPR rose to 1.66%). Neither policy
dominates; `drop` stays the default (the README's "What a flag does" has the figures).

Strikes and bans: evidence is weighed against the sender's peers, the other live replicas of its
stage (the **peer test**). For a kind of strike counted over the last `strike_window` steps, with k_w
strikes out of n_w chances for worker w and k_p, n_p the same for one peer p, the pairwise p-value is
P(X >= k_w) for X ~ Hypergeometric(n_w + n_p, k_w + k_p, n_w) (the two-sample conditional test of "w is
struck at p's rate"), and w's p-value is the m-th smallest over its peers, m a strict majority of
them: "w is struck more than most of its peers" (an intersection-union test). A malicious minority
among the peers can then neither hide an attacker nor frame an honest worker, even when it drags the
detector's baseline. With random routing (SWARM) the contamination an attacker spreads downstream
hits every replica of the stage it reaches alike, so it singles out no honest one. A ban needs
p < `ban_pvalue` (and at least `ban_after` strikes). Kinds of evidence:

    hard     flagged messages, per stream (boundary, direction); chances: messages sent in the stream
    soft     flagged or `outlier` messages (between the detector's inner and outer fences), per stream:
             weak one by one, but a sender that keeps producing them more often than its peers is
             singled out (the signature of a subtle, persistent attack)
    certain  payloads no honest worker sends (NaN / Inf / wrong shape / an exact replay of a relayed
             tensor / a mismatch with a trusted recomputation: `certain = 1`); chances: microbatches; tested against Binomial(n_w, max(1e-6, median peer rate))
    route    (`attribution: route`, default) a flag the peer test does not explain (the sender is not
             struck more than its peers, p >= 0.05) is a strike against every other worker on the
             microbatch's route so far, i.e. every worker whose output the flagged tensor depends on:
             for attacks invisible where they are made but visible downstream (a stale activation
             shows up in the gradient the next stage returns). Chances: microbatches taken part in.
             `attribution: sender` is the paper's rule.

    scores   (every SCORE_EVERY steps, per stream) every continuous statistic the detector reports for the
             sender's recent accepted messages against each peer's: one-sided Mann-Whitney U, the same
             majority rule, Bonferroni over the statistics. An attack that shifts every message a little but crosses
             no fence (invisible noise, random signs on a deep boundary) shows here long before it
             shows in counts; a statistic that ignores a poisoned baseline (skewness is a cosine, blind
             to a baseline diluted by the attacker's own learned messages) keeps the gap open. Peers are
             the sender's cohort (`MeshControl.cohort`): an async straggler is compared with stragglers only,
             and under sparse averaging (diverging weights) nobody is score-tested.

A stage with a single live replica has no peers: only its hard and certain strikes count, tested
against Binomial(n_w, base_fpr) (resp. 1e-6). `ban_pvalue: 1` turns the peer test off: plain
"ban_after hard strikes within the window".

    replace_banned       a banned worker is replaced by a fresh honest replica of its stage (BTARD-style;
                         it copies the stage's weights and optimizer state), otherwise its slot stays
                         empty and routing avoids it. A ban that would leave a stage without any live
                         replica is not carried out (the run could not continue)
    rejoin_after: n      n steps after a ban its operator rejoins under a new worker id (Sybil): the
                         engine adds a replica and the adversary layer decides whether it controls it

Every ban records the test that decided it (`eventlog.BAN_RULES`: `sequential`, the CUSUM of `sequential.py`; `hard`, `soft`,
`certain`, `route`, the peer test on that kind of strike; `scores`), as `by` in the mesh event, the event log's `bans`
table and `summary.json`'s `detection.workers.per_worker[].ban_by`.

Bans are decided at the end of a step, from that step's verdicts in canonical order (`Responder.end_step`),
and take effect from the next step: a banned worker's later messages are dropped. In `open_loop` mode the
responder never acts: every payload is delivered and nobody is banned (verdicts are still logged).
It sees verdicts and public routing facts only (through `MeshControl`), never ground truth.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterable

import numpy as np
import torch

from sentinel.detectors.base import Marker, Verdict
from sentinel.detectors.stagewise import sender_stage
from sentinel.detectors.streams import shift_quorum
from sentinel.engine.workers import MeshControl
from sentinel.sequential import ANOMALOUS, DEFER_SHARE, SequentialEvidence
from sentinel.transport.message import Message

EXPLAINED = 0.05  # a flag whose sender the peer test singles out at this level is explained by it
CERTAIN_FLOOR = 1e-6  # honest workers (practically) never send NaN, a wrong shape, or an exact replay
SCORE_EVERY = 3  # steps between two rounds of score tests (their cost is per stream, not per message)
MIN_SCORES = 8  # statistics a sender needs in a stream before its distribution is compared with its peers'


class Attribution:
    """Counts over the last `window` steps: per (kind, key), the steps at which something happened.

    Keys are a worker id or (worker, stream); `forget(worker)` drops every key of a worker.
    """

    def __init__(self, window: int | None):
        self.window = window
        self._q: dict[tuple, collections.deque[int]] = {}

    def add(self, kind: str, key, step: int) -> None:
        q = self._q.get((kind, key))
        if q is None:
            q = self._q[(kind, key)] = collections.deque()
        q.append(step)

    def count(self, kind: str, key, step: int) -> int:
        q = self._q.get((kind, key))
        if q is None:
            return 0
        if self.window is not None:
            while q and q[0] <= step - self.window:
                q.popleft()
        return len(q)

    def forget(self, worker: str) -> None:
        for kind, key in list(self._q):
            if key == worker or (isinstance(key, tuple) and key[0] == worker):
                del self._q[(kind, key)]


def pairwise_pvalues(values: np.ndarray, owner: np.ndarray, groups: int) -> np.ndarray:
    """(statistics, groups, groups) one-sided Mann-Whitney p-values of "group i's values exceed group j's".

    `values` is (n, k): n observations of k statistics, `owner` (n,) their group. U_ij counts the pairs
    (a from i, b from j) with a > b, plus half the pairs with a == b (midranks): one sort per statistic
    and the running count of each group serve every pair (all statistics at once: the counts are
    integers and halves, exact in any order). Normal approximation with continuity and tie correction,
    as `scipy.stats.mannwhitneyu(method="asymptotic")`; NaN counts as the largest value. Ties must be
    split, not broken by position: a statistic that often takes one value (a sign-flip ratio of 0 under
    random masking) would otherwise rank whole groups by the order they were listed in and frame an
    honest sender. The upper tail is `ndtr(-z)`, what `scipy.stats.norm.sf(z)` computes, without its
    per-call argument handling.
    """
    from scipy.special import ndtr  # scipy is imported where used: the ranks that never judge skip its start-up

    z = np.nan_to_num(values.reshape(len(values), -1), nan=np.inf, posinf=np.inf)
    n, k = z.shape
    onehot = np.zeros((n, groups))
    onehot[np.arange(n), owner] = 1.0
    sizes = onehot.sum(axis=0)
    ni, nj = sizes[:, None], sizes[None, :]
    order = np.argsort(z, axis=0, kind="stable")  # n, k
    zs = np.take_along_axis(z, order, axis=0)
    starts = np.ones((n, k), dtype=bool)  # where a block of equal values begins
    starts[1:] = zs[1:] != zs[:-1]
    pos = np.arange(n)[:, None]
    first = np.maximum.accumulate(np.where(starts, pos, 0), axis=0)  # n, k: first position of each one's block
    ends = np.ones((n, k), dtype=bool)
    ends[:-1] = starts[1:]
    last = np.minimum.accumulate(np.where(ends, pos, n - 1)[::-1], axis=0)[::-1]
    ranked = onehot[order.T]  # k, n, groups: the group of each value, per statistic in increasing order
    counts = np.zeros((k, n + 1, groups))
    np.cumsum(ranked, axis=1, out=counts[:, 1:])  # counts[s, p]: members of each group among the first p
    cols = np.arange(k)[:, None]
    below = counts[cols, first.T]  # k, n, groups: members strictly below each value's block
    tied = counts[cols, last.T + 1] - below  # k, n, groups: members of each value's block (itself included)
    u = np.matmul(ranked.transpose(0, 2, 1), below + 0.5 * tied)  # U[s, i, j] (the diagonal is unused)
    blocks = np.where(starts.T[:, :, None], tied, 0.0)  # k, n, groups: each block counted once
    b1, b3 = blocks.sum(axis=1), (blocks**3).sum(axis=1)
    cross = np.matmul((blocks**2).transpose(0, 2, 1), blocks)  # sum over blocks of t_i^2 t_j
    ties = b3[:, :, None] + b3[:, None, :] + 3 * cross + 3 * cross.transpose(0, 2, 1)
    ties -= b1[:, :, None] + b1[:, None, :]  # sum over blocks of (t^3 - t), t = t_i + t_j
    total = ni + nj
    with np.errstate(divide="ignore", invalid="ignore"):
        var = ni * nj / 12.0 * ((total + 1) - np.where(total > 1, ties / (total * (total - 1)), 0.0))
        sd = np.sqrt(np.maximum(var, 0.0))
        p = ndtr(-((u - ni * nj / 2.0 - 0.5) / sd))
    return np.where(sd > 0, p, 1.0)


@functools.lru_cache(maxsize=1 << 16)
def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k), X ~ Binomial(n, p). Cached: scipy.stats' per-call overhead dwarfs the computation, and
    strike counts repeat."""
    from scipy.stats import binom  # where used, like ndtr above

    return float(binom.sf(k - 1, n, p))


@functools.lru_cache(maxsize=1 << 16)
def peer_pvalue(k: int, n: int, k_peers: int, n_peers: int, base_fpr: float) -> float:
    """P(a worker with n chances gets >= k strikes | it is struck like its peers): see the module docstring.
    Cached, like `binom_sf`."""
    from scipy.stats import hypergeom

    n = max(n, k)
    if n_peers <= 0:
        return binom_sf(k, n, base_fpr)
    return float(hypergeom.sf(k - 1, n + n_peers, k + k_peers, n))


def majority_outliers(pvalues: np.ndarray, alpha: float) -> list[int]:
    """Groups significantly above a strict majority of the others on some statistic (Bonferroni over them).

    `pvalues` is (statistics, groups, groups) from `pairwise_pvalues`; for group i and a statistic, the
    intersection-union p-value of "i exceeds a strict majority of the others" is the m-th smallest of
    its pairwise p-values, m = floor((groups - 1) / 2) + 1.
    """
    k, g, _ = pvalues.shape
    m = (g - 1) // 2 + 1
    out = []
    for i in range(g):
        others = np.delete(pvalues[:, i, :], i, axis=1)  # statistics x (g - 1)
        if (np.sort(others, axis=1)[:, m - 1] * k < alpha).any():
            out.append(i)
    return out


class Responder:
    """Turns verdicts into deliveries (per message) and strikes, bans and replacements (per step).

    Two halves, so that verifiers at different boundaries (possibly in different processes) agree:

    - `deliver(msg, verdict, substitute)` runs at the message's verifier and decides what the receiver gets,
      from the verdict and the bans of *earlier* steps only;
    - `end_step(step, records)` runs once per step, after the pipeline and before DP sync, on every verdict of
      the step in canonical order (`canonical_key`): strikes, peer tests, bans and replacements, carried out
      through the `MeshControl` (the response policy's only view of the mesh: worker ids, stages and who is
      live; it holds no event log and no adversary, so ground truth is out of its reach by construction).

    A ban therefore takes effect from the next step (the verifiers of every boundary agree on it before DP
    sync); a banned worker's later messages are dropped.
    """

    def __init__(self, config, mesh: MeshControl, *, mode: str = "closed_loop"):
        self.config, self.mesh, self.mode = config, mesh, mode
        self.attr = Attribution(config.strike_window)
        self.banned: dict[str, int] = {}  # worker -> step of its ban
        self._rejoins: list[tuple[int, int, str]] = []  # (due step, stage, banned worker)
        self._routes: dict[int, list[str]] = {}  # mb -> senders so far, this step
        self._stats: dict[tuple, dict[str, collections.deque]] = {}  # stream -> sender -> (step, statistics)
        self._stat_names: dict[tuple, tuple[str, ...]] = {}  # stream -> the statistics recorded for it
        alpha = getattr(config, "sequential_alpha", None)
        # sentinel/sequential.py: one statistic per worker and direction (activations, gradients)
        self.evidence = SequentialEvidence(alpha, streams=2) if alpha is not None else None
        self._tainted: set[int] = set()  # microbatches of this step with an anomalous message so far
        self._drift: set[tuple[int, int]] = set()  # streams with a stage-wide shift this step (no evidence)
        self._explained: set[tuple[str, int, int]] = set()  # (sender, stream) whose evidence is a drift's (`_drifting`)
        self._pending: list[tuple[str, int, int, float]] = []  # this step's (sender, stage, stream, p) for the evidence
        self._observed: list[tuple[str, int, int, float]] = []  # ... of senders whose evidence a drift explains
        # (worker, stream) whose ban waits for this step's consensus -> the peers that rose while it waited
        self._deferred: dict[tuple[str, int], frozenset[str]] = {}
        self._flagged_at: dict[str, int] = {}  # worker -> the last step it sent a flagged message
        # `drop_suspect`: whose flagged messages are dropped, as of the end of the last step (`_suspect`); every
        # verifier process holds the coordinator's (sentinel/distributed/channels.py: StepEnd)
        self.suspects: frozenset[str] = frozenset()

    def deliver(
        self, msg: Message, verdict: Verdict | None, substitute: Callable[[Message], torch.Tensor | None] | None = None
    ) -> torch.Tensor | None:
        """What the receiver of `msg` gets: its payload, a stand-in (`substitute`), or None (dropped)."""
        if self.mode == "open_loop":
            return msg.payload
        if msg.sender in self.banned:
            return None
        if self.config.on_flag == "accept" or not verdict.flagged:
            return msg.payload
        if self.config.on_flag == "drop_suspect" and not verdict.certain and msg.sender not in self.suspects:
            return msg.payload  # its sender's first flag: delivered (`drop_suspect`, module docstring)
        if self.config.on_flag == "substitute" and substitute is not None:
            return substitute(msg)  # None (= drop) where the detector has no stand-in
        return None

    @property
    def verdict_free(self) -> bool:
        """Whether `deliver` decides without reading the verdict (it may then be called with None)."""
        return self.mode == "open_loop" or self.config.on_flag == "accept"

    def end_step(self, step: int, records: Iterable[tuple[Message, Verdict]]) -> None:
        """Weigh the step's verdicts (canonical order) and ban; then the score tests and rejoins that are due."""
        if self.mode == "open_loop":
            return
        self._routes, self._tainted = {}, set()
        records = list(records)
        # streams where the detector recognised a stage-wide shift this step (honest-majority drift)
        self._drift = {(m.boundary, int(m.role)) for m, v in records if Marker.SHIFT in v.markers}
        self._explained = self._drifting(records)
        if self.evidence is not None:
            self.evidence.begin_step()
        for msg, verdict in records:
            if verdict.judged and msg.sender not in self.banned:  # paused: evidence for or against nobody
                self._record(msg, verdict)
        if self.evidence is not None:  # every peer's evidence of the step is in: the guard does not depend on order
            shifts = {(sender_stage(b, r), r) for b, r in self._drift}  # (sending stage, direction) of each shift
            stages = {stage for _, stage, _, _ in (*self._pending, *self._observed)} | {stage for stage, _ in shifts}
            explained = {(w, r) for w, _, r in self._explained}
            live = {s: self.mesh.live_in_stage(s) for s in stages}
            self.evidence.weigh_step(self._pending, live, shifts, explained, self._observed)
            self._pending, self._observed = [], []
            deferred, self._deferred = self._deferred, {}
            for worker, stream in [*sorted(deferred), *(k for k in self.evidence.due() if k not in deferred)]:
                if worker in self.banned:
                    continue
                peers = self._peers(worker)
                risen = deferred.get((worker, stream))  # None: its ban has not waited
                if risen is None and self.evidence.exceeds(worker, peers, stream):
                    # every ban waits a step: the worker may be the first replica of a wave (unless its stage has
                    # banned as many as its honest majority allows: more evidence first)
                    if self.evidence.reached(worker, stream, self._times(worker)):
                        self._deferred[worker, stream] = frozenset(self.evidence.risen(peers, stream))
                elif risen is not None and self.evidence.alone(peers, stream):
                    # a ban that waited stands on the evidence that reached the threshold, wherever the statistic is
                    # now (a sparse attacker's honest messages drain it): only the stage can clear it
                    drifted = (self.mesh.stage_of(worker), stream) in shifts or (worker, stream) in explained
                    now = risen | set(self.evidence.risen(peers, stream))
                    if drifted or len(now) + 1 >= shift_quorum(len(peers) + 1):
                        # the drift reached it first, or the wave reached the consensus's quorum: not evidence
                        self.evidence.settle([worker, *peers], stream)
                    elif now - risen:
                        self._deferred[worker, stream] = now  # the wave reached another replica: wait on
                    else:
                        self.ban(worker, step, by="sequential")
                elif risen is not None or self.evidence.reached(worker, stream):  # a majority of the stage stood
                    self.evidence.settle([worker, *peers], stream)  # out too: drift, not evidence (sequential.py)
        nxt = step + 1
        if self.config.ban_pvalue < 1.0 and nxt % SCORE_EVERY == 0:
            self._score_tests(nxt)
        self._rejoin_due(nxt)
        if self.config.on_flag == "drop_suspect":
            self._suspect(step, records)

    @staticmethod
    def _drifting(records: list[tuple[Message, Verdict]]) -> set[tuple[str, int, int]]:
        """(sender, boundary, role) whose evidence this step is a drift's: in a stream where the detector recognised a
        stage-wide drift in one statistic (a verdict marked DRIFT), the senders that sent it only accepted messages this
        step. A sender flagged in that stream this step stands beyond what the drift explains (sentinel/sequential.py,
        "drift"), and one that sent nothing there is not part of it."""
        streams = {(m.boundary, int(m.role)) for m, v in records if Marker.DRIFT in v.markers}
        if not streams:
            return set()
        sent, flagged = set(), set()
        for m, v in records:
            key = (m.sender, m.boundary, int(m.role))
            if key[1:] in streams and v.judged:
                (flagged if v.flagged else sent).add(key)
        return sent - flagged

    def _suspect(self, step: int, records: list[tuple[Message, Verdict]]) -> None:
        """`suspects` after `step`: live workers that sent a flagged message within the last `strike_window` steps
        (this one included), or whose sequential statistic in either direction stands at DEFER_SHARE of the
        threshold or above (evidence a ban may follow)."""
        for msg, verdict in records:
            if verdict.flagged:
                self._flagged_at[msg.sender] = step
        window = self.config.strike_window
        recent = [w for w, s in self._flagged_at.items() if window is None or step - s < window]
        rising = []
        if self.evidence is not None:
            floor = DEFER_SHARE * self.evidence.threshold
            rising = [w for (w, _), s in self.evidence.level.items() if s >= floor]
        self.suspects = frozenset(w for w in (*recent, *rising) if w not in self.banned)

    # -- bookkeeping -----------------------------------------------------------------------------
    def _record(self, msg: Message, verdict: Verdict) -> None:
        w, step, stream = msg.sender, msg.step, (msg.boundary, int(msg.role))
        route = self._routes.setdefault(msg.mb_idx, [])
        if w not in route:
            route.append(w)
            self.attr.add("mbs", w, step)
        self.attr.add("msgs", (w, stream), step)
        if verdict.certain:
            self.attr.add("certain", w, step)
            self._judge(w, step, *self._test("certain", "mbs", w, None, step, floor=CERTAIN_FLOOR), by="certain")
        elif verdict.flagged:
            self.attr.add("hard", (w, stream), step)
            k, p = self._test("hard", "msgs", w, stream, step)
            if self.config.attribution == "route" and p >= EXPLAINED and self._peers(w):
                self._route_strike(msg, route, step)
            self._judge(w, step, k, p, by="hard")
        if verdict.flagged or Marker.OUTLIER in verdict.markers:
            self._soft_strike(w, stream, step)
        if not verdict.flagged:  # flagged ones already count as hard strikes
            self._record_stats(stream, w, step, verdict.scores)
        self._sequential(msg, verdict)

    def _sequential(self, msg: Message, verdict: Verdict) -> None:
        """The sender's sequential evidence (sentinel/sequential.py): its message's p-value, or only the part its
        own computation explains (`relation_pvalue`) when an earlier message of the microbatch was anomalous."""
        tainted = msg.mb_idx in self._tainted
        if verdict.flagged or (verdict.pvalue is not None and verdict.pvalue < ANOMALOUS):
            self._tainted.add(msg.mb_idx)
        if self.evidence is None or verdict.certain or msg.sender in self.banned:
            return
        p = verdict.relation_pvalue if tainted else verdict.pvalue
        stream = (msg.boundary, int(msg.role))
        if p is None or stream in self._drift:
            return
        got = (msg.sender, self.mesh.stage_of(msg.sender), int(msg.role), p)
        (self._observed if (msg.sender, *stream) in self._explained else self._pending).append(got)

    def _times(self, worker: str) -> float:
        """How many thresholds the worker's sequential statistic needs for a ban (sentinel/sequential.py, "budget"):
        1 + the bans of its stage that would have to be false if it were malicious too. A stage of R founding
        replicas holds at most max(1, floor((R - 1) / 2)) malicious ones under an honest majority, plus every worker
        added to it since (replacements, rejoins); b bans beyond that less one leave b + 1 - budget of them honest."""
        founders, joined, banned = self.mesh.membership(self.mesh.stage_of(worker))
        budget = max(1, (founders - 1) // 2) + joined
        return 1.0 + max(0, banned + 1 - budget)

    def _peers(self, worker: str) -> list[str]:
        return [w for w in self.mesh.live_in_stage(self.mesh.stage_of(worker)) if w != worker]

    def _test(self, kind: str, denom: str, worker: str, stream, step: int, floor: float | None = None):
        """(strikes, peer-test p-value) of `worker` for strikes of `kind` per `denom` chances.

        The p-value is that of "worker is struck more than a strict majority of its peers", one peer at
        a time (an intersection-union test: the m-th smallest pairwise p-value, m the majority), so a
        malicious minority among the peers can neither hide an attacker nor frame an honest worker.
        """
        a = self.attr

        def key(w):
            return w if stream is None else (w, stream)

        k, n = a.count(kind, key(worker), step), a.count(denom, key(worker), step)
        counts = [(a.count(kind, key(p), step), a.count(denom, key(p), step)) for p in self._peers(worker)]
        counts = [(k_p, n_p) for k_p, n_p in counts if n_p > 0]
        if floor is not None:  # certain evidence: binomial against the peers' median rate, floored
            r0 = max(floor, float(np.median([k_p / n_p for k_p, n_p in counts])) if counts else 0.0)
            return k, binom_sf(k, max(n, k), min(r0, 1.0))
        if not counts:
            return k, peer_pvalue(k, n, 0, 0, self.config.base_fpr)
        pvalues = sorted(peer_pvalue(k, n, k_p, n_p, self.config.base_fpr) for k_p, n_p in counts)
        return k, pvalues[len(counts) // 2]

    def _route_strike(self, msg: Message, route: list[str], step: int) -> None:
        """An unexplained flag: strike every other worker whose output the flagged tensor depends on."""
        for w in route:
            if w != msg.sender and w not in self.banned:
                self.attr.add("route", w, step)
                self._judge(w, step, *self._test("route", "mbs", w, None, step), by="route")

    def _soft_strike(self, worker: str, stream, step: int) -> None:
        """Outliers below the flag threshold: weak evidence, but a sender that keeps producing them
        more often than its peers is singled out by the same test (the subtle attack's signature)."""
        if not self._peers(worker) or self.config.ban_pvalue >= 1.0:
            return
        self.attr.add("soft", (worker, stream), step)
        k, p = self._test("soft", "msgs", worker, stream, step)
        self._judge(worker, step, k, p, by="soft")

    def _record_stats(self, stream, worker: str, step: int, scores: dict) -> None:
        names = self._stat_names.get(stream)
        if names is None:
            names = tuple(sorted(scores))
            if not names:
                return
            self._stat_names[stream] = names
        row = tuple([scores.get(k, np.nan) for k in names])  # an array only when tested (`_score_tests`)
        self._stats.setdefault(stream, {}).setdefault(worker, collections.deque()).append((step, row))

    def _score_tests(self, step: int) -> None:
        """Every few steps: are a sender's statistics stochastically larger than its peers'?

        Per stream and per continuous statistic the detector reports (for SENTINEL: each distance and
        the combined `exceedance`), a one-sided Mann-Whitney U test of the sender's recent accepted
        messages against those of the other senders of the stream (the other replicas of its stage),
        Bonferroni-corrected over the statistics. Far more powerful than counting flags for an attack
        that shifts every message a little and crosses no fence; one ranking per statistic serves every
        sender of the stream. Senders are compared within their cohort (`MeshControl.cohort`): an honest async
        straggler computes with older weights than its peers at every step, a persistent difference this test
        would otherwise single out.
        """
        for senders in self._stats.values():
            recent = {}
            for w, q in senders.items():
                while q and self.config.strike_window is not None and q[0][0] <= step - self.config.strike_window:
                    q.popleft()
                if len(q) >= MIN_SCORES and w not in self.banned:
                    recent[w] = q
            cohorts = collections.defaultdict(list)  # an async straggler is compared with stragglers only
            for w in recent:
                cohorts[self.mesh.cohort(w)].append(w)
            for names in cohorts.values():
                if len(names) < 2:
                    continue
                rows = np.array([r for w in names for _, r in recent[w]], dtype=float)  # messages x statistics
                owner = np.repeat(np.arange(len(names)), [len(recent[w]) for w in names])
                for i in majority_outliers(pairwise_pvalues(rows, owner, len(names)), self.config.ban_pvalue):
                    self.ban(names[i], step, by="scores")

    def _judge(self, worker: str, step: int, strikes: int, pvalue: float, by: str) -> None:
        if worker in self.banned:
            return
        plain = self.config.ban_pvalue >= 1.0
        if (by == "soft" or strikes >= self.config.ban_after) and (plain or pvalue < self.config.ban_pvalue):
            self.ban(worker, step, by=by)

    def ban(self, worker: str, step: int, by: str | None = None) -> bool:
        """Ban `worker` (and replace it when configured); False when the ban was not carried out. `by`: the test
        that decided it (one of `eventlog.BAN_RULES`; None for a ban from outside the responder's tests)."""
        if not self.mesh.ban(worker, step, replace=self.config.replace_banned, by=by):
            return False
        self.banned[worker] = step
        self.attr.forget(worker)
        if self.evidence is not None:
            self.evidence.forget(worker)
        if self.config.rejoin_after is not None:
            self._rejoins.append((step + self.config.rejoin_after, self.mesh.stage_of(worker), worker))
        return True

    def _rejoin_due(self, step: int) -> None:
        while self._rejoins and self._rejoins[0][0] <= step:
            _, stage, old = self._rejoins.pop(0)
            self.mesh.rejoin(stage, old, step)
