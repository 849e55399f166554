"""Result 5: probability that a fence detector flags a mean shift within n steps.

Honest statistic X ~ N(mu, s^2); the fence c = Q3 + k*IQR comes from a window of `window` honest values
(numpy 'linear' quantiles); from step 1 on, every value is X + delta. Two detectors:

* frozen: c is estimated once and kept (flagged values never enter the window, and no attacked value does
  either). Flags are i.i.d. only *given* c, so P(detect within n) = 1 - E[(1 - p(c))^n], p(c) = P(X + delta > c).
* refreshed: each step uses a fence from a fresh independent honest window; P = 1 - (1 - E p(c))^n.
* sliding (SENTINEL's): the window keeps sliding and unflagged attacked values may enter it; bounded through
  a dominating fence widened by one rank per replaced entry (`dominating_indices`).

See detection_power.md for the bounds and why the geometric form 1 - (1 - p_1)^n is only valid when refreshed.
`fences_detection` and `sentinel_detection` measure the same probability on the testbed's own `Fences` class
and whole `sentinel` detector (`check_implementation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import integrate, special

from proofs.fence_fpr import fence_coefficients, fence_expectation, simulate_fences
from proofs.result import Result

NAME = "detection_power"
STATEMENT = (
    "P(flag within n) >= max_x P(c+ <= x)*(1-(1-p(x))^n) frozen, max_x sum_m P(c+_(m-1) <= x)p(x)(1-p(x))^(m-1) "
    "sliding; vs simulation, SENTINEL's Fences and detector"
)


def _validate(delta: float, s: float, n: int) -> None:
    if not s > 0 or n < 1:
        raise ValueError(f"Need s > 0 and n >= 1 (got s={s}, n={n}).")
    if not math.isfinite(delta):
        raise ValueError(f"delta must be finite (got {delta}).")


def dominating_indices(window: int, replaced: int = 0) -> tuple[int, int]:
    """1-based (a, b) with X_(a) <= Q1 and Q3 <= X_(b) after up to `replaced` window entries were swapped.

    Unreplaced: a = floor((w-1)/4) + 1, b = ceil(3(w-1)/4) + 1. Each replaced entry (one value out, any value
    in) moves every order statistic by at most one rank, so the bounds widen to (a - r, b + r).

    Raises:
        ValueError: If a - r < 1 or b + r > w (no bound from the original window is left).
    """
    a = math.floor((window - 1) / 4) + 1 - replaced
    b = math.ceil(3 * (window - 1) / 4) + 1 + replaced
    if replaced < 0 or a < 1 or b > window:
        raise ValueError(f"replaced={replaced} must be in [0, {math.floor((window - 1) / 4)}] for window={window}.")
    return a, b


def dominating_fence_cdf(x: float, k: float, window: int, replaced: int = 0) -> float:
    """P(c+ <= x) for c+ = (1+k) X_(b) - k X_(a) >= c, standard normal window (X_(a) <= Q1, Q3 <= X_(b)).

    Given U_(b) = v ~ Beta(b, w-b+1), U_(a) = v * Beta(a, b-a), so the inner probability is an incomplete beta
    function; c+ <= x forces X_(b) <= x, hence v <= Phi(x), where the integrand is smooth (adaptive quadrature).
    Equal to P(c <= x) when (w - 1) % 4 == 0 and replaced == 0. With `replaced` = r > 0, (a, b) are widened
    to (a - r, b + r) (`dominating_indices`): c+ then dominates the fence of any window obtained from the
    honest one by replacing at most r entries with arbitrary values (a sliding window under attack).
    """
    fence_coefficients(k, window)  # validates k > 0, window >= 4
    a, b = dominating_indices(window, replaced)
    log_norm = special.betaln(b, window - b + 1)

    def integrand(v: float) -> float:
        y = special.ndtri(v)  # X_(b)
        cut = special.ndtr(((1 + k) * y - x) / k) / v  # B must exceed this for X_(a) >= ((1+k)y - x)/k
        density = math.exp((b - 1) * math.log(v) + (window - b) * math.log1p(-v) - log_norm)
        return density * special.betaincc(a, b - a, min(cut, 1.0))

    upper = float(special.ndtr(x))
    mode = (b - 1) / (window - 1)
    points = [mode] if mode < upper else None
    value, _ = integrate.quad(integrand, 0.0, upper, points=points, epsabs=1e-13, epsrel=1e-10, limit=200)
    return min(1.0, value)


def _shift_sf(c: np.ndarray, shift: float) -> np.ndarray:
    """p(c) = P(Z + shift > c), Z standard normal."""
    return special.ndtr(shift - c)


def _miss_n(p: np.ndarray, n) -> np.ndarray:
    """(1 - p)^n, accurate for small p; n may be an array (0^0 = 1)."""
    n = np.asarray(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n == 0, 1.0, np.exp(n * np.log1p(-np.minimum(p, 1.0))))


def detection_prob(delta: float, s: float, k: float, window: int, n: int, refresh: bool = False) -> float:
    """Exact P(at least one flag within n attacked steps), by quadrature over the fence's order statistics."""
    _validate(delta, s, n)
    shift = delta / s  # the fence is location-scale equivariant: work in units of s
    if refresh:
        return float(1 - _miss_n(np.array(fence_expectation(lambda c: _shift_sf(c, shift), k, window)), n))
    return 1 - fence_expectation(lambda c: _miss_n(_shift_sf(c, shift), n), k, window)


