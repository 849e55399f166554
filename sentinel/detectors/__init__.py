"""Built-in detectors (registered in `sentinel.registry.DETECTORS`).

    none            no verification (the undefended baseline)
    sentinel        SENTINEL: EMA baselines, six distances, Tukey fences        (stagewise.py)
    norm_zscore, cusum, page_hinkley   streaming change detectors on a scalar   (scalar.py)
    duplication, spot_check, cross_replica   trusted recomputation             (recompute.py)
    toploc          top-k commitments audited by sampled recomputation         (toploc.py)
    river_adwin, river_page_hinkley, river_kswin   river's drift detectors on SENTINEL's statistics (drift.py)

`sentinel.detectors.verifier.build_defence(scenario, mesh, recompute, inputs)` returns the verifiers (one per
boundary) and the response policy a backend installs on its relay (verifier.py, sentinel/response.py).
"""

from sentinel.detectors.base import Detector, DetectorEnv, Verdict
from sentinel.registry import DETECTORS


@DETECTORS.register("none")
class NoDetector(Detector):
    """No verification: every message is accepted (the undefended baseline)."""

    def observe(self, msg):
        return Verdict({}, False)


from sentinel.detectors import drift, recompute, scalar, stagewise, toploc  # noqa: E402,F401  (registers the built-ins)
from sentinel.detectors.recompute import Duplication  # noqa: E402
from sentinel.scenario import cross_check  # noqa: E402


@cross_check
def _wire_view(sc) -> list[tuple[str, str]]:
    """A recomputing detector compares with the decoded recomputation: it needs the decoded view."""
    if sc.detector.view == "wire" and issubclass(DETECTORS.get(sc.detector.name), Duplication):
        return [
            (
                "detector.view",
                f"{sc.detector.name} compares a message with its trusted recomputation, which "
                "is a decoded tensor: use view: decoded",
            )
        ]
    return []


@cross_check
def _detector_params(sc) -> list[tuple[str, str]]:
    """Rules a detector states about its own parameters (`check_config(config) -> [(key, message)]`)."""
    return [(f"detector.{key}", msg) for key, msg in DETECTORS.get(sc.detector.name).check_config(sc.detector.config)]


__all__ = ["Detector", "DetectorEnv", "Verdict", "NoDetector"]
