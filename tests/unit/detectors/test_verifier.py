"""The trusted relay: integrity checks, cascade suppression, read-only views, and no ground truth."""

from __future__ import annotations

import inspect
import pathlib

import pytest
import torch

import sentinel.detectors as detectors_pkg
from sentinel.detectors.base import Detector, Marker, Verdict
from sentinel.detectors.verifier import Verifier, detector_view
from sentinel.transport.message import Message, Role

SHAPE = (2, 4, 8)


class Recorder(Detector):
    """Flags payloads whose first value is > 100; records what it was shown."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple] = []

    def observe(self, msg):
        self.seen.append((msg.step, msg.mb_idx, msg.boundary, int(msg.role)))
        return Verdict({"v": float(msg.payload.flatten()[0])}, bool(msg.payload.flatten()[0] > 100))


def m(step, mb, boundary, role, value=1.0, shape=SHAPE):
    """A distinct payload per (step, mb, boundary, role) whose first value is `value`."""
    g = torch.Generator().manual_seed(1000 * step + 100 * mb + 10 * boundary + int(role))
    x = torch.rand(shape, generator=g)
    x.view(-1)[0] = value
    return Message(step, mb, boundary, role, "s1r0", "s2r0", x)


@pytest.mark.parametrize(
    "payload",
    [
        torch.full(SHAPE, float("nan")),
        torch.full(SHAPE, float("inf")),
        torch.zeros(2, 4, 9),
        torch.zeros(SHAPE, dtype=torch.int64),
    ],
    ids=["nan", "inf", "shape", "dtype"],
)
def test_corrupt_payloads_are_flagged_without_reaching_the_detector(payload):
    det = Recorder()
    v = Verifier(det, payload_shape=SHAPE)
    msg = Message(0, 0, 1, Role.ACTIVATION, "s1r0", "s2r0", payload)
    verdict = v.observe(msg)
    assert verdict.flagged and verdict.markers == {Marker.INTEGRITY} and verdict.certain
    assert det.seen == []


def test_cascade_suppression_pauses_the_rest_of_the_microbatch(tiny_scenario):
    """Flag (step 1, mb 1) at boundary 0 and deliver it anyway: every later message of that microbatch in that
    step is downstream of the flag and paused (not judged); other microbatches and the next step are judged."""

    class FlagOne:
        def __init__(self):
            self.seen = []

        def observe(self, msg):
            key = (msg.step, msg.mb_idx, msg.boundary, int(msg.role))
            self.seen.append(key)
            return Verdict({}, key == (1, 1, 0, 0))

        def substitute(self, msg):
            return None

    class Accept:
        def deliver(self, msg, verdict, substitute):
            return msg.payload

        def end_step(self, step, records):
            pass

    from sentinel.engine.sim import SimEngine

    det = FlagOne()
    eng = SimEngine(tiny_scenario("training.steps=3"), verifier=det, responder=Accept())
    for _ in range(3):
        eng.train_step()
    v, m_ = eng.log.verdicts, eng.log.messages
    by_id = dict(
        zip(
            m_["id"].tolist(), zip(m_["step"].tolist(), m_["mb"].tolist(), m_["boundary"].tolist(), m_["role"].tolist())
        )
    )
    paused = {by_id[i] for i, p in zip(v["msg"].tolist(), v["score_paused"].tolist()) if p == 1}
    downstream = {(1, 1, b, 0) for b in (1, 2)} | {(1, 1, b, 1) for b in (0, 1, 2)}
    assert paused == downstream  # the rest of that microbatch, nothing else
    assert not paused & set(det.seen) and (1, 1, 0, 0) in det.seen  # the detector never saw them
    assert {(1, 2, 1, 0), (2, 1, 1, 0)} <= set(det.seen)  # other microbatches, and the next step, are judged


@pytest.mark.parametrize("own_checks", [False, True])
def test_exact_replays_are_flagged_as_certain(own_checks):
    from sentinel.detectors.stagewise import Sentinel

    det = Sentinel(Sentinel.Config(warmup_steps=0, min_history=4), seed=0) if own_checks else Recorder()
    v = Verifier(det, payload_shape=SHAPE)
    first = m(0, 0, 0, Role.ACTIVATION)
    assert not v.observe(first).flagged
    for step in range(1, 4):
        v.observe(m(step, 0, 0, Role.ACTIVATION))
    again = Message(5, 1, 0, Role.ACTIVATION, "s1r0", "s2r0", first.payload.clone())  # a stale tensor resent
    verdict = v.observe(again)
    assert verdict.flagged and verdict.markers == {Marker.REPLAY}
    nudged = Message(6, 1, 0, Role.ACTIVATION, "s1r0", "s2r0", first.payload + 1e-3)
    assert Marker.REPLAY not in v.observe(nudged).markers  # not a replay: left to the statistics


def test_sentinel_flags_non_finite_payloads_itself():
    from sentinel.detectors.stagewise import Sentinel

    det = Sentinel(Sentinel.Config(warmup_steps=0, min_history=4), seed=0)
    v = Verifier(det, payload_shape=SHAPE)
    bad = m(0, 0, 0, Role.GRADIENT)
    bad.payload.view(-1)[5] = float("nan")
    assert v.observe(bad) == Verdict({}, True, frozenset({Marker.INTEGRITY}))
    assert det._streams[(0, 1)].baseline.n == 0  # nothing learned from it


def test_sentinel_judges_a_huge_finite_payload_instead_of_calling_it_corrupt():
    """A finite payload whose float32 moments overflow is far out, not NaN / Inf: flagged by the statistics, never
    certain evidence (which bans in two messages). Honest top-k compressed text traffic sent such gradients."""
    from sentinel.detectors.stagewise import Sentinel

    det = Sentinel(Sentinel.Config(warmup_steps=0, min_history=4), seed=0)
    v = Verifier(det, payload_shape=SHAPE)
    for step in range(60):  # past MIN_EVIDENCE accepted values: the verdict carries a p-value
        v.observe(m(step, 0, 0, Role.GRADIENT))
    huge = m(60, 0, 0, Role.GRADIENT)
    huge.payload.mul_(1e15)
    verdict = v.observe(huge)
    assert verdict.flagged and not verdict.certain and Marker.INTEGRITY not in verdict.markers
    assert verdict.pvalue is not None and verdict.pvalue < 1e-3


def test_detector_view_is_read_only():
    from sentinel.detectors.stagewise import Sentinel

    det = Sentinel(Sentinel.Config(warmup_steps=0, min_history=4), seed=0)
    v = Verifier(det)
    gen = torch.Generator().manual_seed(0)
    for s in range(10):
        v.observe(Message(s, 0, 0, Role.ACTIVATION, "s0r0", "s1r0", torch.randn(SHAPE, generator=gen)))
    view = detector_view({0: v})
    before = det.public_state()
    probe = torch.randn(SHAPE, generator=gen)
    assert view.scores(0, Role.ACTIVATION, probe) == view.scores(0, Role.ACTIVATION, probe)
    assert set(view.thresholds(0, Role.ACTIVATION)) >= {"l1", "evidence"}
    assert det.public_state() == before
    assert not hasattr(view, "observe")  # a view gives no verdicts


def test_identical_payloads_get_identical_verdicts_whatever_the_ground_truth():
    """Two runs: in one the payload is recorded as tampered, in the other not; verdicts must agree."""
    from sentinel.detectors.stagewise import Sentinel
    from sentinel.eventlog import EventLog

    gen = torch.Generator().manual_seed(1)
    stream = [torch.randn(SHAPE, generator=gen) for _ in range(30)] + [torch.randn(SHAPE, generator=gen) * 9]
    verdicts = []
    for tampered in (False, True):
        log = EventLog()
        v = Verifier(Sentinel(Sentinel.Config(warmup_steps=0, min_history=4), seed=0), payload_shape=SHAPE)
        out = []
        for i, x in enumerate(stream):
            msg = Message(i, 0, 0, Role.ACTIVATION, "s0r0", "s1r0", x.clone(), msg_id=i)
            log.log_message(msg)
            if tampered and i >= 20:
                log.log_tamper(msg, "scaling", 9.0)
            out.append(v.observe(msg))
        verdicts.append(out)
    assert verdicts[0] == verdicts[1]
    assert verdicts[0][-1].flagged


def test_detector_code_never_reads_ground_truth():
    """No detector module (nor the response policy) refers to the EventLog's ground truth."""
    import sentinel.response as response

    files = list(pathlib.Path(inspect.getfile(detectors_pkg)).parent.glob("*.py")) + [pathlib.Path(response.__file__)]
    for f in files:
        if f.name == "evaluation.py":  # the evaluation helper calls the scorer, after the run
            continue
        code = "\n".join(line for line in f.read_text().splitlines() if not line.strip().startswith(("#", '"')))
        assert "ground_truth" not in code and "log_tamper" not in code, f