def detection_prob_lower_bound(
    delta: float,
    s: float,
    k: float,
    window: int,
    n: int,
    refresh: bool = False,
    grid: int = 40,
    sliding: bool = False,
) -> float:
    """Lower bound on P(at least one flag within n steps) against a mean shift `delta`.

    Frozen fence (default): max_x P(c+ <= x) * (1 - (1 - p(x))^n). Refreshed fences: 1 - (1 - p_1)^n with
    p_1 = max_x P(c+ <= x) * p(x). Sliding window (SENTINEL's: the attacked values that are not flagged may
    enter it): max_x sum_{m=1..n} P(c+_{m-1} <= x) p(x) (1 - p(x))^(m-1), where c+_r is the dominating
    fence widened for r replaced entries (`dominating_indices`); needs n - 1 <= floor((w - 1) / 4).
    Here p(x) = P(X + delta > x) and c+ = c+_0 >= c is the dominating fence of `dominating_fence_cdf`;
    x runs over a grid around the fence's mean (any x gives a valid bound).

    Args:
        delta: Mean shift of the attacked statistic.
        s: Standard deviation of the honest statistic.
        k: Fence multiplier.
        window: Honest window size w (>= 4).
        n: Attacked steps.
        refresh: Fence re-estimated from a fresh independent honest window at each step.
        grid: Number of x values tried.
        sliding: Bound a window that slides during the attack (at most m - 1 entries replaced, by any
            values, before the m-th attacked value is tested).

    Returns:
        The bound, in [0, 1].
    """
    _validate(delta, s, n)
    if sliding and refresh:
        raise ValueError("sliding and refresh are exclusive: a refreshed fence has no window to poison.")
    dominating_indices(window, n - 1 if sliding else 0)  # validates n - 1 <= floor((w - 1) / 4) when sliding
    shift = delta / s
    mean = fence_expectation(lambda c: c, k, window)
    spread = math.sqrt(max(fence_expectation(lambda c: c * c, k, window) - mean**2, 1e-12))
    xs = mean + spread * np.linspace(-2.0, 5.0, grid)
    cdf = np.array([dominating_fence_cdf(x, k, window) for x in xs])
    p = _shift_sf(xs, shift)
    if refresh:
        return float(1 - _miss_n(np.max(cdf * p), n))
    frozen = cdf * (1 - _miss_n(p, n))
    if not sliding:
        return float(np.max(frozen))
    # sum_m P(c+_{m-1} <= x) p (1 - p)^(m-1) <= frozen(x) since c+_{m-1} >= c+_0: visit x by decreasing
    # `frozen`, stop once it cannot beat the best; drop terms of weight < 1e-12 (dropping only lowers it).
    best = 0.0
    for j in np.argsort(-frozen):
        if frozen[j] <= best:
            break
        total = cdf[j] * p[j]
        for m in range(1, n):
            weight = p[j] * _miss_n(p[j], m)
            if weight < 1e-12:
                break
            total += dominating_fence_cdf(xs[j], k, window, m) * weight
        best = max(best, float(total))
    return best


