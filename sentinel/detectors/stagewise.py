"""SENTINEL: stagewise integrity verification by EMA baselines and self-calibrated evidence (arXiv 2603.03592).

What it assumes about honest traffic: within one stream (boundary b, direction), honest messages of
nearby steps are exchangeable draws around a slowly drifting distribution -- all replicas of a stage
hold the same weights (synchronous DP) and see i.i.d. microbatches -- and a stage's output relates token by
token to the input it received (the residual stream). An honest warm-up of `warmup_steps` steps (and at
least `min_history` accepted messages per stream) builds the baselines. Nothing is shared between streams.

Per stream:
    baseline   bias-corrected EMA of message signatures (decay beta_act forward, beta_grad backward); token
               clipping first (a token longer than `token_clip` x the median is scaled down, `distances.py`)
    statistics pooled distances to the baseline (`distances.py`) and token-level relations to what the sender
               received (`tokens.py`: align, align_tail, gain_low, match, gain_centred on activations, retain and
               retain_high on gradients; token_norm and gain_high on request)
    calibrated (default) each statistic's tail probability under the stream's honest traffic, from a
               generalised Pareto tail fitted to a window of its last `window` accepted values (in the tail, the
               larger of that and the same fit to the `recent` latest values: drift faster than the window follows)
               (`calibration.py`; log scale for the magnitudes), Bonferroni-combined into the message's
               p-value; flagged when evidence = -log10 p > `level`. The verdict carries p (and the
               relation statistics' own p) for the response policy's sequential test (sentinel/sequential.py)
    fences     the paper-style rules: Tukey fences Q3 + k IQR over the same windows, e_i = (d_i - Q3_i) / IQR_i;
               combine any (max e_i > k), vote (vote_m-th largest), weighted (sum w_i max(e_i, 0))
    learning   a message at or below the learning level (`learn_level`, `k_learn`) teaches the baseline and
               the windows (a statistic of it at p < CAP_P on its own: capped, within the budget below); one
               above it never the baseline, and the windows only its values capped at each window's largest;
               a sender's outliers teach the windows once per FLAG_MEMORY steps (honest heavy tails thicken the
               window, a persistent attacker cannot stretch it)
    consensus  honest-majority drift detection (`streams.Stream.stage_shift`): when more than half of the honest replicas
               of the sending stage are anomalous together, it is drift: a message no more anomalous than
               them is accepted and learned; not when those messages all received their input (or their gradient)
               from one upstream worker (`SenderInputs.origin`): that is what that worker sent, not drift; the same
               one statistic at a time (`Stream.statistic_drift`, a statistic's own p < 1e-2 on the quorum) marks
               an accepted message DRIFT, which only the sequential test reads (the stream's accepted senders settle)
    replays    an exact repeat of a relayed tensor is flagged as certain (`replay.py`)
Every rule reads "statistic > threshold" and the logged statistic (`evidence`, or `exceedance` for the fences)
sweeps the rule's whole ROC from one open-loop run.

Measured (the issue-18 notes): the calibrated rule's honest FPR is 0-0.14% on the synthetic source and 0-0.49%
on byte-level text at the default level 3, gradients judged without l2_normalized (`gradient_skip`); the fences
at k = 4: 0.14% and 1.1-6.7%. The relation statistics see token permutations, sequence and microbatch
exchanges and few-token edits that no pooled statistic sees.
The fence rules' history: `any` beat `vote` and `weighted`; k = 4, k_learn = 2.5, log fences for magnitudes
and token clipping (issue-4 and issue-6 notes).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import numpy as np
import torch

from sentinel.config import spec
from sentinel.detectors import replay
from sentinel.detectors.base import Detector, Marker, Verdict
from sentinel.detectors.baseline import SenderMedianBaseline
from sentinel.detectors.calibration import SenderWindows, below_cap
from sentinel.detectors.distances import (
    DISTANCES,
    Projections,
    distances,
    layout,
    resolutions,
    signed,
)
from sentinel.detectors.streams import Stream, mix
from sentinel.detectors.tokens import (
    CARRY_RESOLUTION,
    CARRY_STATS,
    MATCH_RESOLUTION,
    NOT_ON_IDS,
    RELATION,
    RELATION_STATS,
    RETAIN_RESOLUTION,
    RETAIN_STATS,
    IdRelation,
    carry,
    has_reference,
    is_token_ids,
    reference_of,
    relation,
    sample_rows,
    token_norm,
)
from sentinel.errors import ConfigError
from sentinel.registry import DETECTORS
from sentinel.transport.message import Message, Role

DistanceName = Literal[
    "l1",
    "l2_normalized",
    "sign_flip_ratio",
    "sliced_wasserstein",
    "z_mean",
    "skewness",
    "token_norm",
    "align",
    "align_tail",
    "gain_low",
    "gain_high",
    "match",
    "gain_centred",
    "retain",
    "retain_high",
    "carry",
]
# The default: every pooled distance and the relation statistics. token_norm (max / median token norm) is left out:
# honest gradients of the last stage grow single huge tokens as the model learns (max / median from ~3 to 20-570
# on byte-level text within 50 steps), faster than any window follows; the relation's tail sees a few tampered tokens.
# gain_low sees a few tokens shrunk or zeroed (tokens.py). gain_high (tokens scaled up, over the tokens that received
# a typical magnitude) is left out too: judged by default it banned two gradient tokens scaled x10 in 3 steps instead
# of 34 on held-out text, but the realistic Llama's honest traffic outran its windows while the model trained (its
# trained activations grow single tokens by far more than the others) and the clean message FPR of 200-step runs rose
# from 0.44-0.87% to 0.69-1.77% (seeds 0-3), over the 1% the defaults aim at (issue-18 note, stop 30).
# match (another input token explains an output token better than its own) sees a token copied from a neighbour,
# which align_tail, on text, barely does (tokens.py; issue-18 note, stop 33). gain_centred (gain_low of the centred
# tokens) sees an activation token replaced by the message's mean token, whose direction and norm as sent barely move
# (tokens.py; issue-18 note, stop 42); gradients skip it (`gradient_skip`). retain (the share of its own input a token
# carries on) sees a gradient token turned away from what it received (random signs, a rotation), which align_tail's
# honest tail hides once the model trains (tokens.py; issue-18 note, stop 43); activations skip it (`activation_skip`).
# retain_high (a token carrying on more of its input than the median one) sees gradient tokens scaled up, which
# gain_high would see but is not judged (tokens.py; issue-18 note, stop 46); activations skip it too. carry (the cosine
# of a whole message with its sender's input over the entries both kept) sees signs flipped or scrambled on gradients
# where the codec drops entries, the only traffic it is judged on (tokens.py; issue-18 note, stop 47).
STATISTICS = DISTANCES + ("align", "align_tail", "gain_low", "match", "gain_centred", "retain", "retain_high", "carry")
FLAG_MEMORY = 10  # steps: a sender's outliers teach the windows (capped) at most once in this many
LOO_SENDERS = 3  # a sender is judged against its peers' traffic alone from this many live replicas (`SenderWindows`)
PEER_DRIFT_Z = 3.0  # ... while no peer's recent evidence exceeds uniform p-values' by this many standard errors
MIN_EVIDENCE = 40  # accepted values a window needs before its p-values feed the sequential test (8 above Q80)
DRIFT_EACH = 2.0  # a statistic's own evidence (-log10 p) beyond which a replica counts in a one-statistic consensus


def sender_stage(boundary: int, role) -> int:
    """The stage that sends a message across `boundary`: activations go b -> b + 1, gradients b + 1 -> b."""
    return int(boundary) if int(role) == int(Role.ACTIVATION) else int(boundary) + 1


@DETECTORS.register("sentinel")
class Sentinel(Detector):
    """SENTINEL: EMA baselines per boundary and direction, distances, adaptive Tukey fences (default detector).

    Threat model: a malicious sender may replace or perturb the tensor it sends; it cannot change what
    other workers send, and it sees only the detector's public state. Evasion below the fences (slow
    drift, mimicry of honest statistics) is out of reach of any statistical detector by design; exact
    replays of relayed tensors are caught by the replay memory.
    """

    checks_payload = True  # NaN / Inf (from the signature) and replays (`_replay_key`) are checked here (verifier.py)
    wants_inputs = True  # the relation statistics read what each sender received (DetectorEnv.sender_inputs)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        beta_act: float = spec(0.9, ge=0, lt=1, help="EMA decay of forward (activation) baselines")
        beta_grad: float = spec(0.8, ge=0, lt=1, help="EMA decay of backward (gradient) baselines")
        baseline: Literal["pooled", "sender_median"] = spec(
            "pooled",
            help="a single EMA of the stream (the paper's), or one EMA per sender combined by the "
            "coordinate-wise median (robust to a malicious minority, but laggier: measured worse, see the note)",
        )
        pooling: Literal["token_mean", "full"] = spec(
            "token_mean", help="pooled vector: per-feature mean over tokens, or the whole tensor"
        )
        distances: tuple[DistanceName, ...] = spec(
            STATISTICS,
            help="statistics judged: the pooled distances to the baseline and the token-level ones "
            "(tokens.py: align, align_tail, gain_low, match, gain_centred, retain and retain_high where the sender's "
            "input is known, carry where the codec also drops entries; token_norm and gain_high on request)",
        )
        gradient_skip: tuple[DistanceName, ...] = spec(
            ("l2_normalized", "gain_centred"),
            help="statistics of `distances` not judged on gradient streams (default l2_normalized: a "
            "gradient's pooled mean is near-zero noise except on microbatches whose tokens' gradients align, where "
            "it jumps 10-20x its recent RMS; l1 and z_mean carry its evidence; gain_centred: gain_low sees a "
            "gradient token faded toward the mean, and the centred gains' honest tail is heavy); []: judge them all",
        )
        activation_skip: tuple[DistanceName, ...] = spec(
            ("retain", "retain_high", "carry"),
            help="statistics of `distances` not judged on activation streams (default retain and retain_high: their "
            "honest activation tail drifts as the model trains, and align_tail sees an activation token turned away "
            "from its input once the windows hold trained traffic; carry: measured on gradients only); []: judge them "
            "all",
        )
        num_projections: int = spec(32, ge=1, le=1024, help="sliced Wasserstein: random directions")
        num_quantiles: int = spec(32, ge=2, le=1024, help="sliced Wasserstein: quantile levels per direction")
        max_tokens: int | None = spec(
            128,
            ge=8,
            help="tokens the higher moments, slices and match's pairs use (every s-th from a "
            "random offset); null: all. The pooled mean always uses all, and past the first stage so do align, "
            "align_tail and the gains, and match also compares every token with its neighbours",
        )
        window: int = spec(
            200,
            ge=8,
            help="accepted values per statistic the tail probabilities (or fences) are "
            "computed over (200: ~40 above the 80th percentile to fit the tail; 100 and 50 gave 1.6x and "
            "3x the honest flag rate on byte-level text)",
        )
        recent: int = spec(
            60,
            ge=0,
            help="calibrated: a value in its window's tail gets the larger of its tail probabilities under the "
            "window and under the window's `recent` latest values (honest traffic that drifts faster than the "
            "window follows, e.g. a model's training phase, is judged by where the stream is now); 0, or not "
            "below `window`: off",
        )
        k: float = spec(4.0, gt=0, help="outer Tukey fence: flag above Q3 + k * IQR")
        k_learn: float = spec(
            2.5,
            ge=0,
            help="inner Tukey fence: only messages below Q3 + k_learn * IQR teach the "
            "baseline (between the fences: accepted, not learned)",
        )
        warmup_steps: int = spec(10, ge=0, help="steps during which the detector only learns")
        min_history: int = spec(16, ge=4, help="accepted messages a stream needs before it flags")
        combine: Literal["calibrated", "any", "vote", "weighted"] = spec(
            "calibrated",
            help="calibrated: per-statistic tail probabilities (calibration.py) combined by Bonferroni, "
            "flag when -log10 p > level; any / vote / weighted: Tukey fences at k (the paper's rule and variants)",
        )
        level: float = spec(
            3.0,
            gt=0,
            help="calibrated: flag a message whose combined tail probability is below "
            "10^-level (the per-message false-alarm probability the rule aims at: 1e-3)",
        )
        learn_level: float = spec(
            3.0,
            ge=0,
            help="calibrated: only messages with -log10 p <= learn_level teach the "
            "baseline and the windows (between the levels: accepted, not learned); a flagged "
            "message teaches the windows its values capped at the flag level, never the baseline",
        )
        vote_m: int = spec(2, ge=1, help="combine=vote: distances that must exceed their fence")
        weights: tuple[float, ...] = spec((), help="combine=weighted: one weight per distance (default: equal)")
        fence_scale: Literal["linear", "log", "auto"] = spec(
            "auto",
            help="fences on the distances themselves, on their logarithms (multiplicative fences), or "
            "auto: log for the magnitudes (l1, l2_normalized, sliced_wasserstein, z_mean), linear for the bounded ones",
        )
        token_clip: float | None = spec(
            10.0,
            gt=1,
            help="winsorise tokens longer than token_clip x the message's median token norm before the "
            "signature (robust to a few huge tokens, e.g. under random masking); null: off",
        )
        replay_memory: int = spec(1000, ge=0, help="steps an exact replay of a relayed tensor is recognised; 0: off")
        consensus_horizon: int = spec(
            5, ge=0, help="steps a sender's latest statistic counts for honest-majority drift detection; 0: off"
        )

    @classmethod
    def check_config(cls, cfg) -> list[tuple[str, str]]:
        """Cross-parameter rules (run at scenario validation)."""
        out = []
        if not cfg.distances:
            out.append(("distances", "needs at least one distance"))
        elif len(set(cfg.distances)) != len(cfg.distances):
            out.append(("distances", f"lists a distance twice: {list(cfg.distances)}"))
        elif not set(cfg.distances) - set(cfg.gradient_skip):
            out.append(
                (
                    "gradient_skip",
                    f"leaves gradients no statistic of distances {list(cfg.distances)}: judge at least one "
                    "(e.g. gradient_skip: [])",
                )
            )
        elif not set(cfg.distances) - set(cfg.activation_skip):
            out.append(
                (
                    "activation_skip",
                    f"leaves activations no statistic of distances {list(cfg.distances)}: judge at least one "
                    "(e.g. activation_skip: [])",
                )
            )
        if cfg.weights and len(cfg.weights) != len(cfg.distances):
            out.append(
                (
                    "weights",
                    f"{len(cfg.weights)} weights for {len(cfg.distances)} distances: give one per "
                    "distance, in the same order, or none",
                )
            )
        if cfg.weights and (min(cfg.weights) < 0 or sum(cfg.weights) <= 0):
            out.append(("weights", "must be >= 0 with a positive sum"))
        if cfg.combine == "vote" and cfg.vote_m > len(cfg.distances):
            out.append(("vote_m", f"{cfg.vote_m} votes needed but only {len(cfg.distances)} distances"))
        if cfg.k_learn > cfg.k:
            out.append(("k_learn", f"the inner fence ({cfg.k_learn}) must not exceed the outer one (k = {cfg.k})"))
        if 0 < cfg.recent < 16:
            out.append(("recent", f"must be 0 (off) or at least 16 (a tail to fit), got {cfg.recent}"))
        if cfg.learn_level > cfg.level:
            out.append(
                (
                    "learn_level",
                    f"the learning level ({cfg.learn_level}) must not exceed the flag level (level = {cfg.level})",
                )
            )
        return out

    def __init__(self, config: Config | None = None, *, seed: int = 0, env=None):
        super().__init__(config, seed=seed, env=env)
        cfg = self.config
        self.names = tuple(cfg.distances)
        problems = self.check_config(cfg)
        if problems:  # scenario validation reports these with their path; this guards direct construction
            raise ConfigError([f"detector.{k}: {m}" for k, m in problems])
        w = np.asarray(cfg.weights if cfg.weights else [1.0] * len(self.names), dtype=float)
        self._weights = dict(zip(self.names, w / w.sum() * len(self.names) if cfg.weights else w))
        self._streams: dict[tuple[int, int], Stream] = {}
        self._proj: dict[int, Projections] = {}
        self._key = mix(seed, 0x70C)  # private: never in the public view (a real verifier's secret)
        self._fingerprint = replay.Fingerprint(seed)  # the exact-replay key (`_replay_key`)
        self._norms = np.empty(2)  # scratch: the (median^2, max^2) token norms of the message being judged
        self._rel = np.empty(len(RELATION))  # scratch: `relation`'s output
        self._ids_now: tuple[np.ndarray, np.ndarray] | None = None  # (projected sampled tokens, their ids): learned
        # with the message when it is accepted (first-stage streams only)

    # -- state ------------------------------------------------------------------------------------
    def _projections(self, dim: int) -> Projections:
        if dim not in self._proj:  # drawn once per feature width, from the scenario seed
            self._proj[dim] = Projections(dim, self.config.num_projections, self.config.num_quantiles, self.seed)
        return self._proj[dim]

    def _stream(self, boundary: int, role: Role) -> Stream:
        key = (int(boundary), int(role))
        if key not in self._streams:
            beta = self.config.beta_act if role == Role.ACTIVATION else self.config.beta_grad
            keep_full = role == Role.GRADIENT and self.env.substitutes  # the EMA of whole payloads: a stand-in
            self._streams[key] = Stream(self.config, beta, keep_full=keep_full)
        return self._streams[key]

    def _offset(self, msg: Message) -> int:
        """Which tokens the moments of `msg` look at: a keyed hash of the message identity, unpredictable to a
        sender and independent of every other stream (verifiers per boundary need no shared generator)."""
        return mix(self._key, msg.step, msg.mb_idx + 1, msg.boundary, int(msg.role)) >> 32

    def _signature(self, payload: torch.Tensor, offset: int):
        """(signature, its layout, the sum of its entries: finite exactly when the payload is)."""
        proj = self._projections(payload.shape[-1])
        sig, total = signed(
            payload, proj, self.config.pooling, self.config.max_tokens, offset, self.config.token_clip, self._norms
        )
        return sig, layout(tuple(payload.shape), proj, self.config.pooling), total

    def _learn(self, st: Stream, sig: np.ndarray, lay, msg: Message) -> None:
        if isinstance(st.baseline, SenderMedianBaseline):
            st.baseline.update(sig, lay, msg.payload, sender=msg.sender, step=msg.step)
        else:
            st.baseline.update(sig, lay, msg.payload)
        if st.ids is not None and self._ids_now is not None:
            st.ids.learn(*self._ids_now)

    def _comparable(self, st: Stream, sig: np.ndarray) -> bool:
        return st.baseline.comparable(sig)

    def _values(
        self, st: Stream, sig: np.ndarray, payload: torch.Tensor, reference, offset: int = 0, zeroed: bool = False
    ) -> np.ndarray:
        """The stream's statistics of one message, in `st.names` order (NaN: a relation with no reference). `zeroed`:
        its codec may drop tokens whole (`DetectorEnv.zeroed_roles`): the relation leaves zero tokens out."""
        got = dict(zip(st.pooled, distances(sig, st.baseline.view(), st.pooled).tolist()))
        got["token_norm"] = token_norm(self._norms)
        self._ids_now = None
        if st.ids is not None and is_token_ids(reference, payload):
            self._ids_now = self._sampled_ids(payload, reference, offset)
            ok = st.ids.judge(*self._ids_now, self._rel[:2])
            got["align"], got["align_tail"] = (float(v) for v in self._rel[:2]) if ok else (np.nan, np.nan)
        elif RELATION_STATS.intersection(st.names):
            ok = relation(payload, reference, self._rel, self.config.max_tokens, offset, zeroed)
            got.update(zip(RELATION, (float(v) for v in self._rel) if ok else (np.nan,) * len(RELATION)))
        if "carry" in st.names:  # only where the codec drops entries (`_first`)
            got["carry"] = carry(payload, reference)
        return np.array([got[n] for n in st.names])

    def _feeders(self, msg: Message) -> tuple:
        """Who sent the input and the gradient `msg`'s sender received (`SenderInputs.origin`), for the consensus
        (`Stream.stage_shift`); None for a feeding stage with fewer than two live replicas, where one feeder for every
        message is the topology, not a sign (its drift would otherwise never be recognised)."""
        got = self.env.sender_inputs(msg) if self.env.sender_inputs is not None else None
        if got is None:
            return ()
        b = msg.boundary
        stages = (b - 1, None) if msg.role == Role.ACTIVATION else (b, b + 2)
        live = self.env.live_replicas
        return tuple(
            w if w is not None and (live is None or len(live(s)) >= 2) else None for w, s in zip(got.origin, stages)
        )

    def _sampled_ids(self, payload: torch.Tensor, ids: torch.Tensor, offset: int) -> tuple[np.ndarray, np.ndarray]:
        """(projected sampled tokens (m, P), their input token ids (m,)) of the message just signed: the signature
        left the projections of the tokens it sampled in its workspace."""
        C = payload.shape[-1]
        rows = sample_rows(ids.numel(), self.config.max_tokens, offset)
        tok = ids.cpu().numpy().reshape(-1)[rows].astype(np.int64)
        z = self._projections(C).workspace(len(tok))[1].copy()
        return z, tok

    def _first(self, st: Stream, sig: np.ndarray, lay, msg: Message, offset: int) -> Verdict:
        """The stream's first message: fix which statistics it can compute, and learn."""
        ref = reference_of(self.env, msg)
        has_ref = has_reference(msg.payload, ref)
        self._ids_now = None
        skip = self.config.gradient_skip if msg.role == Role.GRADIENT else self.config.activation_skip
        if msg.role in self.env.zeroed_roles | self.env.projected_roles:  # a share would be the overlap of two masks,
            skip = (*skip, *RETAIN_STATS)  # or the update seen through a subspace
        if msg.role not in self.env.zeroed_roles:  # carry: only where the codec drops entries (tokens.py)
            skip = (*skip, *CARRY_STATS)
        if is_token_ids(ref, msg.payload):  # the first stage: the relation is to its input token ids
            st.ids = IdRelation(self.config.num_projections, self.config.beta_act)
            self._ids_now = self._sampled_ids(msg.payload, ref, offset)
            skip = (*skip, *NOT_ON_IDS)  # token ids: no magnitude to compare a gain with, no vectors to match
        has_ref = has_ref or st.ids is not None
        st.setup(self.config, tuple(n for n in self.names if (has_ref or n not in RELATION_STATS) and n not in skip))
        res = resolutions(st.names, lay)
        res[[i for i, n in enumerate(st.names) if n == "match"]] = MATCH_RESOLUTION
        res[[i for i, n in enumerate(st.names) if n in RETAIN_STATS]] = RETAIN_RESOLUTION
        res[[i for i, n in enumerate(st.names) if n in CARRY_STATS]] = CARRY_RESOLUTION
        st.fences.set_resolution(res)
        self._learn(st, sig, lay, msg)
        return Verdict({}, False)

    @classmethod
    def threshold_rule(cls, config) -> dict:
        """Flag <=> evidence > level (calibrated; exceedance > k for the fence rules); only messages at or below
        the learning level teach the detector, so its state, and an open-loop run's verdict for any threshold
        at or above it, do not depend on the threshold."""
        key, statistic, value, learn = cls._rule(config)
        return {
            "key": key,
            "statistic": statistic,
            "value": value,
            "warmup_steps": config.warmup_steps,
            "exact_from": learn,
        }

    @staticmethod
    def _rule(config) -> tuple[str, str, float, float]:
        """(config key, logged statistic, flag threshold, learning threshold) of the combine rule."""
        if config.combine == "calibrated":
            return "level", "evidence", config.level, config.learn_level
        return "k", "exceedance", config.k, config.k_learn

    def _judge(
        self, st: Stream, values: np.ndarray, sender: str | None = None, loo: bool = False
    ) -> tuple[np.ndarray, float, float | None, float | None, float]:
        """(values on the windows' scale, statistic, p-value, relation p-value, flag statistic) of one message: for
        `calibrated` the evidence -log10 p of the Bonferroni-combined tail probabilities (and of the relation
        statistics alone), against the windows without `sender`'s own values when `loo` (`SenderWindows`), and the
        flag's evidence, -log10 of the larger of that p and the p against the pooled windows; else the fence rule's
        exceedance statistic (no p-values), which is also the flag's.

        Why two: the message is flagged (dropped, a hard strike) only when it is far out against the pooled windows
        too, while the leave-one-out p alone feeds the sequential test, the learning rule and the drift tests. Both
        are valid p-values for an honest sender exchangeable with its peers, and so is the larger. The leave-one-out
        windows keep an accepted attacker's values out of its own reference (what they were built for), but they
        hold 2/3 of a 3-replica stage's traffic over 1.5x the steps, and with them alone the clean-twin message FPR of
        the paper table on byte-level text rose from 0.42, 0.42, 0.07% to 1.00, 0.63, 0.35% (seeds 0-2; issue-18
        note, stop 45, bisected to them). Flagging on both: 0.63, 0.28, 0.42%, paired -0.22 [-0.28, -0.15] points,
        with steps to ban +0.04 [-0.00, +0.08] (42 attacked runs, no measurable difference; stop 46). An attacker
        whose values the pooled windows learned is then flagged less, and banned by the sequential test as before."""
        if self.config.combine != "calibrated":
            t = st.fences.transform(values)
            e = self.statistic(st.fences.exceedance(values, t), st.names)
            return t, e, None, None, e
        t, p, p_rel, p_pooled = st.fences.judge(values, st.relation, sender, loo)
        flag = -math.log10(max(p, p_pooled, 1e-300))
        return t, -math.log10(max(p, 1e-300)), p, (p_rel if p_rel == p_rel else None), flag

    def statistic(self, exceed: np.ndarray, names: tuple[str, ...] | None = None) -> float:
        """The combined statistic: flagged <=> statistic > k (see module docstring). A statistic without a
        value (a relation whose reference is missing) takes no part."""
        exceed = np.where(np.isnan(exceed), -np.inf, exceed)  # only a relation without its reference is NaN here
        if self.config.combine == "any":
            return float(exceed.max())
        if self.config.combine == "vote":
            m = min(self.config.vote_m, len(exceed))
            return float(np.sort(exceed)[-m])
        w = np.array([self._weights[n] for n in (names or self.names)])
        return float((w * np.maximum(exceed, 0.0)).sum())

    # -- the detector -----------------------------------------------------------------------------
    def scores(self, boundary: int, role, payload: torch.Tensor, sender: str | None = None) -> dict[str, float]:
        """Pure: no state moves. It uses a fixed token subset (so on payloads of more than `max_tokens` tokens
        it estimates what `observe` would compute) and no sender input (the relation statistics are left out); the
        evidence is against the windows `observe` would judge `sender` by (`SenderWindows`; None: the pooled ones):
        what the sequential test reads, never below the flag's evidence `observe` logs (`_judge`), so a white-box
        attacker that keeps it under the level is neither flagged nor accumulates much."""
        st = self._streams.get((int(boundary), int(role)))
        if st is None or st.fences is None:
            return {}
        sig, _, _ = self._signature(payload, 0)
        if not self._comparable(st, sig):
            return {}
        values = self._values(st, sig, payload, None)
        d = {n: v for n, v in zip(st.names, values.tolist()) if not np.isnan(v)}
        if st.fences.count:
            d[self._rule(self.config)[1]] = self._judge(st, values, sender, self._loo(st, boundary, role, sender))[1]
        return d

    def _loo(self, st: Stream, boundary: int, role, sender: str | None, step: int | None = None) -> bool:
        """Whether `sender`'s message is judged against the windows without its own values (`SenderWindows`): when at
        least LOO_SENDERS live replicas of its stage are exchangeable with it, itself included (`DetectorEnv.cohort`;
        without a mesh view: the senders the stream has seen), and none of those peers is drifting. An async
        straggler, or a replica whose weights diverge from its peers' (sparse averaging), differs from them honestly:
        it keeps the pooled windows, which hold its own values too.

        Drifting: a peer whose messages over the last `consensus_horizon` steps average more evidence than uniform
        p-values would by PEER_DRIFT_Z standard errors (`Stream.elevated`). Why: in a drift the whole stage shares, a
        sender's own values say as much about where the stream is going as its peers' do, and windows without them
        learn it a third slower (a 3-replica stage). On `compression/attacks_async.yaml` (seed 4, the clean twin)
        stage 2's gradients drifted over steps 18-30 (gain_low 0.30 -> 0.42 on all three replicas, never all three
        above the consensus level at once, so the drift was never learned as a shift): the leave-one-out windows
        flagged 1.22% of the honest messages, the pooled ones 0.26%, these 0.37%. Any one drifting peer, not a majority
        (0.74%): the drift reaches the replicas one after another. An attacker's peers are honest, and their evidence
        is that of uniform p-values (elevated on ~1% of steps by chance): it keeps the leave-one-out windows, except
        while an honest peer drifts, where it is judged as before the sender windows."""
        stage = sender_stage(boundary, role)
        live = self.env.live_replicas(stage) if self.env.live_replicas is not None else None
        if live is None:
            seen = getattr(st.fences, "others", ())
            if len(seen) < LOO_SENDERS:
                return False
            peers = [w for w in seen if w != sender]
        else:
            cohort = self.env.cohort
            if cohort is not None and sender is not None:
                mine = cohort(sender)
                live = [w for w in live if cohort(w) == mine]
            if len(live) < LOO_SENDERS:
                return False
            peers = [w for w in live if w != sender]
        now = step if step is not None else max((s for s, _ in st.recent.values()), default=0)
        horizon = self.config.consensus_horizon
        return not any(st.elevated(w, now, horizon, PEER_DRIFT_Z) for w in peers)

    def _replay_key(self, payload: torch.Tensor) -> tuple:
        """What a replay repeats exactly (`replay.Fingerprint`): 64 fixed, seeded entries of the payload as sent, or a
        digest of every entry where one of them is zero (a sparse payload). The key used to be the signature's head,
        the pooled mean: it depends on which tokens the moments sample (a message offset) where tokens are clipped or
        the width is under 64, and a replay of a 256-token message was caught on 1 of 4 messages; and under top-k 1% on
        byte-level text (4 x 64, seed 5) a first stage's kept entries (82 of 8,192) all sat in one feature whose massive
        activation was nearly constant across tokens, and two honest messages of one step had equal pooled means while
        their entries differed: a "certain" replay, and an honest replica banned (issue-18 note, stop 45)."""
        return self._fingerprint(payload)

    def observe(self, msg: Message) -> Verdict:
        st = self._stream(msg.boundary, msg.role)
        offset = self._offset(msg)
        sig, lay, total = self._signature(msg.payload, offset)
        # NaN / Inf somewhere in the payload: never reaches any state. A signature is finite exactly when the payload
        # is (`signature` recomputes a finite payload whose float32 moments overflow at a power-of-two scale), and
        # its float64 sum exactly when every entry is (float32 values or a float64 square norm)
        if not math.isfinite(total):
            return Verdict({}, True, frozenset({Marker.INTEGRITY}))
        if st.replays is not None and st.replays.seen_before(self._replay_key(msg.payload), msg.step):
            return Verdict({}, True, frozenset({Marker.REPLAY}))
        if not self._comparable(st, sig) or st.fences is None:  # first message (the Verifier rejects odd shapes)
            return self._first(st, sig, lay, msg, offset)
        zeroed = msg.role in self.env.zeroed_roles
        values = self._values(st, sig, msg.payload, reference_of(self.env, msg), offset, zeroed)
        d = {n: v for n, v in zip(st.names, values.tolist()) if v == v}  # NaN: a relation without a reference
        if st.fences.count < self.config.min_history:
            return self._accept(st, sig, lay, msg, values, d, st.fences.transform(values))
        _, name, k, k_learn = self._rule(self.config)
        t, e, p, p_rel, e_flag = self._judge(
            st, values, msg.sender, self._loo(st, msg.boundary, msg.role, msg.sender, msg.step)
        )  # t: windows' scale; e: the leave-one-out evidence; e_flag <= e: the flag's (logged)
        d[name] = e_flag
        if msg.step < self.config.warmup_steps:  # honest warm-up: learn everything, flag nothing, and give the
            return self._accept(st, sig, lay, msg, values, d, t)  # sequential test no evidence (still logged)
        if self.config.combine == "calibrated":  # the peers' drift test of `_loo` (after the warm-up, as flags)
            st.note(msg.sender, msg.step, e, self.config.consensus_horizon)
        if st.fences.count < MIN_EVIDENCE:  # a tail fitted to so few values is no evidence to accumulate
            p = p_rel = None
        stage = sender_stage(msg.boundary, msg.role)
        latest = e if math.isfinite(e) else math.inf
        st.recent[msg.sender] = (msg.step, latest)
        feeders, horizon = self._feeders(msg), self.config.consensus_horizon
        st.remember(msg.step, latest, feeders, horizon)
        if p is not None:  # each statistic's own evidence, for the consensus one statistic at a time
            each = np.nan_to_num(-np.log10(np.maximum(st.fences.last_p, 1e-300)), nan=0.0)
            st.remember_each(msg.sender, msg.step, each, feeders, horizon)
        drift = k_learn / 2 if self.config.combine == "calibrated" else k_learn  # "part of a stage-wide drift" above
        live = self.env.live_replicas(stage) if self.env.live_replicas is not None else None
        shift = e > k_learn and st.stage_shift(msg.step, e, drift, live, self.config.consensus_horizon)
        if not e <= k_learn and not shift:  # NaN counts as above: the baseline will not learn it, the windows may
            self._learn_outlier(st, msg, values, t)
        if not e_flag <= k and not shift:  # NaN counts as above the fence
            st.flags += 1
            return Verdict(d, True, pvalue=p, relation_pvalue=p_rel)
        learn = e <= k_learn or shift
        if shift:
            marks = frozenset({Marker.SHIFT})
        elif not learn:  # between the fences: accepted, not learned (soft evidence for the responder)
            marks = frozenset({Marker.OUTLIER})
        else:
            marks = frozenset()
        if not shift and p is not None and st.statistic_drift(msg.step, msg.sender, DRIFT_EACH, live, horizon):
            marks |= {Marker.DRIFT}  # the stage drifts in one statistic: for the sequential test, not for learning
        if learn:
            return self._accept(st, sig, lay, msg, values, d, t, marks, p, p_rel, judged=not shift)
        return Verdict(d, False, marks, pvalue=p, relation_pvalue=p_rel)

    @staticmethod
    def _take_outlier_budget(st: Stream, msg: Message, p: np.ndarray) -> bool:
        """Whether an accepted message with a statistic at p < CAP_P may teach it (capped) to its window, and if so
        spend the sender's budget: once every FLAG_MEMORY steps, shared with flagged messages (`_learn_outlier`)."""
        return not below_cap(p) or st.outlier_due(msg.sender, msg.step, FLAG_MEMORY, mark=False)

    def _learn_outlier(self, st: Stream, msg: Message, values: np.ndarray, t: np.ndarray) -> None:
        """A message above the learning level (flagged at the default levels) never teaches the baseline; its values
        teach the windows capped at each window's largest value (`TailCalibrator.push_capped`), at most once per
        sender every `FLAG_MEMORY` steps: honest outliers from any sender thicken a tail that was too light, a
        sender caught again and again does not. Only the learning level decides this, so the detector's state
        (and an open-loop run's verdicts at every level >= learn_level) does not depend on the flag level."""
        due = st.outlier_due(msg.sender, msg.step, FLAG_MEMORY, mark=True)
        if due and isinstance(st.fences, SenderWindows) and not np.isnan(values).any():
            st.fences.push_capped(t, msg.sender)

    def _accept(
        self,
        st: Stream,
        sig: np.ndarray,
        lay,
        msg: Message,
        values: np.ndarray,
        d: dict,
        t: np.ndarray,
        marks: frozenset = frozenset(),
        p: float | None = None,
        p_rel: float | None = None,
        judged: bool = False,
    ) -> Verdict:
        """Accept and learn: the baseline and the fences take the message in (`t`: the values on the fences'
        scale; a message missing a statistic teaches the baseline but not the fences)."""
        if all(map(math.isfinite, values.tolist())):  # builtins: between training operations numpy's calls cost more
            self._learn(st, sig, lay, msg)
            if judged and isinstance(st.fences, SenderWindows):  # a judged value learns capped (push_judged)
                each = st.fences.last_p  # the message's per-statistic tail probabilities
                st.fences.push_judged(t, each, self._take_outlier_budget(st, msg, each), msg.sender)
            elif isinstance(st.fences, SenderWindows):
                st.fences.push(values, t, msg.sender)
            else:
                st.fences.push(values, t)
        elif not np.isinf(values).any():  # only a relation is missing (NaN): the pooled baseline still learns
            self._learn(st, sig, lay, msg)
        return Verdict(d, False, marks, pvalue=p, relation_pvalue=p_rel)

    def thresholds(self, boundary: int, role) -> dict[str, float]:
        """Current fences of a stream (empty while it is still learning) and the combined rule's k."""
        st = self._streams.get((int(boundary), int(role)))
        if st is None or st.fences is None or st.fences.count < self.config.min_history:
            return {}
        if self.config.combine == "calibrated":  # each statistic's value at the Bonferroni share of the level
            out = dict(zip(st.names, st.fences.level(10**-self.config.level / len(st.names)).tolist()))
            out["evidence"] = self.config.level
            return out
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
            if st.fences is None:
                continue
            streams[f"{Role(r).label}/{b}"] = {
                "thresholds": self.thresholds(b, r),
                "window_fill": st.fences.count,
                "baseline": st.baseline.summary(),
                "flags": st.flags,
            }
        return {"config": dataclasses.asdict(self.config), "streams": streams}
