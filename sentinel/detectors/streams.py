"""SENTINEL's state per stream (boundary, direction): baseline, calibration windows, relation tables, replay
memory, and the honest-majority drift test. Nothing here is shared between streams, so verifiers per boundary
(one process each on the distributed backend) hold exactly what one process would.
"""

from __future__ import annotations

import collections
import math

import numpy as np

from sentinel.detectors.baseline import Baseline, Fences, SenderMedianBaseline
from sentinel.detectors.calibration import SenderWindows
from sentinel.detectors.distances import DISTANCES, MAGNITUDES
from sentinel.detectors.replay import ReplayMemory
from sentinel.detectors.tokens import RELATION_STATS, IdRelation

_MASK = (1 << 64) - 1
UNIFORM_EVIDENCE = 1.0 / math.log(10.0)  # mean (and standard deviation) of -log10 p for a uniform p
EVIDENCE_CAP = 10.0  # `Stream.elevated`: one message counts at most this much evidence


def fence_logs(cfg, names: tuple[str, ...] | None = None) -> tuple[bool, ...]:
    """Per statistic: fenced on a log scale? (`fence_scale`: linear, log, or auto = log for the magnitudes)."""
    names = tuple(cfg.distances) if names is None else names
    if cfg.fence_scale == "auto":
        return tuple(name in MAGNITUDES for name in names)
    return (cfg.fence_scale == "log",) * len(names)


def shift_quorum(replicas: int) -> int:
    """How many of a stage's `replicas` live replicas must be anomalous together for the consensus to call it a shift
    (`Stream.stage_shift`): f + floor((R - f) / 2) + 1, f = floor((R - 1) / 2) the most malicious ones an honest
    majority leaves, so that more than half of the honest ones are, whoever the malicious ones are."""
    f = (replicas - 1) // 2
    return f + (replicas - f) // 2 + 1


def one_feeder(origins: list[tuple]) -> bool:
    """Whether messages with these origins (`SenderInputs.origin`: who sent the input, who sent the gradient) all
    received their input, or all their gradient, from one upstream worker."""
    for k in range(2):  # who sent the input; who sent the gradient
        got = {o[k] if len(o) > k else None for o in origins}
        if len(got) == 1 and None not in got:
            return True
    return False