def simulate_detection(
    delta: float, s: float, k: float, window: int, n: int, trials: int, rng: np.random.Generator, mode: str
) -> float:
    """Fraction of `trials` runs flagged within n steps.

    Args:
        mode: "frozen", "refreshed", or "sliding" (SENTINEL-like: the window slides and every value that is
            *not* flagged enters it, so an undetected shift poisons the fence).
    """
    shifted = rng.normal(delta, s, size=(trials, n))
    if mode == "frozen":
        fences = s * simulate_fences(k, window, "normal", trials, rng)
        return float(np.mean((shifted > fences[:, None]).any(axis=1)))
    if mode == "refreshed":  # one fresh window per step
        fences = s * simulate_fences(k, window, "normal", trials * n, rng).reshape(trials, n)
        return float(np.mean((shifted > fences).any(axis=1)))
    if mode != "sliding":
        raise ValueError(f"Unknown mode {mode!r}; choose 'frozen', 'refreshed' or 'sliding'.")
    values = rng.normal(0.0, s, size=(trials, window))  # circular buffer of admitted values
    oldest = np.zeros(trials, dtype=int)
    detected = np.zeros(trials, dtype=bool)
    rows = np.arange(trials)
    for step in range(n):
        q1, q3 = np.quantile(values, [0.25, 0.75], axis=1)
        flag = shifted[:, step] > q3 + k * (q3 - q1)
        detected |= flag
        admit = rows[~flag]  # unflagged values update the window
        values[admit, oldest[admit]] = shifted[admit, step]
        oldest[admit] = (oldest[admit] + 1) % window
    return float(np.mean(detected))


# ---------------------------------------------------------------------------------------------------------
# The testbed's own fence (`sentinel.detectors.baseline.Fences`) and detector (`sentinel`).
# ---------------------------------------------------------------------------------------------------------


def fences_detection(
    delta: float,
    s: float,
    k: float,
    window: int,
    n: int,
    trials: int,
    rng: np.random.Generator,
    mode: str = "frozen",
    k_learn: float | None = None,
) -> float:
    """Fraction of `trials` runs in which SENTINEL's own `Fences` flags a shifted N(delta, s^2) stream within n.

    Each run fills a `Fences` window with `window` i.i.d. N(0, s^2) values through `push`, then tests n values
    N(delta, s^2): flagged iff not exceedance <= k (SENTINEL's rule, NaN counts as flagged).

    Args:
        mode: "frozen" (nothing is pushed during the attack; all runs share one `Fences` with one column
            per run), "sentinel" (an unflagged value is pushed iff its exceedance <= k_learn: SENTINEL's
            inner learning fence) or "admit" (every unflagged value is pushed: the worst poisoning).
        k_learn: Inner fence for mode "sentinel".
    """
    from sentinel.detectors.baseline import Fences

    honest, attacked = rng.normal(0.0, s, size=(window, trials)), rng.normal(delta, s, size=(n, trials))
    if mode == "frozen":
        fences = Fences(tuple(str(i) for i in range(trials)), window, k)
        for row in honest:
            fences.push(row)
        flagged = np.zeros(trials, dtype=bool)
        for row in attacked:
            flagged |= ~(fences.exceedance(row) <= k)
        return float(flagged.mean())
    if mode not in ("sentinel", "admit"):
        raise ValueError(f"Unknown mode {mode!r}; choose 'frozen', 'sentinel' or 'admit'.")
    if mode == "sentinel" and (k_learn is None or k_learn > k):
        raise ValueError(f"mode 'sentinel' needs k_learn <= k (got {k_learn}).")
    admit = k if mode == "admit" else k_learn
    hits = 0
    for i in range(trials):
        fences = Fences(("stat",), window, k)
        for v in honest[:, i : i + 1]:
            fences.push(v)
        for y in attacked[:, i : i + 1]:
            e = fences.exceedance(y)[0]
            if not e <= k:
                hits += 1
                break
            if e <= admit:
                fences.push(y)
    return hits / trials


