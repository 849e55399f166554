"""Detector state machines: a bias-corrected EMA baseline and sliding-window Tukey fences.

Both learn only from messages the detector accepted: a flagged message never moves them.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from sentinel.detectors.distances import Layout, kernels

_EMPTY = np.empty(0)
# torch runs an elementwise operation over more elements than this on its thread pool (at::internal::GRAIN_SIZE)
SERIAL_NUMEL = 32768


def ema_(acc: torch.Tensor, x: torch.Tensor, beta: float) -> None:
    """acc <- beta * acc + (1 - beta) * x, in place, for a contiguous `acc` of x's shape.

    In chunks that torch computes in the calling thread: a verifier's per-message updates are small,
    and a thread-pool operation stalls whenever one of its threads is preempted (on a busy machine, a
    few milliseconds per message). The chunks are multiples of every SIMD width, so every element goes
    through the same kernel as in one `acc.mul_(beta).add_(x, alpha=1 - beta)`: the same values.
    """
    a, v = acc.view(-1), x.reshape(-1)
    for i in range(0, a.numel(), SERIAL_NUMEL):
        a[i : i + SERIAL_NUMEL].mul_(beta).add_(v[i : i + SERIAL_NUMEL], alpha=1 - beta)


class BaselineView:
    """Bias-corrected baseline, with what the distances need precomputed once per update.

    mean = m / div (the bias-corrected EMA of signatures), var = v / var_div (of the pooled part's squared innovation;
    None: a single update so far, no spread known yet: ones); one compiled call (`kernels.baseline_view`)."""

    def __init__(self, m: np.ndarray, var: np.ndarray | None, layout: Layout, div: float = 1.0, var_div: float = 1.0):
        self.layout = layout
        L = layout
        mean, self.pooled_sign, self.var, self.inv_var, self.skew_norm, self.inv_rms = kernels.baseline_view(
            m, div, _EMPTY if var is None else var, var_div, L.pooled.stop, L.skew.stop, L.quant.stop
        )
        self.pooled, self.skew, self.quant = mean[L.pooled], mean[L.skew], mean[L.quant]


class Baseline:
    """EMA of a stream's signatures, bias-corrected as in Adam: m_hat = m_t / (1 - beta^t).

    m_t = beta * m_{t-1} + (1 - beta) * s_t, m_0 = 0, one update per accepted message. `var` is the EMA
    (decay `beta_var`, a longer memory) of the squared innovation (p_t - m_hat_{t-1})^2 of the pooled
    vector: the spread an honest message shows around the baseline, per coordinate. `full` (optional)
    keeps the EMA of the whole payload so a flagged gradient can be replaced by it.
    """

    def __init__(self, beta: float, beta_var: float, keep_full: bool = False):
        self.beta, self.beta_var, self.keep_full = beta, beta_var, keep_full
        self.n = 0
        self.n_var = 0
        self.layout: Layout | None = None
        self._m: np.ndarray | None = None
        self._var: np.ndarray | None = None
        self._full: torch.Tensor | None = None
        self._view: BaselineView | None = None

    def comparable(self, sig: np.ndarray) -> bool:
        return self.n > 0 and self._m is not None and self._m.shape == sig.shape

    def update(self, sig: np.ndarray, layout: Layout, payload: torch.Tensor | None = None) -> None:
        b = self.beta
        if self._m is None or self._m.shape != sig.shape:
            self._m, self.n, self.layout, self._var, self.n_var = np.zeros_like(sig), 0, layout, None, 0
        if self.n > 0 and self._var is None:
            self._var = np.zeros(layout.pooled.stop)  # beta_var * 0 + (1 - beta_var) * innov: the first innovation
        var = _EMPTY if self._var is None else self._var
        if kernels.ema_update(self._m, var, sig, layout.pooled.stop, b, self.beta_var, 1.0 - b**self.n):
            self.n_var += 1
        if self.keep_full and payload is not None:
            p = payload.detach()
            if self._full is None or self._full.shape != p.shape:
                self._full = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            ema_(self._full, p, b)
        self.n += 1
        self._view = None

    def view(self) -> BaselineView:
        if self._view is None:
            var_div = 1.0 - self.beta_var**self.n_var
            self._view = BaselineView(self._m, self._var, self.layout, 1.0 - self.beta**self.n, var_div)
        return self._view

    def full(self) -> torch.Tensor | None:
        """Bias-corrected EMA of the whole payload (None until one was seen)."""
        if self._full is None or self.n == 0:
            return None
        return self._full / (1.0 - self.beta**self.n)

    def summary(self) -> dict:
        if self.n == 0:
            return {"updates": 0}
        v = self.view()
        return {"updates": self.n, "pooled_norm": float(np.sqrt(v.pooled @ v.pooled)), "rms": float(1.0 / v.inv_rms)}


class SenderMedianBaseline:
    """Honest-majority baseline: one EMA per sender, combined by the coordinate-wise median.

    Each sender of the stream keeps its own bias-corrected EMA (and innovation variance); the stream's
    baseline is the coordinate-wise median over the senders active in the last `horizon` steps. A
    minority of senders cannot move a median: a malicious replica whose tampered messages stay under
    the fence (so are learned into its own EMA) does not drag the baseline the others are judged
    against (with a single pooled EMA, replayed stale activations anchor it in the past and fresh honest
    traffic starts to look anomalous). With one sender it is exactly the pooled EMA.
    """

    def __init__(self, beta: float, beta_var: float, keep_full: bool = False, horizon: int = 20):
        self.beta, self.beta_var, self.horizon = beta, beta_var, horizon
        self.senders: dict[str, Baseline] = {}
        self.last: dict[str, int] = {}
        self.pooled = Baseline(beta, beta_var, keep_full)  # only for `full` (the substitute) and summaries
        self.layout: Layout | None = None
        self._view: BaselineView | None = None

    @property
    def n(self) -> int:
        return self.pooled.n

    def comparable(self, sig: np.ndarray) -> bool:
        return self.pooled.comparable(sig)

    def update(
        self, sig: np.ndarray, layout: Layout, payload: torch.Tensor | None = None, sender: str = "", step: int = 0
    ) -> None:
        if not self.pooled.comparable(sig):  # first message, or a new shape: start afresh
            self.senders, self.last = {}, {}
        self.pooled.update(sig, layout, payload)
        self.senders.setdefault(sender, Baseline(self.beta, self.beta_var)).update(sig, layout)
        self.last[sender] = step
        self.layout, self._view = layout, None

    def view(self) -> BaselineView:
        if self._view is None:
            now = max(self.last.values())
            active = [b for w, b in self.senders.items() if now - self.last[w] < self.horizon]
            if len(active) == 1:
                self._view = active[0].view()
            else:
                views = [b.view() for b in active]
                mean = np.median(np.stack([b._m / (1.0 - b.beta**b.n) for b in active]), axis=0)
                variances = [v.var for v, b in zip(views, active) if b._var is not None]
                var = np.median(np.stack(variances), axis=0) if variances else None
                self._view = BaselineView(mean, var, self.layout)
        return self._view

    def full(self) -> torch.Tensor | None:
        return self.pooled.full()

    def summary(self) -> dict:
        return {**self.pooled.summary(), "senders": len(self.senders)}


class Fences:
    """Tukey fences over a sliding window of the last `window` accepted values of D statistics.

    threshold_i = Q3_i + k * IQR_i. `exceedance(values)` returns e_i = (x_i - Q3_i) / IQR_i, so that
    x_i > threshold_i <=> e_i > k; IQR is floored at 1% of |Q3| and at the statistic's resolution
    (`set_resolution`) so a window of identical values does not make every later change infinitely
    surprising. With `log` (one flag, or one per statistic), fences are computed on log values
    (multiplicative fences, threshold = Q3 * (Q3 / Q1)^k, floored at a 1% spread): scale-free, and
    suited to positive, right-skewed distances.
    """

    def __init__(self, names: tuple[str, ...], window: int, k: float, log: bool | tuple[bool, ...] = False):
        self.names, self.window, self.k = names, window, k
        self._log = np.broadcast_to(np.asarray(log, dtype=bool), (len(names),)).copy()  # per statistic
        self.log = bool(self._log.all())
        self._any_log = bool(self._log.any())
        self._buf = np.zeros((window, len(names)))
        self.count = 0
        self._pos = 0
        self._q: tuple[np.ndarray, np.ndarray] | None = None
        self.resolution = np.zeros(len(names))  # per statistic: the smallest step it can take (0: continuous)

    def set_resolution(self, resolution: np.ndarray) -> None:
        """Floor each IQR at the statistic's resolution (e.g. `sign_flip_ratio` moves in steps of 1/C): a
        discrete statistic whose window holds one repeated value would otherwise score one more step as an
        exceedance of ~1/(0.01 |Q3| + 1e-30), i.e. 1e28 when Q3 = 0. Linear-scale statistics only."""
        self.resolution = np.where(self._log, 0.0, np.asarray(resolution, dtype=float))
        self._q = None

    def transform(self, values: np.ndarray) -> np.ndarray:
        """The values on the fences' scale (log for log-fenced statistics): what `exceedance` and `push`
        take as `t` when one message needs both (computed once)."""
        if not self._any_log:
            return values
        return np.where(self._log, np.log(np.maximum(values, 1e-30)), values)

    def push(self, values: np.ndarray, t: np.ndarray | None = None) -> None:
        self._buf[self._pos] = self.transform(values) if t is None else t
        self._pos = (self._pos + 1) % self.window
        self.count = min(self.count + 1, self.window)
        self._q = None

    def quartiles(self) -> tuple[np.ndarray, np.ndarray]:
        """(Q3, IQR) per statistic over the window: numpy's default (linear) quantiles of each column."""
        if self._q is None:
            s = np.sort(self._buf[: self.count], axis=0)
            rows, (f1, f3) = _quartile_rows(self.count)
            r = s[rows]  # the order statistics Q1 and Q3 interpolate between, gathered at once
            q1 = r[0] + f1 * (r[1] - r[0])
            q3 = r[2] + f3 * (r[3] - r[2])
            iqr = np.maximum(q3 - q1, np.where(self._log, 0.01, np.maximum(0.01 * np.abs(q3) + 1e-30, self.resolution)))
            self._q = (q3, iqr)
        return self._q

    def exceedance(self, values: np.ndarray, t: np.ndarray | None = None) -> np.ndarray:
        q3, iqr = self.quartiles()
        return ((self.transform(values) if t is None else t) - q3) / iqr

    def level(self, k: float) -> np.ndarray:
        """The fence at `k` (Q3 + k * IQR, back on the statistics' own scale), one value per statistic."""
        q3, iqr = self.quartiles()
        t = q3 + k * iqr
        return np.where(self._log, np.exp(t), t)

    def thresholds(self) -> dict[str, float]:
        if self.count == 0:
            return {}
        return {n: float(v) for n, v in zip(self.names, self.level(self.k))}


@functools.cache
def _quartile_rows(n: int) -> tuple[list[int], tuple[float, float]]:
    """For n sorted values: the rows [lo1, hi1, lo3, hi3] that Q1 and Q3 interpolate between, and their
    fractions (numpy's default linear quantile: position q * (n - 1))."""
    rows, fracs = [], []
    for q in (0.25, 0.75):
        pos = q * (n - 1)
        lo = int(pos)
        rows += [lo, min(lo + 1, n - 1)]
        fracs.append(pos - lo)
    return rows, tuple(fracs)