def test_ground_truth_is_never_touched_while_verifying(tiny_scenario):
    """End to end: reading EventLog.ground_truth during any verifier call raises."""
    from sentinel.eventlog import EventLog
    from sentinel.runner import build_engine

    class GuardedLog(EventLog):
        verifying = False

        def __getattribute__(self, name):
            if name == "ground_truth" and object.__getattribute__(self, "verifying"):
                raise AssertionError("a detector read ground truth")
            return object.__getattribute__(self, name)

    sc = tiny_scenario(
        "pipeline.replicas=3",
        "detector.name=sentinel",
        "detector.warmup_steps=2",
        "adversary.fraction=0.34",
        "training.steps=6",
        "adversary.attacks=[{name: scaling, role: gradient, start: 3}]",
    )
    log = GuardedLog()
    engine = build_engine(sc, log)

    def guard(inner):
        def guarded(msg):
            log.verifying = True
            try:
                return inner(msg)
            finally:
                log.verifying = False

        return guarded

    for verifier in engine.verifiers.values():
        verifier.observe = guard(verifier.observe)
    engine.run()
    assert len(log.ground_truth) > 0 and len(log.verdicts) > 0


def test_wire_view_shows_the_detector_the_compressed_representation():
    """`detector.view: wire`: the detector reads msg.wire_view; integrity is checked on the decoded tensor."""

    class Shapes(Detector):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def observe(self, msg):
            self.shapes.append(tuple(msg.payload.shape))
            return Verdict({}, False)

    det = Shapes()
    v = Verifier(det, payload_shape=SHAPE, view="wire")
    codes = m(0, 0, 1, Role.ACTIVATION).replace(wire_view=torch.arange(5.0))  # e.g. top-k values: a flat vector
    assert not v.observe(codes).flagged and det.shapes == [(5, 1)]  # a bag of values, one feature each
    plain = m(0, 1, 1, Role.ACTIVATION)  # no wire view (no codec on this message): the decoded tensor
    v.observe(plain)
    assert det.shapes[-1] == SHAPE
    bad = m(0, 2, 1, Role.ACTIVATION).replace(wire_view=torch.ones(3))  # a clean-looking wire view cannot hide
    bad.payload[0, 0, 0] = float("nan")  # a corrupt decoded tensor
    assert v.observe(bad).markers == {Marker.INTEGRITY} and len(det.shapes) == 2