@dataclass(frozen=True)
class SentinelPower:
    """One `sentinel_detection` experiment.

    Attributes:
        detected: Fraction of attack episodes with a flag within n attacked messages.
        episodes: Number of episodes.
        spread: Standard deviation s of the honest l1 statistic (over every judged honest message).
        skew: Its sample skewness (0 for the Gaussian the bound assumes).
        delta: The shift added to the statistic, in its units (delta / spread is the bound's shift).
        honest_flags: Flags raised on honest messages (all episodes).
    """

    detected: float
    episodes: int
    spread: float
    skew: float
    delta: float
    honest_flags: int


def sentinel_detection(
    shift: float,
    n: int,
    episodes: int,
    seed: int = 0,
    *,
    window: int = 32,
    k: float = 4.0,
    k_learn: float = 2.5,
    beta: float = 0.9,
    honest_steps: int | None = None,
    shape: tuple[int, int, int] = (1, 8, 64),
) -> SentinelPower:
    """The whole `sentinel` detector (l1 distance) against messages whose statistic is shifted by `shift` s.

    One sender streams activations. Each episode sends `honest_steps` (default window + 8) honest messages,
    which refill the fence window, then n attacked ones. The attack adds, to every token of feature f,
    delta * sign(p_f - mu_f), with p the message's token mean and mu the detector's current baseline (a
    white-box attacker): every |p_f - mu_f| grows by exactly delta, so the l1 statistic the detector computes
    is the honest one plus delta -- the shifted-statistic model of the bound. delta = shift * s, with s
    the honest statistic's spread estimated from a pilot of 5 windows (after one more to settle) before the
    first episode; the bound is then evaluated at the delta / s measured over all honest messages.
    """
    from proofs import testbed

    honest_steps = window + 8 if honest_steps is None else honest_steps
    with testbed.single_thread():
        det = testbed.sentinel(
            seed=seed,
            distances=("l1",),
            window=window,
            k=k,
            k_learn=k_learn,
            beta_act=beta,
            warmup_steps=0,
            fence_scale="linear",  # the bound is for Q3 + k IQR of the statistic itself (the default fences log l1)
        )
        stream = testbed.HonestStream(shape, 1.0, seed)
        step, honest_values, honest_flags = 0, [], 0

        def send(payload):
            nonlocal step
            verdict = det.observe(testbed.message(step, payload))
            step += 1
            return verdict

        pilot = [send(stream()).scores.get("l1", math.nan) for _ in range(6 * window)]
        delta = shift * float(np.std(pilot[window:]))
        baseline, _ = testbed.stream_state(det)
        hits = 0
        for _ in range(episodes):
            for _ in range(honest_steps):
                verdict = send(stream())
                honest_values.append(verdict.scores["l1"])
                honest_flags += verdict.flagged
            for _ in range(n):
                x = stream()
                sign = np.sign(stream.pooled(x) - baseline.view().pooled)
                verdict = send(x + torch_tensor(delta * sign))
                if verdict.flagged:
                    hits += 1
                    break
    values = np.array(honest_values)
    z = (values - values.mean()) / values.std()
    return SentinelPower(hits / episodes, episodes, float(values.std()), float(np.mean(z**3)), delta, honest_flags)


def torch_tensor(values: np.ndarray):
    """A float32 torch tensor (the payload dtype) from a numpy array."""
    import torch

    return torch.from_numpy(np.asarray(values, dtype=np.float32))


