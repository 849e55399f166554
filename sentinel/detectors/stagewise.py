"""SENTINEL: stagewise integrity verification by EMA baselines and adaptive fences (arXiv 2603.03592).

What it assumes about honest traffic: within one stream (boundary b, direction), honest messages of
nearby steps are exchangeable draws around a slowly drifting distribution — all replicas of a stage
hold the same weights (synchronous DP) and see i.i.d. microbatches. An honest warm-up of
`warmup_steps` steps (and at least `min_history` accepted messages per stream) builds the baselines.

Per stream:
    baseline   bias-corrected EMA of message signatures (decay beta_act forward, beta_grad backward)
    distances  message vs baseline (see `distances.py`)
    fences     Tukey fences over the last `window` learned values of each distance: the outer fence
               Q3 + k * IQR flags, the inner fence Q3 + k_learn * IQR gates learning (Tukey's
               "far out" and "outside" values): a message between the fences is accepted but does not
               teach the baseline (its verdict carries `outlier = 1`), so a persistent attack that stays
               just under the flag threshold cannot drag the baseline or widen the fences.
               `fence_scale: auto` (default) fences the magnitudes (l1, l2_normalized,
               sliced_wasserstein, z_mean) on their logarithms -- multiplicative fences for positive,
               right-skewed statistics whose spread grows with their level -- and the bounded ones
               (sign_flip_ratio, skewness) as they are; a discrete statistic's IQR is floored at its
               resolution (one flipped feature for sign_flip_ratio)
    tokens     before the signature, a token longer than `token_clip` x the message's median token
               norm is scaled down to that length (`distances.signature`): a few huge tokens (random
               masking rescales kept entries 1/q) cannot dominate every pooled statistic
    combine    any     flag if some distance is above its fence           (statistic: max_i e_i)
               vote    flag if >= vote_m distances are                    (statistic: vote_m-th largest e_i)
               weighted flag if sum_i w_i max(e_i, 0) > k                 (statistic: that sum)
    consensus  honest-majority drift detection (`_stage_shift`): when more than half of the honest
               replicas of the sending stage must be beyond the inner fence together, it is drift: a
               message no more anomalous than them is accepted and learned, even beyond the outer fence
    replays    an exact repeat of a relayed tensor is flagged as certain (`replay.py`)
with e_i = (d_i - Q3_i) / IQR_i (of log d_i for a log-fenced distance), so every rule reads
"statistic > k" and the logged `exceedance` score sweeps the whole ROC of the rule from one open-loop
run. A flagged message updates nothing.

Measured defaults (scenarios/paper/, see the issue note): combine `any` beats `vote` (which loses
every attack only one distance sees, e.g. x0.5 scaling, seen by sliced Wasserstein alone) and `weighted`
(six times the honest flag rate for the same recall); k = 4 keeps the clean-twin FPR at ~0.5% where
k = 3 gives ~1.3%; 32 slices catch gradient sign attacks that 16 miss at a deep boundary; an inner
fence at 2.5 (not Tukey's 1.5, whose selection lags the baseline behind honest drift: ~2% FPR on
quickstart after its learning-rate warm-up) and a 5-step consensus horizon keep every clean twin
measured at <= 0.3%. Log fences and token clipping took the clean-twin FPR under a 95% random mask
from 9.9% to 0% (each alone: 4.6%, 1.6%) and on the paper table from 0.07% to 0 (see the issue-6 note).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import torch

from sentinel.config import spec
from sentinel.detectors.base import Detector, Marker, Verdict
from sentinel.detectors.baseline import Baseline, Fences, SenderMedianBaseline
from sentinel.detectors.distances import (
    DISTANCES,
    MAGNITUDES,
    Projections,
    distances,
    layout,
    resolutions,
    signature,
)
from sentinel.detectors.replay import ReplayMemory
from sentinel.errors import ConfigError
from sentinel.registry import DETECTORS
from sentinel.transport.message import Message, Role

DistanceName = Literal["l1", "l2_normalized", "sign_flip_ratio", "sliced_wasserstein", "z_mean", "skewness"]


def fence_logs(cfg) -> tuple[bool, ...]:
    """Per distance: fenced on a log scale? (`fence_scale`: linear, log, or auto = log for the magnitudes)."""
    if cfg.fence_scale == "auto":
        return tuple(name in MAGNITUDES for name in cfg.distances)
    return (cfg.fence_scale == "log",) * len(cfg.distances)


class _Stream:
    """State of one (boundary, role) stream."""

    def __init__(self, cfg, beta: float, keep_full: bool):
        beta_var = 1.0 - 1.0 / cfg.window
        if cfg.baseline == "sender_median":
            self.baseline = SenderMedianBaseline(beta, beta_var, keep_full=keep_full)
        else:
            self.baseline = Baseline(beta, beta_var, keep_full=keep_full)
        self.fences = Fences(tuple(cfg.distances), cfg.window, cfg.k, log=fence_logs(cfg))
        self.flags = 0
        self.recent: dict[str, tuple[int, float]] = {}  # sender -> (step, statistic) of its latest message


@DETECTORS.register("sentinel")
class Sentinel(Detector):
    """SENTINEL: EMA baselines per boundary and direction, distances, adaptive Tukey fences (default detector).

    Threat model: a malicious sender may replace or perturb the tensor it sends; it cannot change what
    other workers send, and it sees only the detector's public state. Evasion below the fences (slow
    drift, mimicry of honest statistics) is out of reach of any statistical detector by design; exact
    replays of relayed tensors are caught by the replay memory.
    """

    checks_payload = True  # NaN / Inf and replays are checked here, from the signature (see verifier.py)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        beta_act: float = spec(0.9, ge=0, lt=1, help="EMA decay of forward (activation) baselines")
        beta_grad: float = spec(0.8, ge=0, lt=1, help="EMA decay of backward (gradient) baselines")
        baseline: Literal["pooled", "sender_median"] = spec(
            "pooled", help="a single EMA of the stream (the paper's), or one EMA per sender combined by the "
            "coordinate-wise median (robust to a malicious minority, but laggier: measured worse, see the note)")
        pooling: Literal["token_mean", "full"] = spec(
            "token_mean", help="pooled vector: per-feature mean over tokens, or the whole tensor")
        distances: tuple[DistanceName, ...] = spec(DISTANCES, help="distances compared with their fences")
        num_projections: int = spec(32, ge=1, le=1024, help="sliced Wasserstein: random directions")
        num_quantiles: int = spec(32, ge=2, le=1024, help="sliced Wasserstein: quantile levels per direction")
        max_tokens: int | None = spec(128, ge=8, help="tokens the higher moments and slices use (every s-th from a "
                                      "random offset); null: all. The pooled mean always uses all")
        window: int = spec(100, ge=8, help="accepted values per distance the fences are computed over")
        k: float = spec(4.0, gt=0, help="outer Tukey fence: flag above Q3 + k * IQR")
        k_learn: float = spec(2.5, ge=0, help="inner Tukey fence: only messages below Q3 + k_learn * IQR teach the "
                              "baseline (between the fences: accepted, not learned)")
        warmup_steps: int = spec(10, ge=0, help="steps during which the detector only learns")
        min_history: int = spec(16, ge=4, help="accepted messages a stream needs before it flags")
        combine: Literal["any", "vote", "weighted"] = spec("any", help="how per-distance fence tests combine")
        vote_m: int = spec(2, ge=1, help="combine=vote: distances that must exceed their fence")
        weights: tuple[float, ...] = spec((), help="combine=weighted: one weight per distance (default: equal)")
        fence_scale: Literal["linear", "log", "auto"] = spec(
            "auto", help="fences on the distances themselves, on their logarithms (multiplicative fences), or "
            "auto: log for the magnitudes (l1, l2_normalized, sliced_wasserstein, z_mean), linear for the bounded ones")
        token_clip: float | None = spec(
            10.0, gt=1, help="winsorise tokens longer than token_clip x the message's median token norm before the "
            "signature (robust to a few huge tokens, e.g. under random masking); null: off")
        replay_memory: int = spec(1000, ge=0, help="steps an exact replay of a relayed tensor is recognised; 0: off")
        consensus_horizon: int = spec(
            5, ge=0, help="steps a sender's latest statistic counts for honest-majority drift detection; 0: off")

    @classmethod
    def check_config(cls, cfg) -> list[tuple[str, str]]:
        """Cross-parameter rules (run at scenario validation)."""
        out = []
        if not cfg.distances:
            out.append(("distances", "needs at least one distance"))
        elif len(set(cfg.distances)) != len(cfg.distances):
            out.append(("distances", f"lists a distance twice: {list(cfg.distances)}"))
        if cfg.weights and len(cfg.weights) != len(cfg.distances):
            out.append(("weights", f"{len(cfg.weights)} weights for {len(cfg.distances)} distances: give one per "
                        "distance, in the same order, or none"))
        if cfg.weights and (min(cfg.weights) < 0 or sum(cfg.weights) <= 0):
            out.append(("weights", "must be >= 0 with a positive sum"))
        if cfg.combine == "vote" and cfg.vote_m > len(cfg.distances):
            out.append(("vote_m", f"{cfg.vote_m} votes needed but only {len(cfg.distances)} distances"))
        if cfg.k_learn > cfg.k:
            out.append(("k_learn", f"the inner fence ({cfg.k_learn}) must not exceed the outer one (k = {cfg.k})"))
        return out

    def __init__(self, config: Config | None = None, *, seed: int = 0, env=None):
        super().__init__(config, seed=seed, env=env)
        cfg = self.config
        self.names = tuple(cfg.distances)
        problems = self.check_config(cfg)
        if problems:  # scenario validation reports these with their path; this guards direct construction
            raise ConfigError([f"detector.{k}: {m}" for k, m in problems])
        w = np.asarray(cfg.weights if cfg.weights else [1.0] * len(self.names), dtype=float)
        self._weights = w / w.sum() * len(self.names) if cfg.weights else w
        self._streams: dict[tuple[int, int], _Stream] = {}
        self._proj: dict[int, Projections] = {}
        self._key = int(np.random.SeedSequence([seed, 0x70C]).generate_state(1, dtype=np.uint64)[0])  # private
        self._replays = ReplayMemory(cfg.replay_memory) if cfg.replay_memory else None

    # -- state ------------------------------------------------------------------------------------
    def _projections(self, dim: int) -> Projections:
        if dim not in self._proj:  # drawn once per feature width, from the scenario seed
            self._proj[dim] = Projections(dim, self.config.num_projections, self.config.num_quantiles, self.seed)
        return self._proj[dim]

    def _stream(self, boundary: int, role: Role) -> _Stream:
        key = (int(boundary), int(role))
        if key not in self._streams:
            beta = self.config.beta_act if role == Role.ACTIVATION else self.config.beta_grad
            keep_full = role == Role.GRADIENT and self.env.substitutes  # the EMA of whole payloads: a stand-in
            self._streams[key] = _Stream(self.config, beta, keep_full=keep_full)
        return self._streams[key]

    def _offset(self, msg: Message) -> int:
        """Which tokens the moments of this message look at: unpredictable to a sender without the detector's key.

        A keyed hash of the message's identity, not a generator shared by the streams: each stream's verdicts
        then depend on that stream's messages only, whatever order the streams of a boundary interleave in (a
        verifier process sees them in another order than sim's single process)."""
        return splitmix64(self._key ^ (((msg.step * 4099 + msg.mb_idx) * 131 + msg.boundary) * 3 + int(msg.role))) >> 34

    def _signature(self, payload: torch.Tensor, offset: int | None = None, msg: Message | None = None):
        proj = self._projections(payload.shape[-1])
        if offset is None:
            offset = self._offset(msg)
        sig = signature(payload, proj, self.config.pooling, self.config.max_tokens, offset, self.config.token_clip)
        return sig, layout(tuple(payload.shape), proj, self.config.pooling)

    @staticmethod
    def _learn(st: _Stream, sig: np.ndarray, lay, msg: Message) -> None:
        if isinstance(st.baseline, SenderMedianBaseline):
            st.baseline.update(sig, lay, msg.payload, sender=msg.sender, step=msg.step)
        else:
            st.baseline.update(sig, lay, msg.payload)

    def _comparable(self, st: _Stream, sig: np.ndarray) -> bool:
        return st.baseline.comparable(sig)

    @classmethod
    def threshold_rule(cls, config) -> dict:
        """Flag <=> exceedance > k; only messages below the inner fence k_learn teach the detector, so its
        state, and an open-loop run's verdict for any k >= k_learn, do not depend on k."""
        return {"key": "k", "statistic": "exceedance", "value": config.k, "warmup_steps": config.warmup_steps,
                "exact_from": config.k_learn}

    def statistic(self, exceed: np.ndarray) -> float:
        """The combined statistic: flagged <=> statistic > k (see module docstring)."""
        if self.config.combine == "any":
            return float(exceed.max())
        if self.config.combine == "vote":
            m = min(self.config.vote_m, len(exceed))
            return float(np.sort(exceed)[-m])
        return float((self._weights * np.maximum(exceed, 0.0)).sum())

    def _stage_shift(self, st: _Stream, step: int, e: float, level: float, stage: int) -> bool:
        """Honest-majority consensus: is this above-fence message part of a stage-wide shift?

        Let R be the live replicas of the sending stage and f = floor((R - 1) / 2) the most of them an
        honest majority leaves malicious. If at least f + floor((R - f) / 2) + 1 distinct senders were
        last (within `consensus_horizon` steps) above `level`, then more than half of the honest ones
        are, whoever the malicious ones are: this is honest drift (a learning-rate change, a new data
        regime), not an attack. The message is then treated as honest when it is no more anomalous than
        the (R - f)-th smallest recent statistic; an outlier beyond it is not. A stage of one replica has
        no peers to compare with: no consensus there (the paper's behaviour).
        """
        if not self.config.consensus_horizon or not np.isfinite(e):
            return False
        vals = sorted(v for s, v in st.recent.values() if step - s < self.config.consensus_horizon)
        live = self.env.live_replicas(stage) if self.env.live_replicas is not None else st.recent
        R = max(len(live), len(vals))
        if R < 2:
            return False
        f = (R - 1) // 2
        need = f + (R - f) // 2 + 1
        if sum(v > level for v in vals) < need:
            return False
        return e <= vals[min(R - f, len(vals)) - 1]

    # -- the detector -----------------------------------------------------------------------------
    def scores(self, boundary: int, role, payload: torch.Tensor) -> dict[str, float]:
        """Pure: no state moves, not even the token-sampling generator (it uses a fixed token subset, so on
        payloads of more than `max_tokens` tokens it estimates what `observe` would compute)."""
        st = self._streams.get((int(boundary), int(role)))
        if st is None:
            return {}
        sig, _ = self._signature(payload, offset=0)
        if not self._comparable(st, sig):
            return {}
        values = distances(sig, st.baseline.view(), self.names)
        d = dict(zip(self.names, values.tolist()))
        if st.fences.count:
            d["exceedance"] = self.statistic(st.fences.exceedance(values))
        return d

    def observe(self, msg: Message) -> Verdict:
        st = self._stream(msg.boundary, msg.role)
        sig, lay = self._signature(msg.payload, msg=msg)
        # NaN / Inf somewhere in the payload: never reaches any state. The float64 sum of a signature is finite
        # exactly when every entry is (entries are float32 values or a float64 square norm: no overflow)
        if not np.isfinite(np.add.reduce(sig)):
            return Verdict({}, True, frozenset({Marker.INTEGRITY}))
        if self._replays is not None and self._replays.seen_before((tuple(msg.payload.shape), sig[:64].tobytes()),
                                                                   msg.step):
            return Verdict({}, True, frozenset({Marker.REPLAY}))  # the pooled mean uses every token: equal only for a replay
        if not self._comparable(st, sig):  # first message of the stream (the Verifier rejects odd shapes)
            st.fences.set_resolution(resolutions(self.names, lay))
            self._learn(st, sig, lay, msg)
            return Verdict({}, False)
        values = distances(sig, st.baseline.view(), self.names)
        d = dict(zip(self.names, values.tolist()))
        t = st.fences.transform(values)  # on the fences' scale, once for the test and the window
        learn = True
        if st.fences.count >= self.config.min_history:
            e = d["exceedance"] = self.statistic(st.fences.exceedance(values, t))
            if msg.step < self.config.warmup_steps:  # honest warm-up: learn everything, flag nothing (the
                return self._accept(st, sig, lay, msg, values, d, t)  # statistic is still logged: peer tests use it)
            stage = msg.boundary if msg.role == Role.ACTIVATION else msg.boundary + 1  # the sender's stage
            st.recent[msg.sender] = (msg.step, e if np.isfinite(e) else np.inf)
            shift = e > self.config.k_learn and self._stage_shift(st, msg.step, e, self.config.k_learn, stage)
            if not e <= self.config.k and not shift:  # NaN counts as above the fence
                st.flags += 1
                return Verdict(d, True)
            learn = e <= self.config.k_learn or shift
            if shift:
                marks = frozenset({Marker.SHIFT})
            elif not learn:  # between the fences: accepted, not learned (soft evidence for the responder)
                marks = frozenset({Marker.OUTLIER})
            else:
                marks = frozenset()
            if learn:
                return self._accept(st, sig, lay, msg, values, d, t, marks)
            return Verdict(d, False, marks)
        return self._accept(st, sig, lay, msg, values, d, t)

    def _accept(self, st: _Stream, sig: np.ndarray, lay, msg: Message, values: np.ndarray, d: dict,
                t: np.ndarray, marks: frozenset = frozenset()) -> Verdict:
        """Accept and learn: the baseline and the fences take the message in (`t`: the values on the fences'
        scale)."""
        if np.isfinite(values).all():
            self._learn(st, sig, lay, msg)
            st.fences.push(values, t)
        return Verdict(d, False, marks)

    def thresholds(self, boundary: int, role) -> dict[str, float]:
        """Current fences of a stream (empty while it is still learning) and the combined rule's k."""
        st = self._streams.get((int(boundary), int(role)))
        if st is None or st.fences.count < self.config.min_history:
            return {}
        out = st.fences.thresholds() if self.config.combine == "any" else {}
        out["exceedance"] = self.config.k
        return out

    def substitute(self, msg: Message) -> torch.Tensor | None:
        """For a flagged gradient: the EMA of accepted gradients of its stream (the paper's response)."""
        st = self._streams.get((int(msg.boundary), int(msg.role)))
        full = st.baseline.full() if st is not None else None
        if full is None or full.shape != msg.payload.shape:
            return None
        return full.to(msg.payload.dtype)

    def public_state(self) -> dict:
        """Config, and per stream its fence thresholds and a baseline summary (never a verdict)."""
        streams = {}
        for (b, r), st in sorted(self._streams.items()):
            streams[f"{Role(r).label}/{b}"] = {
                "thresholds": st.fences.thresholds(), "window_fill": st.fences.count,
                "baseline": st.baseline.summary(), "flags": st.flags,
            }
        return {"config": dataclasses.asdict(self.config), "streams": streams}


def splitmix64(x: int) -> int:
    """A 64-bit mixing function (Steele et al., SplitMix64's finaliser): a keyed hash of small integers."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)
