"""Built-in detectors (registered in `sentinel.registry.DETECTORS`).

    none            no verification (the undefended baseline)
    sentinel        SENTINEL: EMA baselines, six distances, Tukey fences        (stagewise.py)
    norm_zscore, cusum, page_hinkley   streaming change detectors on a scalar   (scalar.py)
    duplication, spot_check, cross_replica   trusted recomputation             (recompute.py)
    toploc          top-k commitments audited by sampled recomputation         (toploc.py)
    river_adwin, river_page_hinkley, river_kswin   river's drift detectors on SENTINEL's statistics (drift.py)

`build_defence(scenario, mesh, recompute, inputs)` returns the (verifiers, responder) pair the runner installs on the
transport (verifier.py, sentinel/response.py).
"""

from sentinel.detectors.base import Detector, DetectorEnv, Verdict
from sentinel.registry import DETECTORS


@DETECTORS.register("none")
class NoDetector(Detector):
    """No verification: every message is accepted (the undefended baseline)."""

    def observe(self, msg):
        return Verdict({}, False)


from sentinel.detectors import drift, recompute, scalar, stagewise, toploc  # noqa: E402,F401  (registers the built-ins)

__all__ = ["Detector", "DetectorEnv", "Verdict", "NoDetector"]


def build_defence(scenario, mesh, recompute_hook=None, inputs=None):
    """(verifiers, responder) for this scenario: one verifier per boundary; ({}, None) when the detector is `none`.

    `mesh` is the response policy's MeshControl; `recompute_hook` the backend's trusted recomputation, if any;
    `inputs` what the sender of the message being judged received (`sentinel.transport.relay.InFlight`).
    """
    if scenario.detector.name == "none":
        return {}, None
    from sentinel.detectors.verifier import build

    return build(scenario, mesh, recompute_hook, inputs)