# (delta / s, k, window, n): SENTINEL-like k = 1.5 with small and large shifts, a wide fence, a long horizon;
# the last one is where the geometric form 1 - (1 - p_1)^n overstates the frozen detector's power.
_CASES = [(2.0, 1.5, 50, 10), (1.0, 1.5, 21, 30), (3.0, 3.0, 100, 5), (0.5, 1.5, 49, 100), (2.0, 1.5, 9, 10)]
_SIM_BUDGET = 4_000_000  # random numbers per simulated detector


def _se(p: float, trials: int) -> float:
    """Standard error of a simulated rate whose true value is p (floored at one success in `trials`)."""
    return math.sqrt(max(p * (1 - p), 1 / trials) / trials)


def _sliding_applies(window: int, n: int) -> bool:
    return n - 1 <= math.floor((window - 1) / 4)


# (delta / s, k, window, n, k_learn) for SENTINEL's own Fences: its defaults (k = 4, k_learn = 2.5, window
# 100, banned within ~5-7 messages), and the first reference case with k_learn scaled like the defaults.
_FENCE_CASES = [(6.0, 4.0, 100, 5, 2.5), (2.0, 1.5, 50, 10, 1.5 * 2.5 / 4)]
_FENCE_TRIALS = {"frozen": 20_000, "sentinel": 1_000, "admit": 1_000}
# The whole detector: shift 7 s, n = 5 messages, window 32 (default k, k_learn), episodes.
_DETECTOR_CASE = {"shift": 7.0, "n": 5, "window": 32, "k": 4.0, "k_learn": 2.5, "episodes": 120}
_Z = 4.5  # Monte Carlo tolerance in standard errors (two-sided false-alarm rate ~7e-6 per comparison)


def check_implementation(seed: int = 0) -> tuple[bool, list[str], float, float]:
    """The bounds against SENTINEL's own `Fences` class and its whole `sentinel` detector.

    Asserted, on `_FENCE_CASES` with the real `Fences`: frozen detection within 4.5 SE of the exact value
    and >= the frozen lower bound - 4.5 SE; with SENTINEL's learning rule ("sentinel": push iff the
    exceedance is <= k_learn) and with every unflagged value pushed ("admit"), detection >= the sliding
    lower bound - 4.5 SE. On the whole detector (`sentinel_detection`): detection >= the sliding lower bound
    at the measured delta / s - 4.5 SE.

    Returns:
        (ok, notes, sliding lower bound, detector's detection rate) for the whole detector.
    """
    rng = np.random.default_rng([seed, 5])
    ok, notes = True, []
    for shift, k, window, n, k_learn in _FENCE_CASES:
        lb_frozen = detection_prob_lower_bound(shift, 1.0, k, window, n)
        lb_sliding = detection_prob_lower_bound(shift, 1.0, k, window, n, sliding=True)
        exact = detection_prob(shift, 1.0, k, window, n)
        rates = {m: fences_detection(shift, 1.0, k, window, n, t, rng, m, k_learn) for m, t in _FENCE_TRIALS.items()}
        ok &= abs(rates["frozen"] - exact) <= _Z * _se(exact, _FENCE_TRIALS["frozen"])
        ok &= rates["frozen"] >= lb_frozen - _Z * _se(lb_frozen, _FENCE_TRIALS["frozen"])
        for mode in ("sentinel", "admit"):
            ok &= rates[mode] >= lb_sliding - _Z * _se(lb_sliding, _FENCE_TRIALS[mode])
        notes.append(
            f"Fences d={shift} k={k} w={window} n={n}: frozen {rates['frozen']:.3f} (exact {exact:.3f}, lb "
            f"{lb_frozen:.3f}); k_learn={k_learn:g} {rates['sentinel']:.3f}, admit-all {rates['admit']:.3f} "
            f"(sliding lb {lb_sliding:.3f})"
        )
    c = _DETECTOR_CASE
    power = sentinel_detection(
        c["shift"], c["n"], c["episodes"], seed, window=c["window"], k=c["k"], k_learn=c["k_learn"]
    )
    args = (power.delta, power.spread, c["k"], c["window"], c["n"])
    lb_sliding = detection_prob_lower_bound(*args, sliding=True)
    ok &= power.detected >= lb_sliding - _Z * _se(lb_sliding, power.episodes)
    notes.append(
        f"sentinel detector (l1, w={c['window']}, k={c['k']:g}, k_learn={c['k_learn']:g}), d={power.delta / power.spread:.2f}s "
        f"n={c['n']}: {power.detected:.3f} of {power.episodes} episodes (sliding lb {lb_sliding:.3f}, frozen lb "
        f"{detection_prob_lower_bound(*args):.3f}, Gaussian frozen exact {detection_prob(*args):.3f}); honest "
        f"statistic skew {power.skew:.2f}, honest flags {power.honest_flags}"
    )
    return bool(ok), notes, lb_sliding, power.detected


