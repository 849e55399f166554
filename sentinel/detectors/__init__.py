"""Built-in detectors (registered in `sentinel.registry.DETECTORS`)."""

from sentinel.detectors.base import Detector, Verdict
from sentinel.registry import DETECTORS


@DETECTORS.register("none")
class NoDetector(Detector):
    """No verification: every message is accepted (the undefended baseline)."""

    def observe(self, msg):
        return Verdict({}, False)


__all__ = ["Detector", "Verdict", "NoDetector"]


def build_defence(scenario, engine):
    """(verifier, responder) for this scenario; (None, None) when the detector is `none`."""
    if scenario.detector.name == "none":
        return None, None
    from sentinel.detectors.verifier import build

    return build(scenario, engine)
