"""Self-calibrated tail probabilities: each statistic's honest distribution, learned per stream, as p-values.

Why: a fixed fence (Tukey's Q3 + k IQR) assumes a tail shape. Honest statistics are heavy-tailed, and how
heavy depends on the data, the model and the training phase: with the same k the honest flag rate was
0.14% on the synthetic source and 1.3-6.7% on byte-level text. A tail probability that is right on any
data needs the tail itself to be estimated, from honest traffic, per stream.

How (peaks over threshold, Pickands-Balkema-de Haan; SPOT, Siffer et al., KDD 2017): over a sliding window
of the last `window` accepted values of a statistic (on its log scale for the magnitudes), let u be the
window's `q0` quantile (0.8) and fit a generalised Pareto law to the window's excesses over u by the method
of moments (shape xi = (1 - mean^2 / var) / 2 clipped to [0, 0.5], scale beta = mean (1 - xi)). A new
value t gets

    p(t) = (1 - q0) * (1 + xi (t - u) / beta)^(-1 / xi)   if t > u    (exp(-(t - u) / beta) at xi = 0)
    p(t) = (1 + #{window values >= t}) / (n + 1)          otherwise   (the empirical rank)

Two horizons (`recent`, 60 values by default): a value beyond the window's q0 quantile gets the larger of its tail
probability under the window and under the window's `recent` latest values (the same fit on those). A window of
200 spans ~30 steps of a stream that carries 6 messages a step; when a model's training phase moves its traffic
faster than that, new honest values land beyond the window's tail far more often than a stationary stream's would
(in a 12-layer byte-level model's steps 35-60, a new window maximum 3-4x as often as exchangeable values give, ~1x
against the last 30-60 values), and the honest flag rate rose to 1.6-1.9%. The recent values say where the stream
is now; the larger of two valid p-values is still valid (conservative), and on a stationary stream the two agree
up to the recent fit's noise. An attacker's values reach the recent window only as accepted (and capped) values,
as they reach the window.

Whose values: a stream's window pools the replicas of the sending stage, so an accepted attacker teaches it its own
values, a third of a 3-replica stage's traffic, more than the top 1 - Q0 share the tail is fitted to. Each sender is
judged against windows that every sender but itself taught (`SenderWindows`), where at least three live replicas of
its stage are exchangeable with it (an async straggler, or a replica whose weights diverge, keeps the pooled windows,
which hold its own values too).

The tail's scale and heaviness come from the data, not from a constant: an exponential tail (xi = 0) on the
log of a positive statistic covers log-normal-like magnitudes; xi > 0 covers power-law-like tails of the
bounded statistics (a single shape would not: an exponential tail alone put P(p < 1e-3) at 5x nominal on a
Student-t(3) stream, and the align statistic's honest tail at 3x). Measured on honest traffic (8 runs:
synthetic and byte-level text, two model sizes, 9 statistics, 9,600 messages; a held-out set in the issue
note): P(p < a) / a = 0.94, 0.65, 1.5, 3.8 at a = 1e-2, 1e-3, 1e-4, 1e-5, every statistic <= 1.1 at 1e-3
(a Gaussian z on the same robust scale: 3.6, 20, 132, 939; the Tukey fence at k = 4: an exceedance rate of
0.44% per statistic).

Combination (one decision from all the evidence): the message's p-value is Bonferroni's min_i(D p_i),
valid whatever the dependence between the D statistics (the pooled distances are strongly correlated, so
Fisher's product would not be), and a statistic that alone separates an attack counts in full. The
detector flags when the message's evidence -log10(p) exceeds `level` (3: a false-alarm probability of
1e-3 per message per stream, i.e. ARL0 = 1000 / M steps with M messages per step in the stream).

The windows are kept sorted (insertion per accepted message, `kernels.window_insert`), so each message costs
one compiled pass over the top 20% of each window.
"""

from __future__ import annotations

import copy

import numpy as np

from sentinel.detectors.distances import kernels

Q0 = 0.8  # the tail starts at the window's 80th percentile: ~20 exceedances in a window of 100 to fit its scale
MAX_SHAPE = 0.5  # the heaviest tail the fit may choose (xi = 0.5: a power law of exponent 2; finite mean)
LOG_FLOOR = 0.01  # smallest tail scale on a log scale (values within 1% of each other are not a spread)
CAP_P = 1e-3  # an accepted message's statistic this far out on its own is learned capped (`push_judged`)