def check(seed: int = 0) -> Result:
    """Bounds vs exact quadrature vs simulation on `_CASES`, then against the implementation.

    Reference (`_CASES`), asserted: lower bound <= exact (both detectors); exact within 4.5 SE of simulation;
    frozen <= refreshed (Jensen); where n - 1 <= floor((w - 1) / 4), the simulated sliding window (every
    unflagged value admitted) >= the sliding lower bound - 4.5 SE; on the last case the frozen detector's
    simulated power is below the geometric form. Implementation: `check_implementation`. Headline (the
    whole `sentinel` detector): bound = sliding lower bound, measured = its detection rate within n
    messages, margin = measured - bound.
    """
    rng = np.random.default_rng(seed)
    ok, notes = True, []
    for shift, k, window, n in _CASES:
        row = {}
        for mode in ("frozen", "refreshed"):
            refresh = mode == "refreshed"
            trials = min(20_000, _SIM_BUDGET // (window * (n if refresh else 1) + n))
            lower = detection_prob_lower_bound(shift, 1.0, k, window, n, refresh=refresh)
            exact = detection_prob(shift, 1.0, k, window, n, refresh=refresh)
            sim = simulate_detection(shift, 1.0, k, window, n, trials, rng, mode)
            tol = _Z * _se(exact, trials)
            ok &= lower <= exact + 1e-9 and abs(sim - exact) <= tol
            row[mode] = (lower, exact, sim, tol)
        ok &= row["frozen"][1] <= row["refreshed"][1] + 1e-9
        trials = _SIM_BUDGET // (window * n)
        sliding = simulate_detection(shift, 1.0, k, window, n, trials, rng, "sliding")
        note = f"sliding sim={sliding:.3f}"
        if _sliding_applies(window, n):
            lb_sliding = detection_prob_lower_bound(shift, 1.0, k, window, n, sliding=True)
            ok &= sliding >= lb_sliding - _Z * _se(lb_sliding, trials)
            note += f" (lb {lb_sliding:.3f})"
        notes.append(
            f"d={shift} k={k} w={window} n={n}: frozen lb={row['frozen'][0]:.3f} exact={row['frozen'][1]:.3f} "
            f"sim={row['frozen'][2]:.3f}; refreshed lb={row['refreshed'][0]:.3f} exact={row['refreshed'][1]:.3f}; "
            + note
        )
    geometric, frozen_sim, frozen_tol = row["refreshed"][0], row["frozen"][2], row["frozen"][3]
    ok &= frozen_sim + frozen_tol < geometric  # the geometric form is not a bound for a frozen fence
    notes.append(f"geometric form {geometric:.3f} > frozen sim {frozen_sim:.3f} on the last case")
    impl_ok, impl_notes, bound, measured = check_implementation(seed)
    return Result(
        name=NAME,
        statement=STATEMENT,
        bound=bound,
        measured=measured,
        margin=measured - bound,
        ok=ok and impl_ok and measured >= bound,
        detail="; ".join([*impl_notes, *notes]),
    )
