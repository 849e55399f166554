"""A verifier's decision on one message (`Verdict`), with typed markers (`Marker`).

Detectors return verdicts (sentinel/detectors); the relay gives two of its own (`PAUSED`, `WIRE_REJECT`); the
response policy and the EventLog read them. Markers are logged as `score_<marker> = 1` columns.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping


class Marker(str, enum.Enum):
    """What a verdict says beyond its statistics (typed; logged as `score_<marker> = 1` columns).

    Certain evidence (a payload no honest worker sends) is INTEGRITY, REPLAY, WIRE_REJECT and CERTAIN.
    """

    PAUSED = "paused"  # not judged: downstream of a flag in its microbatch this step
    INTEGRITY = "integrity"  # NaN / Inf, a non-float dtype or the wrong shape
    REPLAY = "replay"  # a tensor the verifier has already relayed
    WIRE_REJECT = "wire_reject"  # a frame the receiver could not consume (distributed backend)
    CERTAIN = "certain"  # a proof other than the above (e.g. a mismatch with a trusted recomputation)
    OUTLIER = "outlier"  # accepted, but beyond the inner fence: soft evidence, not learned
    SHIFT = "shift"  # beyond the fence but accepted as an honest-majority drift of the whole stage
    DRIFT = "drift"  # accepted, while the honest majority of the stage drifts in one statistic (for sequential tests)


CERTAIN_MARKERS = frozenset({Marker.INTEGRITY, Marker.REPLAY, Marker.WIRE_REJECT, Marker.CERTAIN})


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """A verifier's decision on one message.

    Attributes:
        scores: the detector's continuous statistics (larger = more anomalous); markers are not scores.
        flagged: whether the message is judged malicious.
        markers: typed facts about the verdict (`Marker`).
        pvalue: the message's tail probability under the stream's honest traffic (all statistics combined),
            the per-message evidence sequential tests accumulate (sentinel/sequential.py); None where the
            detector gives none.
        relation_pvalue: the part of that evidence which only the sender's own computation explains (how its
            output relates to the input it received): pooled statistics carry upstream corruption along, this
            does not. None where there is none.
    """

    scores: Mapping[str, float]
    flagged: bool
    markers: frozenset[Marker] = frozenset()
    pvalue: float | None = None
    relation_pvalue: float | None = None

    @property
    def certain(self) -> bool:
        """Flagged on certain evidence (no honest worker sends such a payload)."""
        return self.flagged and not CERTAIN_MARKERS.isdisjoint(self.markers)

    @property
    def judged(self) -> bool:
        """False for a message whose checks were paused (downstream of a flag in its microbatch)."""
        return Marker.PAUSED not in self.markers


PAUSED = Verdict({}, False, frozenset({Marker.PAUSED}))  # downstream of a flag in its microbatch: not judged
WIRE_REJECT = Verdict({}, True, frozenset({Marker.INTEGRITY, Marker.WIRE_REJECT}))  # a wire nobody could consume