def mix(*keys: int) -> int:
    """A 62-bit hash of non-negative integers (splitmix64 steps): the same in every process and run."""
    h = 0x9E3779B97F4A7C15
    for k in keys:
        h = (h ^ (int(k) & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & _MASK
        h ^= h >> 29
    return h >> 2


class Stream:
    """State of one (boundary, role) stream: nothing in it is shared with another stream."""

    def __init__(self, cfg, beta: float, keep_full: bool):
        beta_var = 1.0 - 1.0 / cfg.window
        if cfg.baseline == "sender_median":
            self.baseline = SenderMedianBaseline(beta, beta_var, keep_full=keep_full)
        else:
            self.baseline = Baseline(beta, beta_var, keep_full=keep_full)
        self.names: tuple[str, ...] = ()  # the statistics this stream computes (set by its first message)
        self.fences: Fences | SenderWindows | None = None
        self.ids: IdRelation | None = None  # the first stage's input is token ids: their running mean outputs
        self.replays = ReplayMemory(cfg.replay_memory) if cfg.replay_memory else None
        self.flags = 0
        self.outlier_at: dict[str, int] = {}  # sender -> step of its latest message above the learning level
        self.recent: dict[str, tuple[int, float]] = {}  # sender -> (step, statistic) of its latest message
        self.evidence: dict[str, collections.deque] = {}  # sender -> (step, evidence) of its recent messages
        self.fed: collections.deque = collections.deque()  # (step, statistic, origin) of recent messages, for the
        # consensus: who sent each one's inputs (`SenderInputs.origin`)
        self.latest_each: dict[str, tuple[int, np.ndarray]] = {}  # sender -> (step, per-statistic evidence) of its
        # latest message, and (step, per-statistic evidence, origin) of recent messages: `statistic_drift`
        self.fed_each: collections.deque = collections.deque()

    def setup(self, cfg, names: tuple[str, ...]) -> None:
        """Fix the stream's statistics: those of `cfg.distances` it can compute (`names`)."""
        self.names = names
        self.pooled = tuple(n for n in names if n in DISTANCES)
        self.relation = np.array([n in RELATION_STATS for n in names])
        if cfg.combine == "calibrated":
            self.fences = SenderWindows(names, cfg.window, fence_logs(cfg, names), recent=cfg.recent)
        else:
            self.fences = Fences(names, cfg.window, cfg.k, log=fence_logs(cfg, names))

    def outlier_due(self, sender: str, step: int, every: int, mark: bool) -> bool:
        """Whether `sender` may teach the windows an outlier at `step`: at most once every `every` steps. The clock
        restarts when it does, and at every outlier when `mark` (a message above the learning level)."""
        last = self.outlier_at.get(sender)
        due = last is None or step - last >= every
        if due or mark:
            self.outlier_at[sender] = step
        return due

    def note(self, sender: str, step: int, e: float, horizon: int) -> None:
        """Keep a judged message's evidence (-log10 p) for `horizon` steps (`elevated` reads them)."""
        q = self.evidence.setdefault(sender, collections.deque())
        q.append((step, min(e, EVIDENCE_CAP) if e == e else EVIDENCE_CAP))
        while q and step - q[0][0] >= horizon:
            q.popleft()

    def elevated(self, sender: str, step: int, horizon: int, z: float) -> bool:
        """Whether `sender`'s messages of the last `horizon` steps (at least two) average more evidence than uniform
        p-values would, by `z` standard errors: -log10 of a uniform p has mean and standard deviation 1 / ln 10 (at
        z = 3, two messages a step: 0.6-1.3% of steps elevated by chance). Each message counts at most EVIDENCE_CAP:
        one message at p = 1e-300 weighs as one at 1e-10 (among ten ordinary ones, either makes the sender elevated)."""
        got = [e for s, e in self.evidence.get(sender, ()) if step - s < horizon]
        if len(got) < 2:
            return False
        return sum(got) / len(got) > UNIFORM_EVIDENCE * (1.0 + z / math.sqrt(len(got)))

    def remember(self, step: int, e: float, origin: tuple, horizon: int) -> None:
        """Keep (step, statistic, who sent its inputs) of a message for `horizon` steps (the consensus reads them)."""
        while self.fed and step - self.fed[0][0] >= horizon:
            self.fed.popleft()
        if horizon:
            self.fed.append((step, e, origin))

    def remember_each(self, sender: str, step: int, evidence: np.ndarray, origin: tuple, horizon: int) -> None:
        """Keep a judged message's per-statistic evidence (-log10 of each statistic's own tail probability; 0 for a
        statistic without a value) for `horizon` steps (`statistic_drift` reads them)."""
        while self.fed_each and step - self.fed_each[0][0] >= horizon:
            self.fed_each.popleft()
        if horizon:
            self.latest_each[sender] = (step, evidence)
            self.fed_each.append((step, evidence, origin))

    def statistic_drift(self, step: int, sender: str, level: float, live: list[str] | None, horizon: int) -> bool:
        """The consensus of `stage_shift` one statistic at a time: whether the latest messages (within `horizon` steps)
        of at least `shift_quorum(R)` senders of the stage were beyond `level` on one statistic, `sender`'s latest no
        more so than the (R - f)-th smallest of them, and those beyond it did not all descend from one upstream worker.

        Why: a stage's honest drift often shows in one statistic (a relation that grows as the model leaves a
        training phase, the skewness of every gradient after a loss spike) on every replica, while the combined
        evidence, a Bonferroni minimum over every statistic, stays short of `stage_shift`'s level on some of them.
        The wave's leader then gathers evidence alone: on held-out C-header bytes (the built-in model, 8 x 96, a 4 x 3
        mesh, default training, seed 463) `match` on stage 2's activations went from ~0.1 to 0.5-0.8 on all three
        replicas over steps 20-24; one of them, the first reached, sent messages at p ~ 1e-8 and was banned at step
        22, while its peers' messages stood at p ~ 1e-2 to 4e-4 on `match` and 4e-3 to 0.2 combined (issue-18 note,
        stop 51). The sequential test settles the stream's senders that sent only accepted messages in such a step
        (`Marker.DRIFT`, sentinel/sequential.py: "drift").
        The same guards as `stage_shift`: the quorum needs more than half of the honest replicas, so no malicious
        minority makes it in its own stage; the message that shows it must not be the outlier beyond its peers; and
        a corruption that one upstream worker carries into every replica it feeds is not drift."""
        mine = self.latest_each.get(sender)
        if not horizon or mine is None:
            return False
        now = [v for w, (s, v) in self.latest_each.items() if step - s < horizon and (live is None or w in live)]
        R = max(len(live) if live is not None else len(self.latest_each), len(now))
        if R < 2:
            return False
        need = shift_quorum(R)
        if len(now) < need:
            return False
        latest = np.array(now)
        beyond = (latest > level).sum(axis=0) >= need
        if not beyond.any():
            return False
        k = min(R - (R - 1) // 2, len(now)) - 1  # the (R - f)-th smallest
        for j in np.flatnonzero(beyond).tolist():
            if mine[1][j] > np.sort(latest[:, j])[k]:
                continue
            if not one_feeder([o for s, v, o in self.fed_each if v[j] > level and step - s < horizon]):
                return True
        return False

    def stage_shift(self, step: int, e: float, level: float, live: list[str] | None, horizon: int) -> bool:
        """Honest-majority consensus: is this anomalous message part of a stage-wide shift?

        Let R be the live replicas of the sending stage (`live`; None: the senders seen) and f = floor((R - 1) / 2)
        the most of them an honest majority leaves malicious. If at least f + floor((R - f) / 2) + 1 distinct
        senders were last (within `horizon` steps) above `level`, then more than half of the honest ones are,
        whoever the malicious ones are: this is honest drift (a learning-rate change, a new data regime), not an
        attack. The message is then treated as honest when it is no more anomalous than the (R - f)-th smallest
        recent statistic; an outlier beyond it is not. A stage of one replica has no peers to compare with: no
        consensus there (the paper's behaviour).

        Not drift either: anomalous messages that all descend from one upstream sender (`origin`: every anomalous
        message of the horizon, not only each sender's latest, received its input, or every one its gradient, from
        the same worker; honest drift reaches a stage through all its feeders, and the more anomalous messages, the
        less likely they share one by chance). An upstream attacker whose tampering evades its
        own boundary can break the token relation of every replica it feeds: on `fence_evasion` (activations, seed 0)
        all of stage 2 went anomalous together (`align` 0.82-0.93 against ~0.02), the consensus learned it as drift,
        the broken relation then looked ordinary, and the backward of those microbatches (p ~ 1e-130) banned an honest
        receiver. Honest drift reaches the stage through every upstream replica.
        """
        if not horizon or not np.isfinite(e):
            return False
        vals = sorted(v for s, v in self.recent.values() if step - s < horizon)
        R = max(len(live if live is not None else self.recent), len(vals))
        if R < 2:
            return False
        need = shift_quorum(R)
        if sum(v > level for v in vals) < need:
            return False
        if one_feeder([o for s, v, o in self.fed if v > level and step - s < horizon]):  # every anomalous one
            return False
        return e <= vals[min(R - (R - 1) // 2, len(vals)) - 1]  # the (R - f)-th smallest
