"""Sequential evidence per worker and direction: a CUSUM of e-values from the detector's per-message p-values.

Why: a ban that waits for flags to pile up against a worker's peers (the peer test of `response.py`, a
hypergeometric test at p < 1e-5) needs ~17 flagged messages when each one halves the p-value: 12-14
steps for an attacker whose every message is flagged. A calibrated p-value carries far more than one bit:
a message at p = 1e-9 is much stronger evidence than one at 1e-3, and a run of messages at 1e-2 that is
never flagged is evidence too.

How: each message's p-value p (`Verdict.pvalue`, the tail probability of the message under the stream's
honest traffic) becomes an e-value e(p) = kappa p^(kappa - 1) (a p-to-e calibrator: E[e(p)] <= 1 for any
p that is uniform or larger under honest traffic, Vovk and Wang 2021) and the worker's statistic is Page's
CUSUM of log e: S <- max(0, S + log e(p)), positive increments capped per step (below), one statistic per
worker and direction (its activations, its gradients). The worker is banned when either reaches
h = ln(2 / alpha) (`response.sequential_alpha`, 1e-8; the 2 is a union bound over its two statistics). Under
honest traffic log e drifts down (-2.0 per uniform p at kappa = 0.05, -3.0 at p = 1) and S crosses h on average
once per >= 2 / alpha messages per worker (the CUSUM's ARL0; Ville's inequality bounds any excursion by
alpha / 2 per statistic): a 176-worker mesh sending a million messages expects <= 0.01 false bans even before
the guards. On a uniform honest stream of 100,000 messages the statistic peaked at 1.9-3.4 nats over four seeds
(h = 19.1). Guards against what calibration cannot promise:

- cap: one step adds at most h / 2 to a statistic, so no single step bans: not an extreme but honest
  microbatch, and not a stage-wide jump that hits the first microbatches of a step before the detector's
  consensus recognises it as drift (a 16 x 11 mesh leaving a loss plateau: every replica of its first
  stage at p ~ 1e-5 to 1e-10 for a step, a replica with two such messages banned within it). One message adds
  at most h / 2 while its stage is quiet (its common level, below, or the median of its replicas' recent messages
  no higher than a uniform p's), and at most h / 3 while the stage drifts or too few of its replicas sent to tell:
  then no two messages ban either. On the realistic Llama
  (200 steps) the middle stages' gradients had single honest microbatches at p = 1e-19 and 2e-6 in consecutive
  steps on one replica, while the stage drifted: a false ban with h / 2 per message. The windows' tail is
  calibrated to ~1e-5 (P(p < 1e-5) / 1e-5 = 3.8 on held-out honest traffic), beyond which a p-value says "far
  out", not how far. In a quiet stage the strict cap only slowed attackers: a sparse one (a third of its messages
  tampered, each flagged) lost to its honest messages' drain (p = 1, -3.0 nats each) most of what its tampered
  ones earned, and took 12-27 steps on held-out text. The median makes a small stage's verdict robust: the mean of
  one of a 3-replica stage's honest replicas over five steps (~7 messages) turns positive on a few p ~ 1e-3, and an
  attacker sparse on activations took 15 steps under the strict cap (5.8 with the median, seeds 0-2; over seeds 0-7
  11.2 and 7.5, faster on 3 seeds and the same on 5: issue-18 note, stop 30).
  The mean is robust where the median is not: a dense attacker's messages can be most of a step's (a microbatch
  exchange then took a step longer on the median alone). So mean and median both have to say so. The median is the
  worker's peers': its own messages do not make its stage look drifting. Pooled, a dense attacker's capped messages
  raised the median of a 3-replica stage whose replicas send about one message a step each, and its messages counted
  under the strict cap less the common level: on held-out reStructuredText (a 5 x 3 mesh, random routing, seed 571) a
  gradient attacker at p ~ 1e-9 to 1e-19 gained ~5.5 nats a message and took 7 steps (issue-18 note, stop 54). A stage's tail
  can drift while its mean and median stay put: on held-out text (Python source, 12 layers, a 6 x 4 mesh, step
  ~100 of 150) the four replicas of a stage each sent a message at p ~ 5e-5 to 4e-9 within six steps, and one of
  them two in consecutive steps, which banned it under the quiet cap. So the stage also drifts when a strict
  majority of its live replicas sent a message at p <= TAIL_P (1e-4) over the horizon: an attacker's honest peers
  seldom do (a calibrated p <= 1e-4 is one message in thousands), so it keeps the quiet cap. The level has to show
  beyond the noise of the messages it is measured on (each replica's mean less one standard error, SPREAD / sqrt(n),
  SPREAD = 0.95 nats the spread of a uniform p's log e-value): on the first judged step of the paper table (seed 4,
  random signs on gradients) one honest message at p = 0.33, 0.12 nats above a uniform p's mean, made stage 1 drift,
  the attacker kept for a step disturbed its peers' statistics over the guard, and it was banned 13 steps in
  instead of 1;
- no sparse chart: a second CUSUM per worker for an attacker that tampers a share q of its messages, with the
  e-value 1 - q + q [p <= p*] / p* (q = 1/3, p* = 3e-6: -0.41 nats per ordinary message instead of -3.0, so two
  extreme messages with up to eight others between them ban), took the sparse rows of held-out text from 6.6, 5.1
  and 8.9 steps to 4.9, 3.3 and 4.9 (seeds 0-15), and banned an honest replica on 2 of the 16 seeds: in a stage
  left with two replicas, its gradients sent two messages at p ~ 1e-6 within three steps while the stage looked
  quiet. Honest far-out messages cluster on one replica; only the slow drain keeps two of them from banning;
- peers' tail: an anomalous message (p < ANOMALOUS) counts as if its p-value were no lower than r min(1, r / own),
  where r is how often the worker's live stage peers sent a message as far out over the last PEER_HORIZON (30) steps
  (each peer's share of its own messages in the stream, counted once such messages fall in PEER_EVENTS (2) different
  steps) and own the worker's share over the last OWN_HORIZON (10) steps. "As far out" is at p or below, and at TAIL_P
  (1e-4) or below for a message beyond it: past the windows' calibrated tail a p-value of 1e-14 is not more surprising
  than one of 1e-5. Both came from false bans of honest replicas once the windows followed their streams' drift
  (`recent` in `calibration.py`), which took the stage-wide part of the evidence away and left the bursts: in 12-layer
  models' training phases (held-out Python source and BPE copyright text, C headers, 6 x 4 meshes) a replica's stream
  sent three to five messages at p ~ 1e-4 to 1e-42 within 3-7 steps while its peers sent such messages every 10-30
  steps (p ~ 1e-5 to 1e-37), each compared at its own p and over 10 steps: no rate. Replayed over the recorded
  evidence of 12 honest 80-150-step runs and 48 attacked ones (issue-18 note, stop 34): honest bans 9 -> 0 (4 in the
  honest runs, 5 before the attack began in late-attack runs); the 116 attackers whose attack began at step 10 banned
  at the same steps; of 40 whose attack began in a drifting phase (step 45 of 80), one a step sooner and 3 not yet by
  the step their recorded run banned them. The own share is taken over 10 steps rather than 30, so an attacker's
  honest past does not dilute its current rate. Honest far-out messages come in waves that reach a stage's replicas
  one by one: on held-out text (C headers, byte-level, 12 layers, a 6 x 4 mesh) a stage's gradients sent messages at p
  ~ 1e-7 to 1e-14 on three of four replicas over ten steps, never on a majority within five (the drifting-tail rule),
  and the replica that sent four, with few messages between to drain, was banned; in another run a stage's activations
  did the same at p ~ 1e-4 to 1e-6. A message no more extreme than what its peers send now is little evidence; one
  sent q times as often as they send such messages keeps a factor q (an attacker whose every message is as extreme as
  its honest peers' rare ones still gains). A single far-out message of a peer is not a rate: counted, one honest
  peer's message at p ~ 5e-7 held a random-sign gradient attacker at p ~ 5e-6 (the paper table, seed 4) for seven
  steps. Nor is a single step's burst: on held-out C-header bytes (the built-in model, 8 x 96, a 4 x 3 mesh, seed 463)
  an honest replica sent two messages at p ~ 1e-8 in step 20, at the onset of a drift in one statistic, and floored a
  later activation attacker's messages, at p ~ 1e-7 to 1e-15, to p ~ 1e-1 to 4e-3 for ten steps (issue-18 note, stop
  52). r is the m-th largest of the peers' shares, m = ceil(peers / 2): what at least half of the peers show, and
  while a strict majority of the stage is honest at most f - 1 <= m - 1 of an attacker's peers attack too (f =
  floor((R - 1) / 2)), so colluders cannot vouch for each other. Nor can one honest peer's burst speak for its stage:
  with m = max(1, peers // 2), one peer of three (a 4-replica stage) set the rate, and on held-out HTML bytes (5
  layers x 80 on a 5 x 4 mesh, seed 141) one honest replica's burst of gradient messages around step 20 floored an
  attacker's, at p ~ 1e-12 to 1e-27, to p ~ 1e-2 for 17 steps, the same under five different gradient attacks
  (issue-18 note, stop 49; on 3- and 5-replica stages ceil(peers / 2) = max(1, peers // 2)). Only anomalous messages:
  raised everywhere, an ordinary message's drain moved with its peers' noise and a sparse attacker on held-out text
  took 1.5 steps longer on one seed. The cost: an attacker no more extreme than what its honest peers sent lately
  waits until that leaves the horizon (at most PEER_HORIZON steps); every figure of the paper table, the token class,
  the wrapped attacks and the 16 x 11 mesh stayed the same (issue-18 note, stop 32);
- common level: evidence a whole stage shares is nobody's (`SequentialEvidence.weigh_step`). The honest drift
  of a stage can outrun the windows without a stage-wide jump: on the same model the middle stages' gradient
  relation (1 - cos per token) grew 4-6x over 40 steps, every replica's p-values sat at 0.03-0.5 instead of
  uniform (about -0.8 nats a message instead of -2.05) with extreme messages now and then, and the statistics that
  should drain between them did not. So each step, per stage and direction, the level c that a strict majority
  of the live replicas averaged per message over the last DRIFT_HORIZON steps, less a uniform p's mean, is
  taken out of every message of the stage (when positive). Under an honest majority c is at most an honest
  replica's excess: an attacker whose peers are quiet loses nothing but their noise (~0.3 nats a message);
- peers: a worker is banned only while a strict majority of the live peers of its stage stay at or below h / 2
  (an honest majority's statistics rise together under drift that the windows have not yet absorbed; an
  attacker's peers stay quiet), as the peer test's intersection-union rule. At h / 2 exactly a peer has one
  extreme message of a quiet stage behind it, which does not block the ban (it did: a sparse gradient attacker on
  held-out text was then settled to h / 2 and banned 23 steps later). The responder weighs a whole
  step before it bans, and a peer counts by the highest its statistic reached in the step, so the guard does
  not depend on which replica's messages came first;
- settle: when the guard blocks a ban (a majority of the stage stood out too), every statistic of the stage
  keeps at most GUARD_SHARE of the threshold: what they gathered beyond it was drift, and left to decay at
  their own pace they cross the threshold one by one once the majority is quiet again (the same mesh, with
  a cap per message: six honest replicas banned within a step, seven steps after the jump). An attacker
  caught in such a step keeps half of its evidence;
- defer: every worker that reaches the threshold waits one step, for its stage's consensus. Honest drift reaches a
  stage's replicas one after another, and its first replica can reach the threshold before any peer has moved: on
  held-out man pages (the built-in model, 12 x 64, a 6 x 4 mesh, seed 943) s1r2's gradients at p ~ 4e-3, 8e-8 and
  6e-6 in steps 57-59 of a quiet stage banned it at step 60, and its three peers sent messages at p ~ 2e-5 to 2e-7
  over steps 61-64 (issue-18 note, stop 56). If in the step it waits the detector recognises a stage-wide shift in the
  worker's stream (a verdict marked SHIFT: its honest majority anomalous together), or the worker and the peers that
  rose (when it reached the threshold or since) make the detector's consensus quorum (`streams.shift_quorum`: f +
  floor((R - f) / 2) + 1 of R live replicas, f = floor((R - 1) / 2): 3 of 3 or 4, 4 of 5, 8 of 11), its statistics
  and its peers' settle as under a blocked ban; if a peer that had not risen yet rises, it waits on (the wave reached
  another replica; at most one more step per peer); otherwise it is banned, a step after it reached the threshold,
  wherever its statistic stands by then: the wait is for the stage's verdict, not for more of the worker's evidence.
  Judged on its statistic again, a sparse attacker whose honest messages drained it under the threshold in the step
  it reached it escaped, and climbed again: held-out byte-level text's sparse gradient attackers (seeds 0-2) took
  12.5-12.7 steps instead of 7.8-8.0, one of them 25 instead of 13 (issue-18 note, stop 57). A peer rose when its
  statistic stands at DEFER_SHARE (a quarter) of the threshold or above, short of it (a peer at the threshold is
  judged itself), or when it sent a message the detector would flag at its default level, p < FLAGGED_P (1e-3), in
  the step or the one before (as sent). The cost is a step
  on every ban: on held-out C-header bytes (the built-in model 6 x 48 on a 6 x 3 mesh and a Qwen2 4 x 96 on 4 x 3, 120
  attackers) +1.24 [+1.02, +1.45] and +0.75 [+0.35, +1.15] steps to ban (issue-18 note, stop 57). Until stop 57 a ban
  waited only while the rising peers left the stage one replica short of the quorum, which missed a wave's first
  replica whose peers had not moved yet (the man-page run above, and one in 18 honest runs of held-out set 8).
  Honest waves took longer still: on held-out text (Python source, 12 layers, a 6 x 4 mesh, seed 21) one replica's
  gradients climbed to the threshold over steps 94-97 while a peer stood at 0.32 of it, and the detector recognised
  the shift at step 98. The quorum keeps attackers from holding each other's bans: under an honest majority an
  attacker has at most f - 1 colluders, fewer than the peers needed, and a colluder rising in the step its ban waits
  holds it one more step at most. With any one peer enough, co-attackers on a 16 x 11 mesh (30% malicious) held each
  other: median steps to ban 2.08 -> 2.58 over six runs. A flagged message is a rise because the wave's first replica
  sets the peers' tail that floors the next one's messages: on byte-level text with one layer a stage
  (`compression/honest_codecs.yaml`, no codec, seed 0) stage 2's gradients sent two messages at p ~ 1e-7 on one
  replica in steps 40-41, which banned it, while in step 41 a peer sent one at 6e-4 (its statistic unmoved) and the
  other two peers followed at 2e-3 to 1e-4 over steps 42-43. At p < 0.01 an honest peer's ordinary message (2.7e-3)
  held a token-copying attacker on the paper mesh's text for a step (issue-18 note, stop 44). A wave can take longer
  than a step to reach the quorum: on held-out Perl bytes (GPT-2, 8 x 128, a 4 x 4 mesh, seed 363) stage 2's
  activations sent flagged messages on two replicas in step 13, on one of them in steps 14-15 (which reached the
  threshold), on a third in step 16 and on the fourth in step 17, when the detector recognised the shift (issue-18
  note, stop 52). A replica that sends about one message a step (random routing over 3 replicas) often sends none in
  the step its peer reaches the threshold, hence the step before: on held-out Markdown (Node.js docs, BPE 1536, GPT-2
  6 x 96, a 4 x 3 mesh, seed 851) s2r2 sent a message at 1e-6 in step 17 and none in step 18, when s2r0 reached the
  threshold, a step before the stage's shift was recognised (issue-18 note, stop 55);
- drift: a step in which the detector recognised a stage-wide shift in a stream (a verdict marked SHIFT: the honest
  majority of the sending stage anomalous together) adds nothing to that stream's senders, their statistics in that
  direction settle (at most GUARD_SHARE of the threshold: what they gathered lately was the drift's onset), and the
  stage counts as drifting for the next DRIFT_HORIZON steps (the strict cap per message, less the common level). Its
  peers' tail restarts: the far-out messages the stage sent before were the shift's onset, which the windows have
  learned since, not the rate its traffic shows now. Kept, one honest replica's two messages at p ~ 3e-5 in steps
  12-13 (held-out C-header bytes, the built-in model 6 x 48 on a 6 x 3 mesh, seed 902; shift recognised at step 17)
  floored an attacker's activations from step 20, every message flagged at p ~ 1e-7 to 1e-13, to p ~ 1e-2, and the
  peer test banned it 14 steps in instead of 2 (issue-18 note, stop 56). On held-out text (HTML bytes, 12 layers, a 6
  x 4 mesh, seed 161) a stage's activations drifted over steps 84-93: random routing gave one replica 11 of the
  stage's 24 messages in steps 86-91, two of them at p ~ 1e-5 and three at 2e-3 to 5e-5, while its peers sent a few at
  1e-2 to 4e-4; the detector recognised the shift at step 90, and at step 91 one more message at 6e-6 banned the
  replica (its peers' statistics at 0, 0 and 0.23, so the guard let it through). The consensus needs an honest
  majority anomalous together, which no malicious minority can produce in its own stream
  (`streams.Stream.stage_shift`), so an attacker's evidence settles only where its honest peers drift as well. A step
  in which the detector recognised a drift in one statistic (a verdict marked DRIFT, `streams.Stream.statistic_drift`:
  the majority beyond p = 1e-2 in it, their combined evidence short of the consensus's level) settles, and adds
  nothing to, the stream's senders that sent only accepted messages in it that step: the drift's participants; a
  sender flagged there in that step stands beyond the drift and keeps its evidence, and no drifting period follows.
  The participants' messages stay the stage's traffic (`weigh_step`'s `observed`): they set its common level, its
  quiet tests and its peers' tail as any message does. Left out, they took the drift out of the stage's record: on
  held-out Markdown (GPT-2, as above, seed 852) stage 2's activations drifted in one statistic over steps 19-21, the
  peers' messages were explained, the stage looked quiet on their earlier calm ones, and the replica beyond the drift
  (p ~ 3e-8 to 2e-5) gained half the threshold a message and was banned at step 21 (issue-18 note, stop 55). On
  held-out C-header bytes (the built-in model, 8 x 96, a 4 x 3 mesh, seed 463) a stage's `match` rose on all three
  replicas over steps 20-24, the first one reached sent messages at p ~ 1e-8 and was banned at step 22 while its
  peers' combined p-values stood at 4e-3 to 0.2 (issue-18 note, stop 51). Read as a shift of the whole stage, the same
  marker settled attackers whose flagged messages lay in another statistic than their stage's honest drift (held-out
  Perl bytes, GPT-2: steps to ban +0.75 [+0.01, +1.49] over 48 attackers);
- budget: under an honest majority a stage of R founding replicas holds at most max(1, floor((R - 1) / 2)) malicious
  ones, plus every worker added to it since (replacements, a banned operator rejoining under a new id). Once that many
  of its workers are banned, banning one more means at least one earlier ban was false (probability <= alpha each), so
  the worker's statistic needs 1 + (bans + 1 - budget) thresholds (`Responder._times`; twice the threshold right after
  the stage's share is spent). Why: after its attacker's ban a 3-replica stage has two replicas left, too few for the
  drift rules, the common level or the peers' guard to tell a wave from an attack. On held-out reStructuredText (BPE
  1536, 10 x 80, a 5 x 3 mesh, seed 571) the honest s1r0 was banned at step 35, twelve steps after its stage's
  attacker: its gradients at p ~ 5e-3 to 5e-10 over steps 31-35 while the one replica beside it rose to p ~ 1e-3
  (issue-18 note, stop 53). The rule changes nothing before a stage's share is banned, so no attacker of a stage within
  the honest-majority assumption waits longer; an attacker beyond it (a stage with a malicious majority) waits for
  twice the evidence;
- contamination: once a message of a microbatch looked anomalous (p < 0.01) in a step, the later messages
  of that microbatch (downstream activations, every gradient) carry its corruption through no fault of
  their senders: only their `relation_pvalue` (how a sender's output relates to the input it received,
  which upstream corruption does not move) counts for them.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
import statistics
from collections.abc import Iterable, Mapping

KAPPA = 0.05  # the calibrator's exponent: p < 0.043 counts for, p = 1e-3 is +3.6 nats, strong evidence grows as -log p
STEP_SHARE = 0.5  # one step adds at most this share of the threshold to a statistic (no single step bans)
MESSAGE_SHARE = 1 / 3  # one message adds at most this share while its stage drifts (no two messages ban)
QUIET_MESSAGE_SHARE = 0.5  # ... and at most this share while its stage is quiet (`weigh_step`)
DRIFT_HORIZON = 5  # steps over which a stage's common level of evidence is measured (`weigh_step`)
# the mean log e-value of a uniform p-value (-2.05 nats): honest traffic's drain
UNIFORM = math.log(KAPPA) + 1.0 - KAPPA
UNIFORM_MEDIAN = math.log(KAPPA) + (1.0 - KAPPA) * math.log(2.0)  # ... and its median (-2.34)
SPREAD = 1.0 - KAPPA  # ... and its standard deviation (0.95 nats: -log p of a uniform p is Exp(1))
GUARD_SHARE = 0.5  # a peer "stands out too" above this share of the threshold (at it: one quiet message)
DEFER_SHARE = 0.25  # a peer whose statistic stands at this share of the threshold has risen (`risen`)
TAIL_P = 1e-4  # a stage most of whose replicas sent a message this far out lately drifts (`weigh_step`)
PEER_HORIZON = 30  # steps over which a message's peers' rate of messages as far out is measured (`weigh_step`)
OWN_HORIZON = 10  # ... and the worker's own rate (its current one: an attacker's honest past does not dilute it)
PEER_EVENTS = 2  # ... counted for a peer that sent such messages in this many steps (one event is not yet a rate)
ANOMALOUS = 0.01  # a message with p below this taints the rest of its microbatch's path (this step)
FLAGGED_P = 1e-3  # a peer that sent a message this far out lately has risen (`risen`): the default flag level
RISE_STEPS = 2  # ... lately: in this step or the previous one


def log_evalue(p: float) -> float:
    """log e(p) = log kappa + (1 - kappa) log(1 / p): the calibrator's e-value of one p-value, in nats."""
    return math.log(KAPPA) + (1.0 - KAPPA) * -math.log(max(p, 1e-300))