def below_cap(p: np.ndarray) -> bool:
    """(p < CAP_P).any(), in builtins: between training operations numpy's calls cost more than the comparison."""
    return any(map(CAP_P.__gt__, p.tolist()))


class TailCalibrator:
    """Per-statistic tail probabilities over a sliding window of accepted values (see the module docstring).

    Args:
        names: the statistics, in the order values are given.
        window: accepted values kept per statistic.
        log: per statistic, whether it is judged on its logarithm (positive magnitudes).
        resolution: per statistic, the smallest step it can take (0: continuous); floors the tail scale.
    """

    def __init__(self, names: tuple[str, ...], window: int, log: tuple[bool, ...], resolution=None, recent: int = 0):
        self.names, self.window, self.recent = names, window, recent
        self.log = np.asarray(log, dtype=bool)
        self._any_log = bool(self.log.any())
        D = len(names)
        self._sorted = np.zeros((D, window))  # each row: the window's values in increasing order (first `count`)
        self._ring = np.zeros((window, D))  # the same values in arrival order (which one leaves next)
        self._pos = 0
        self.count = 0
        self.pushed = 0  # values learned, ever
        self.last_p = np.ones(D)  # the latest judged message's per-statistic tail probabilities
        self.set_resolution(np.zeros(D) if resolution is None else resolution)

    def set_resolution(self, resolution) -> None:
        """Floor each tail scale: LOG_FLOOR on a log scale, the statistic's resolution (e.g. one flipped feature
        of `sign_flip_ratio`) on a linear one, so a window of identical values does not make the next
        different value infinitely surprising."""
        self.resolution = np.where(self.log, 0.0, np.asarray(resolution, dtype=float))
        self.floor = np.where(self.log, LOG_FLOOR, np.maximum(self.resolution, 1e-12))

    def transform(self, values: np.ndarray) -> np.ndarray:
        """The values on the calibration scale (log for log-scaled statistics)."""
        if not self._any_log:
            return np.asarray(values, dtype=float)
        return np.where(self.log, np.log(np.maximum(values, 1e-30)), values)

    def push(self, values: np.ndarray, t: np.ndarray | None = None) -> None:
        """Add one accepted message's values (`t`: the same on the calibration scale, when already computed);
        the oldest leaves a full window."""
        t = self.transform(values) if t is None else t
        kernels.window_push(self._sorted, self._ring, self._pos, self.count, np.asarray(t, dtype=float))
        self._pos = (self._pos + 1) % self.window
        self.count = min(self.count + 1, self.window)
        self.pushed += 1

    def pvalues(self, t: np.ndarray) -> np.ndarray:
        """Upper-tail probability of each value (on the calibration scale) under the stream's honest traffic.
        NaN stays NaN (a statistic without a value this time)."""
        t = np.asarray(t, dtype=float)
        out = np.empty(len(self.names))
        kernels.tail_pvalues(self._sorted, self.count, Q0, self.floor, MAX_SHAPE, t, out)
        kernels.recent_pvalues(self._ring, self._pos, self.count, self.recent, Q0, self.floor, MAX_SHAPE, t, out)
        return out

    def judge(self, values: np.ndarray, subset: np.ndarray) -> tuple[np.ndarray, float, float]:
        """One message in one compiled call: (its values on the calibration scale, Bonferroni's p over every
        statistic, over those in `subset` -- NaN when none of them has a value)."""
        t, p = np.empty(len(self.names)), np.empty(len(self.names))
        p_all, p_sub = kernels.calibrate(
            self._sorted,
            self._ring,
            self._pos,
            self.count,
            self.recent,
            Q0,
            self.floor,
            MAX_SHAPE,
            self.log,
            np.asarray(values, dtype=float),
            subset,
            t,
            p,
        )
        self.last_p = p  # each statistic's own tail probability, for `push_judged`
        return t, p_all, p_sub

    def push_judged(self, t: np.ndarray, p: np.ndarray, capped: bool = True) -> None:
        """Learn an accepted message (`t`, judged with per-statistic tail probabilities `p`). A statistic whose own
        p is below CAP_P is learned capped at its window's largest value, as a flagged message's are, when
        `capped` (the caller allows its sender one such outlier every FLAG_MEMORY steps); otherwise its window
        does not learn it (the value leaving a full window stays; a window still filling learns its own median,
        which leaves its tail as it was).

        Why: the combined rule accepts a message whose strongest statistic is just short of the Bonferroni
        share of the level (p ~ 1e-4 for one statistic of nine). Learned as it is, such a value stretches its
        window's tail, and the next message of an attacker who stays at that value looks ordinary: on
        byte-level text a random-sign gradient attack was flagged on its first message and on 1 of its next 14
        as its align values (1.0 against an honest 0.003) filled the window. Capped, the window learns that a
        value at least that far out occurred, never how far; but an attacker accepted on every message, each
        learned at the window's largest, still piles values at the top and fattens the fitted tail until its
        messages sit at the level (a sparse gradient attack at align_tail 1.5 against an honest 0.3 held at
        evidence ~3.2 for 25 steps). So a sender's outliers teach the windows at most once per FLAG_MEMORY
        steps, accepted or flagged. Honest traffic loses little: a value with p < 1e-3 lies at or beyond the
        window's largest, and a drift of the whole stage is learned as a shift."""
        if below_cap(p):
            out = p < CAP_P
            top = self._sorted[:, self.count - 1]
            if capped:
                keep = np.minimum(t, top)
            elif self.count == self.window:
                keep = self._ring[self._pos]  # the value leaving the window: its window does not change
            else:
                keep = self._sorted[:, self.count // 2]
            t = np.where(out & ~np.isnan(t), keep, t)
        self.push(t, t)

    def push_capped(self, t: np.ndarray) -> None:
        """Learn a flagged message's values winsorised at the window's largest: the window learns that a value at
        least that far out occurred, never how far (an attacker's flagged messages cannot stretch the tail;
        honest outliers, heavy-tailed or a drift the window has not absorbed yet, thicken it step by step
        until they are no longer flagged). Values below the window's largest are learned as they are."""
        top = self._sorted[:, self.count - 1]
        t = np.where(np.isnan(t), t, np.minimum(t, top))
        if np.isfinite(t).all():
            self.push(t, t)

    def level(self, p: float) -> np.ndarray:
        """Per statistic, the value (on the statistic's own scale) whose tail probability is p: in the tail
        (p < 1 - Q0), the larger of the window's and the recent values' levels (`pvalues` takes the larger p)."""
        n = self.count
        out = np.empty(len(self.names))
        for i in range(len(self.names)):
            t = _level(self._sorted[i, :n], self.floor[i], p)
            if p < 1.0 - Q0 and 0 < self.recent < n:
                recent = np.sort(self._ring[(self._pos - 1 - np.arange(self.recent)) % self.window, i])
                t = max(t, _level(recent, self.floor[i], p))
            out[i] = np.exp(t) if self.log[i] else t
        return out


def _level(w: np.ndarray, floor: float, p: float) -> float:
    """The value of sorted window `w` whose tail probability is p (on the calibration scale)."""
    u, beta, xi = tail_fit(w, floor)
    if p >= 1.0 - Q0:
        return float(np.quantile(w, 1.0 - p))
    if xi < 1e-6:
        return u + beta * np.log((1.0 - Q0) / p)
    return u + beta * (((1.0 - Q0) / p) ** xi - 1.0) / xi


def tail_fit(w: np.ndarray, floor: float) -> tuple[float, float, float]:
    """(u, beta, xi) of a sorted window: its Q0 quantile, and the method-of-moments generalised Pareto scale and
    shape of its excesses above u (as `kernels.tail_pvalues`)."""
    u = float(np.quantile(w, Q0))
    ex = w[w > u] - u
    mean = float(ex.mean()) if len(ex) else 0.0
    xi = 0.0
    if len(ex) > 2:
        var = float(ex.var(ddof=1))
        if var > 0:
            xi = min(max(0.5 * (1.0 - mean * mean / var), 0.0), MAX_SHAPE)
    return u, max(mean * (1.0 - xi), floor), xi


def combine(pvalues: np.ndarray) -> float:
    """Bonferroni: min_i(D p_i) over the statistics that have a value (1 when none has)."""
    p = pvalues[~np.isnan(pvalues)]
    if not len(p):
        return 1.0
    return float(min(1.0, p.min() * len(p)))


class SenderWindows:
    """A stream's windows, and per sender the same windows without its own values (leave-one-sender-out).

    Why: a stream's window pools the accepted values of every replica of the sending stage, so an attacker whose
    messages are accepted teaches the window its own values. It sends a third of a 3-replica stage's messages, more
    than the window's top 1 - Q0 share that the tail is fitted to: once its values stand just beyond the honest
    ones, they become the tail, and its next messages look ordinary. On held-out JavaScript bytes (6 layers x 48,
    a 5 x 3 mesh) one token per gradient message with half its coordinates' signs flipped (align_tail 0.6-1.6
    against an honest 0.05-0.3), starting at step 30 or 50, was flagged on 0-2% of its messages and banned by the
    slow peer test, 19-33 steps in (seeds 71-73); judged against its peers' windows, 3-17 steps (flagged on 4-50%).

    How: besides the pooled window, each sender s has `others[s]`: the same windows fed with every accepted value of
    every sender but s (created as a copy of the pooled windows the first time s sends, which then hold nothing of
    its own). A message of s is judged against `others[s]`: an honest sender's values are exchangeable with its
    honest peers', so its p-values stay valid; an attacker's are judged against its peers' traffic only, whatever it
    sent before. Learning is unchanged: a value learned by the pooled window is learned by every other sender's
    windows the same way (`push`, `push_judged`, `push_capped`), so the outlier caps and budgets apply as before.
    The caller decides when to use it (`judge(..., loo=True)`): with fewer than three live senders, a sender's
    windows would be one peer's traffic, which a malicious peer could shape. Cost: one window update per sender
    per learned value (a 3-replica stage: three instead of one).

    `judge` also gives the message's p against the pooled windows: SENTINEL flags a message only when both say so
    (`Sentinel._judge`), and accumulates, learns and tests drift on the leave-one-out p alone.
    """

    def __init__(self, names, window: int, log, resolution=None, recent: int = 0):
        self.pooled = TailCalibrator(names, window, log, resolution, recent)
        self.others: dict[str, TailCalibrator] = {}
        self.names = names
        self.last_p = self.pooled.last_p

    # the pooled windows' public face: fill, scale, thresholds
    @property
    def count(self) -> int:
        return self.pooled.count

    @property
    def window(self) -> int:
        return self.pooled.window

    @property
    def resolution(self) -> np.ndarray:
        return self.pooled.resolution

    def transform(self, values: np.ndarray) -> np.ndarray:
        return self.pooled.transform(values)

    def set_resolution(self, resolution) -> None:
        for cal in (self.pooled, *self.others.values()):
            cal.set_resolution(resolution)

    def level(self, p: float) -> np.ndarray:
        return self.pooled.level(p)

    def _see(self, sender: str | None) -> None:
        """A sender seen for the first time gets a copy of the pooled windows (none of its values are in them)."""
        if sender is not None and sender not in self.others:
            self.others[sender] = copy.deepcopy(self.pooled)

    def _learners(self, sender: str | None):
        self._see(sender)
        yield self.pooled
        for s, cal in self.others.items():
            if s != sender:
                yield cal

    def reference(self, sender: str | None, loo: bool) -> TailCalibrator:
        """The windows a message of `sender` is judged against: without its own values when `loo` (a sender that
        has taught nothing yet has none in the pooled windows), else the pooled ones. Creates nothing."""
        return self.others.get(sender, self.pooled) if loo else self.pooled

    def judge(self, values: np.ndarray, subset: np.ndarray, sender: str | None = None, loo: bool = False):
        """`TailCalibrator.judge` against `reference(sender, loo)`: (t, p, p over `subset`), and Bonferroni's p
        against the pooled windows (the same p where those are the reference). `last_p`: the reference's."""
        cal = self.reference(sender, loo)
        pooled = self.pooled.judge(values, subset)[1] if cal is not self.pooled else None
        t, p, p_sub = cal.judge(values, subset)
        self.last_p = cal.last_p
        return t, p, p_sub, p if pooled is None else pooled

    def pvalues(self, t: np.ndarray, sender: str | None = None, loo: bool = False) -> np.ndarray:
        return self.reference(sender, loo).pvalues(t)

    def push(self, values: np.ndarray, t: np.ndarray | None = None, sender: str | None = None) -> None:
        t = self.pooled.transform(values) if t is None else t
        for cal in self._learners(sender):
            cal.push(values, t)

    def push_judged(self, t: np.ndarray, p: np.ndarray, capped: bool = True, sender: str | None = None) -> None:
        for cal in self._learners(sender):
            cal.push_judged(t, p, capped)

    def push_capped(self, t: np.ndarray, sender: str | None = None) -> None:
        for cal in self._learners(sender):
            cal.push_capped(t)
