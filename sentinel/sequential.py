"""Sequential evidence per worker: a CUSUM of e-values from the detector's per-message p-values.

Why: a ban that waits for flags to pile up against a worker's peers (the peer test of `response.py`, a
hypergeometric test at p < 1e-5) needs ~17 flagged messages when each one halves the p-value: 12-14
steps for an attacker whose every message is flagged. A calibrated p-value carries far more than one bit:
a message at p = 1e-9 is much stronger evidence than one at 1e-3, and a run of messages at 1e-2 that is
never flagged is evidence too.

How: each message's p-value p (`Verdict.pvalue`, the tail probability of the message under the stream's
honest traffic) becomes an e-value e(p) = kappa p^(kappa - 1) (a p-to-e calibrator: E[e(p)] <= 1 for any
p that is uniform or larger under honest traffic, Vovk and Wang 2021) and the worker's statistic is Page's
CUSUM of log e: S <- max(0, S + log e(p)), positive increments capped per step (below). The worker is
banned when S >= h = ln(1 / alpha) (`response.sequential_alpha`, 1e-8). Under honest traffic log e drifts down (-0.8 per message at
kappa = 0.2) and S crosses h on average once per >= 1 / alpha messages per worker (the CUSUM's ARL0;
Ville's inequality bounds any excursion by alpha): a 176-worker mesh sending a million messages expects
<= 0.01 false bans even before the guards. On a uniform honest stream of 100,000 messages the statistic peaked
at 8.6-11.5 nats over four seeds (h = 18.4). Guards against what calibration cannot promise:

- cap: one step adds at most h / 2 to a worker, so no single step bans: not an extreme but honest
  microbatch, and not a stage-wide jump that hits the first microbatches of a step before the detector's
  consensus recognises it as drift (a 16 x 11 mesh leaving a loss plateau: every replica of its first
  stage at p ~ 1e-5 to 1e-10 for a step, a replica with two such messages banned within it);
- peers: a worker is banned only while a strict majority of the live peers of its stage stay below h / 2
  (an honest majority's statistics rise together under drift that the windows have not yet absorbed; an
  attacker's peers stay quiet), as the peer test's intersection-union rule. The responder weighs a whole
  step before it bans, and a peer counts by the highest its statistic reached in the step, so the guard does
  not depend on which replica's messages came first;
- settle: when the guard blocks a ban (a majority of the stage stood out too), every statistic of the stage
  keeps at most GUARD_SHARE of the threshold: what they gathered beyond it was drift, and left to decay at
  their own pace they cross the threshold one by one once the majority is quiet again (the same mesh, with
  a cap per message: six honest replicas banned within a step, seven steps after the jump). An attacker
  caught in such a step keeps half of its evidence;
- drift: a step in which the detector recognised a stage-wide shift in a stream (a verdict marked SHIFT: the
  honest majority of the sending stage anomalous together) adds nothing to that stream's senders;
- contamination: once a message of a microbatch looked anomalous (p < 0.01) in a step, the later messages
  of that microbatch (downstream activations, every gradient) carry its corruption through no fault of
  their senders: only their `relation_pvalue` (how a sender's output relates to the input it received,
  which upstream corruption does not move) counts for them.
"""

from __future__ import annotations

import math

KAPPA = 0.2  # the calibrator's exponent: weak evidence (p ~ 0.01-0.05) still counts, strong evidence grows as -log p
STEP_SHARE = 0.5  # one step adds at most this share of the threshold to a worker (no single step bans)
GUARD_SHARE = 0.5  # a peer "stands out too" above this share of the threshold
ANOMALOUS = 0.01  # a message with p below this taints the rest of its microbatch's path (this step)


def log_evalue(p: float) -> float:
    """log e(p) = log kappa + (1 - kappa) log(1 / p): the calibrator's e-value of one p-value, in nats."""
    return math.log(KAPPA) + (1.0 - KAPPA) * -math.log(max(p, 1e-300))


class SequentialEvidence:
    """Page's CUSUM of log e-values per worker, with the cap, the peer guard and the settling of the module
    docstring. The responder calls `begin_step`, then `update` for every message of the step, then
    `exceeds` for each worker of `due()`, and `settle` for a stage whose ban the guard blocked.

    One statistic per worker over both directions. One per direction was tried (issue-18 note): a gradient
    attacker's honest activations, p = 1 under Bonferroni and -1.6 nats each, no longer diluted its gradient
    evidence, and sparse held-out gradient attacks were banned 1-2 steps sooner; but that dilution is also an
    honest worker's margin against drift its windows have not absorbed, and without it an honest worker was
    banned on held-out text (a run of p ~ 0.01 on its gradients, then two relation outliers in two steps)."""

    def __init__(self, alpha: float):
        self.threshold = math.log(1.0 / alpha)
        self.step_cap = STEP_SHARE * self.threshold
        self.level: dict[str, float] = {}  # worker -> its CUSUM statistic S (nats)
        self.peak: dict[str, float] = {}  # worker -> the highest S of this step (its level at the start included)
        self._gain: dict[str, float] = {}  # worker -> positive evidence added this step (at most `step_cap`)

    def begin_step(self) -> None:
        self.peak.clear()
        self._gain.clear()

    def update(self, worker: str, p: float) -> float:
        """Add one message's evidence to the worker's statistic; returns the statistic."""
        s = self.level.get(worker, 0.0)
        self.peak.setdefault(worker, s)
        inc = log_evalue(p)
        if inc > 0:
            gained = self._gain.get(worker, 0.0)
            inc = min(inc, self.step_cap - gained)
            self._gain[worker] = gained + inc
        s = max(0.0, s + inc)
        self.level[worker] = s
        self.peak[worker] = max(self.peak[worker], s)
        return s

    def _top(self, worker: str) -> float:
        return max(self.level.get(worker, 0.0), self.peak.get(worker, 0.0))

    def due(self) -> list[str]:
        """Workers whose statistic reached the threshold this step (in the order they first sent)."""
        return [w for w, s in self.peak.items() if s >= self.threshold]

    def exceeds(self, worker: str, peers: list[str]) -> bool:
        """Whether the worker's statistic reached the threshold (this step) while a strict majority of its peers'
        stayed below GUARD_SHARE of it all step (no peers: its own statistic decides)."""
        if self._top(worker) < self.threshold:
            return False
        quiet = sum(self._top(p) < GUARD_SHARE * self.threshold for p in peers)
        return not peers or quiet >= len(peers) // 2 + 1

    def settle(self, workers: list[str]) -> None:
        """The statistics of `workers` (a stage whose ban the guard blocked) keep at most GUARD_SHARE of the threshold."""
        top = GUARD_SHARE * self.threshold
        for w in workers:
            for d in (self.level, self.peak):
                if w in d:
                    d[w] = min(d[w], top)

    def forget(self, worker: str) -> None:
        self.level.pop(worker, None)
        self.peak.pop(worker, None)