class SequentialEvidence:
    """Page's CUSUM of log e-values per worker and direction, with the cap, the peer guard and the settling of the
    module docstring. The responder calls `begin_step`, then `weigh_step` with every message of the step (which
    `update`s each, less its stage's common level), then `exceeds` for each (worker, stream) of `due()`, and
    `settle` for a stage whose ban the guard blocked.

    One statistic per worker and stream (`streams` of them per worker: its directions), each at the threshold
    ln(streams / alpha), so a worker's chance of a false ban stays below alpha (a union bound over its streams).
    Why per stream: in one statistic per worker, a gradient attacker's honest activations (p = 1 under Bonferroni)
    diluted its gradient evidence, and an activation attacker's honest gradients its activation evidence: dense
    gradient attacks took 3 steps instead of 2, sparse ones 6.5-8.7 (issue-18 note, stop 26). The other direction
    was also an honest worker's margin against a run of weak p-values (p ~ 0.01 for ten steps on one honest
    replica's gradients, held-out text; a false ban at kappa = 0.2 and 0.15): kappa = 0.05 instead of 0.2 restores
    it (p = 1 costs 3.0 nats instead of 1.6, p = 0.01 earns 1.4 instead of 2.1, p = 1e-3 3.6 instead of 3.9). Replayed
    on the same recorded p-values, the highest honest statistic fell from 1.11 of the threshold to 0.62 on held-out
    text and from 0.72 to 0.50 on the main set, at the same speed."""

    def __init__(self, alpha: float, streams: int = 1):
        self.threshold = math.log(streams / alpha)
        self.step_cap = STEP_SHARE * self.threshold
        self.message_cap = MESSAGE_SHARE * self.threshold
        self.quiet_message_cap = QUIET_MESSAGE_SHARE * self.threshold
        self._tail = min(log_evalue(TAIL_P), self.message_cap)  # the capped log e-value of a message at TAIL_P
        self._history: collections.deque = collections.deque(maxlen=DRIFT_HORIZON)  # per step: (stage, stream) ->
        # worker -> its messages' log e-values (capped), for the stage's common level (`weigh_step`)
        self._sent: collections.deque = collections.deque(maxlen=PEER_HORIZON)  # the same with the p-values
        self._shifts: collections.deque = collections.deque(maxlen=DRIFT_HORIZON)  # per step: shifted (stage, stream)
        self.level: dict[tuple[str, int], float] = {}  # (worker, stream) -> its CUSUM statistic S (nats)
        self.peak: dict[tuple[str, int], float] = {}  # the highest S of this step (its level at the start included)
        self._gain: dict[tuple[str, int], float] = {}  # positive evidence added this step (at most `step_cap`)

    def begin_step(self) -> None:
        self.peak.clear()
        self._gain.clear()

    def update(self, worker: str, p: float, stream: int = 0, common: float = 0.0, cap: float | None = None) -> float:
        """Add one message's evidence (capped at `cap`, by default `message_cap`; less the stage's `common` level, see
        `weigh_step`) to the worker's statistic of `stream`; returns the statistic."""
        key = (worker, stream)
        s = self.level.get(key, 0.0)
        self.peak.setdefault(key, s)
        inc = min(log_evalue(p), self.message_cap if cap is None else cap) - common
        if inc > 0:
            gained = self._gain.get(key, 0.0)
            inc = min(inc, self.step_cap - gained)
            self._gain[key] = gained + inc
        s = max(0.0, s + inc)
        self.level[key] = s
        self.peak[key] = max(self.peak[key], s)
        return s

    def weigh_step(
        self,
        messages: Iterable[tuple[str, int, int, float]],
        live: Mapping[int, Iterable[str]],
        shifts: Iterable[tuple[int, int]] = (),
        explained: Iterable[tuple[str, int]] = (),
        observed: Iterable[tuple[str, int, int, float]] = (),
    ) -> None:
        """`update` with one step's messages, (worker, stage, stream, p) in order, less each stream's common level.
        `shifts`: the (stage, stream) pairs in which the detector recognised a stage-wide shift this step (their
        messages are not among `messages`): their live replicas' statistics settle, their peers' tail restarts, and they
        drift for DRIFT_HORIZON steps (the module docstring's "drift"). `explained`: (worker, stream) whose evidence
        this step is a drift in one statistic that the detector recognised (their messages of that stream are not among
        `messages` either): those statistics settle. `observed`: those messages, (worker, stage, stream, p) as
        `messages`: they update nobody, but they are the stage's traffic, so its common level, its quiet tests and its
        peers' tail see them.

        A stage's common level in a stream is the highest c such that a strict majority of its live replicas (`live`:
        stage -> workers) averaged at least UNIFORM + c nats per message (capped) over the last DRIFT_HORIZON steps: how
        far above a uniform p's mean the majority stands (unknown when fewer of them sent). The stage is quiet where
        c <= 0 or the median of those replicas' messages over the horizon (capped log e-values, pooled; for a worker's
        message its peers' alone, so that its own do not make its stage drift) is at most a uniform p's median,
        UNIFORM_MEDIAN, unless a strict majority of them sent a message at p <= TAIL_P over the
        horizon (a drifting tail): its messages count in full, up to `quiet_message_cap`. Otherwise (drifting,
        or unknown) each counts up to `message_cap`, less c when positive. The median is robust where the mean is not
        (a few moderate honest p-values of one replica: 3 of 6 messages at p ~ 1e-3 in a 3-replica stage), the mean
        where the median is not (a dense attacker sending most of a step's messages). Under an honest majority c is
        at most an honest replica's excess,
        so an attacker whose honest peers are quiet keeps its evidence (less their noise), while evidence that the whole
        stage shares (honest traffic drifting faster than the windows follow, which lowers every replica's p-values
        together) counts for nobody. An anomalous message's p-value is first raised to its peers' recent rate of
        messages as far out (`_peer_rate`, the module docstring's "peers' tail")."""
        messages = list(messages)
        self._shifts.append(set(shifts))
        for stage, stream in self._shifts[-1]:
            self.settle(list(live.get(stage, ())), stream)
            for past in self._sent:  # the far-out messages before it were the shift's onset, not its rate now
                past.pop((stage, stream), None)
        for worker, stream in explained:
            self.settle([worker], stream)
        shifted = set().union(*self._shifts)  # recognised shifts of the horizon
        now: dict[tuple[int, int], dict[str, list[float]]] = {}
        sent: dict[tuple[int, int], dict[str, list[float]]] = {}
        for worker, stage, stream, p in itertools.chain(messages, observed):
            now.setdefault((stage, stream), {}).setdefault(worker, []).append(min(log_evalue(p), self.message_cap))
            sent.setdefault((stage, stream), {}).setdefault(worker, []).append(p)
        self._history.append(now)
        self._sent.append(sent)
        sorted_sent: dict = {}  # (stage, stream) -> its replicas' sorted recent p-values, for `_peer_rate`
        common: dict[tuple[int, int], float] = {}  # the level beyond UNIFORM (where it is known)
        quiet: set[tuple[int, int]] = set()
        quiet_for: dict[tuple[int, int], set[str]] = {}  # (stage, stream) -> workers whose peers look quiet
        for stage, stream in now:
            replicas = set(live.get(stage, ()))
            if len(replicas) < 2:
                continue
            recent: dict[str, list[float]] = {}  # live replica -> its capped log e-values over the horizon
            for past in self._history:
                for w, v in past.get((stage, stream), {}).items():
                    if w in replicas:
                        recent.setdefault(w, []).extend(v)
            need = len(replicas) // 2 + 1
            if len(recent) >= need:
                level = sorted((sum(v) / len(v) for v in recent.values()), reverse=True)[need - 1]
                common[stage, stream] = level - UNIFORM
                # ... and what the majority's messages show beyond a uniform p's noise (one standard error each)
                low = sorted((sum(v) / len(v) - SPREAD / math.sqrt(len(v)) for v in recent.values()), reverse=True)
                tails = sum(max(v) >= self._tail for v in recent.values())  # replicas with a message at p <= TAIL_P
                if (stage, stream) not in shifted and tails < need:
                    if low[need - 1] <= UNIFORM:
                        quiet.add((stage, stream))
                    else:  # the median of the worker's peers' messages, without its own
                        quiet_for[stage, stream] = {
                            w
                            for w in recent
                            if (others := [x for u, v in recent.items() if u != w for x in v])
                            and statistics.median(others) <= UNIFORM_MEDIAN
                        }
        for worker, stage, stream, p in messages:
            if p < ANOMALOUS:  # no more surprising than what its honest peers send now
                p = max(p, self._peer_rate((stage, stream), worker, p, live, sorted_sent))
            if (stage, stream) in quiet or worker in quiet_for.get((stage, stream), ()):  # uniform p-values or better
                self.update(worker, p, stream, 0.0, self.quiet_message_cap)
            else:  # drifting, or too few replicas sent to tell: the strict cap, less the common level
                self.update(worker, p, stream, max(0.0, common.get((stage, stream), 0.0)))

    def _peer_rate(self, key: tuple[int, int], worker: str, p: float, live: Mapping, cache: dict) -> float:
        """The p-value floor of `worker`'s message at `p` in `key` = (stage, stream): r min(1, r / own), where r is how
        often the worker's live peers sent a message at p or below over the last PEER_HORIZON steps (this one
        included), each peer's share of its own messages (0 for a peer that sent them in fewer than PEER_EVENTS
        steps), the m-th largest of them with m = ceil(peers / 2), what at least half of the peers show: at most m - 1
        of an attacker's peers are attackers too while a strict majority of the stage is honest, so colluders cannot
        vouch for each other, and one bursty peer of three is not its stage's rate; own is the worker's own share over
        the last OWN_HORIZON steps. "As far out" means at p or below, or at TAIL_P or below for a message beyond TAIL_P:
        the windows' tail is calibrated to about 1e-5, beyond which a p-value says far out, not how far. `cache` keeps
        each stage's sorted p-values (all, and each step's lowest) for the rest of the step."""
        ordered = cache.get(key)
        if ordered is None:  # live replica -> its p-values over the horizon, and its lowest of each step, sorted
            ordered = cache[key] = {
                w: (
                    sorted(x for past in self._sent for x in past.get(key, {}).get(w, ())),
                    sorted(min(past[key][w]) for past in self._sent if w in past.get(key, {})),
                )
                for w in live.get(key[0], ())
            }
        q = max(p, TAIL_P)
        peers = [w for w in ordered if w != worker]
        m = max(1, (len(peers) + 1) // 2)
        counts = (
            (bisect.bisect_right(ps, q), len(ps), bisect.bisect_right(lows, q))
            for w in peers
            for ps, lows in [ordered[w]]
        )
        shares = sorted((k / n if steps >= PEER_EVENTS else 0.0 for k, n, steps in counts if n), reverse=True)
        r = shares[m - 1] if len(shares) >= m else 0.0
        if r == 0.0:
            return r
        recent = itertools.islice(self._sent, max(0, len(self._sent) - OWN_HORIZON), None)
        mine = [x for past in recent for x in past.get(key, {}).get(worker, ())]
        if not mine:
            return r
        own = sum(x <= q for x in mine) / len(mine)  # > 0: this message is in it
        return r * min(1.0, r / own)

    def _top(self, key: tuple[str, int]) -> float:
        return max(self.level.get(key, 0.0), self.peak.get(key, 0.0))

    def due(self) -> list[tuple[str, int]]:
        """(worker, stream) whose statistic reached the threshold this step (in the order they first sent)."""
        return [k for k, s in self.peak.items() if s >= self.threshold]

    def exceeds(self, worker: str, peers: list[str], stream: int = 0) -> bool:
        """Whether the worker's statistic of `stream` reached the threshold (this step) while a strict majority of
        its peers' (of the same stream) stayed at or below GUARD_SHARE of it all step (no peers: its own statistic
        decides)."""
        return self._top((worker, stream)) >= self.threshold and self.alone(peers, stream)

    def alone(self, peers: list[str], stream: int = 0) -> bool:
        """Whether a strict majority of `peers` stayed at or below GUARD_SHARE of the threshold in `stream` all step
        (no peers: True): the guard of `exceeds`."""
        quiet = sum(self._top((p, stream)) <= GUARD_SHARE * self.threshold for p in peers)
        return not peers or quiet >= len(peers) // 2 + 1

    def reached(self, worker: str, stream: int = 0, times: float = 1.0) -> bool:
        """Whether the worker's statistic of `stream` reached `times` the threshold (this step, or before and still
        there). `times` > 1: a ban that would mean an earlier ban of its stage was false (the responder's `_times`, the
        module docstring's "budget")."""
        return self._top((worker, stream)) >= times * self.threshold

    def risen(self, peers: list[str], stream: int) -> list[str]:
        """Those of `peers` that rose in `stream` this step, short of the threshold (a peer at it is judged itself: two
        attackers that reach it together do not hold each other's ban). A peer rose when its statistic stood at
        DEFER_SHARE of the threshold or above, or when it sent a message at p < FLAGGED_P in the last RISE_STEPS steps,
        this one included (`weigh_step`'s p-values as sent)."""
        # the last RISE_STEPS steps' p-values as sent: before the peers' tail floor, which a wave's leader sets for the
        # peers it reaches next
        now: dict[str, list[float]] = {}
        for sent in itertools.islice(self._sent, max(0, len(self._sent) - RISE_STEPS), None):
            for (_, k), by in sent.items():
                if k == stream:
                    for w, ps in by.items():
                        now.setdefault(w, []).extend(ps)

        def rose(peer: str) -> bool:
            top = self._top((peer, stream))
            return top < self.threshold and (
                top >= DEFER_SHARE * self.threshold or min(now.get(peer, [1.0])) < FLAGGED_P
            )

        return [w for w in peers if rose(w)]

    def settle(self, workers: list[str], stream: int = 0) -> None:
        """The statistics of `workers` in `stream` (a stage whose ban the guard blocked) keep at most GUARD_SHARE of
        the threshold."""
        top = GUARD_SHARE * self.threshold
        for w in workers:
            for d in (self.level, self.peak):
                if (w, stream) in d:
                    d[(w, stream)] = min(d[(w, stream)], top)

    def forget(self, worker: str) -> None:
        for d in (self.level, self.peak, self._gain):
            for key in [k for k in d if k[0] == worker]:
                del d[key]