def test_wire_view_is_rejected_for_recomputing_detectors(tiny_scenario):
    from sentinel.errors import ConfigError

    with pytest.raises(ConfigError, match="detector.view: duplication compares"):
        tiny_scenario("detector.name=duplication", "detector.view=wire")
    tiny_scenario("detector.name=sentinel", "detector.view=wire")


def test_env_says_whether_the_response_may_ask_for_a_substitute(tiny_scenario):
    from sentinel.detectors.verifier import make_env

    def env(*overrides):
        return make_env(tiny_scenario("detector.name=sentinel", *overrides))

    assert env("response.on_flag=substitute").substitutes
    assert not env("response.on_flag=drop").substitutes
    assert not env("response.on_flag=substitute", "detector.mode=open_loop").substitutes  # never acts


def test_env_names_the_roles_whose_codec_drops_tokens_whole(tiny_scenario):
    from sentinel.detectors.verifier import make_env

    def zeroed(*overrides):
        return make_env(tiny_scenario("detector.name=sentinel", *overrides)).zeroed_roles

    assert zeroed() == frozenset() and zeroed("transport.codec={name: int8}") == frozenset()
    assert zeroed("transport.codec={name: topk, fraction: 0.1}") == {Role.ACTIVATION, Role.GRADIENT}
    assert zeroed("transport.gradient_codec={name: topk, fraction: 0.1}") == {Role.GRADIENT}
    assert zeroed("transport.codec={name: random_mask, keep: 0.1}") == {Role.ACTIVATION, Role.GRADIENT}
    assert zeroed("transport.codec={name: subspace, rate: 8}") == frozenset()


def test_env_names_the_roles_whose_codec_projects_tokens(tiny_scenario):
    from sentinel.detectors.verifier import make_env

    def projected(*overrides):
        return make_env(tiny_scenario("detector.name=sentinel", *overrides)).projected_roles

    assert projected() == frozenset() and projected("transport.codec={name: topk, fraction: 0.1}") == frozenset()
    assert projected("transport.codec={name: subspace, rate: 8}") == {Role.ACTIVATION, Role.GRADIENT}
    lossless = "transport.codec={name: subspace, rate: 8, project_weights: true}"  # activations arrive exactly
    assert projected(lossless) == {Role.GRADIENT}


def test_the_relay_checks_re_masked_replays_only_under_a_random_position_codec():
    from sentinel import scenario as scenario_mod
    from sentinel.detectors.verifier import build_defence as build
    from sentinel.runner import build_engine
    from sentinel.transport.message import Role

    def verifier(codec: str):
        sc = scenario_mod.load(
            "scenarios/compression/random_mask95.yaml",
            ["adversary.attacks=[]", "scoring.twins=[]", f"transport.codec={codec}"],
        )
        return build(sc, build_engine(sc).mesh)[0][0]

    assert verifier("{name: random_mask, keep: 0.05}").masked_roles == {Role.ACTIVATION, Role.GRADIENT}
    assert verifier("{name: topk, fraction: 0.01}").masked_roles == frozenset()
    assert verifier("{name: identity}").masked_roles == frozenset()
