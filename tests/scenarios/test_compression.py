"""Compressed and asynchronous transport end to end (fast): exact bytes, untouched numerics where promised,
a lossless subspace, the simulated clock, post-codec attacks, and the scenario library validating."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sentinel import runner, scenario
from sentinel.engine.clock import network_report
from sentinel.engine.sim import SimEngine
from sentinel.errors import ConfigError
from sentinel.registry import CODECS
from sentinel.transport import Role
from tests.conftest import tiny

LIBRARY = Path(__file__).resolve().parents[2] / "scenarios" / "compression"
CODEC_SETTINGS = {
    "identity": "{name: identity}",
    "fp16": "{name: fp16}",
    "bf16": "{name: bf16}",
    "int8": "{name: int8}",
    "int4": "{name: int4}",
    "topk": "{name: topk, fraction: 0.1}",
    "random_mask": "{name: random_mask, keep: 0.05}",
    "subspace": "{name: subspace, rate: 4}",
}


def steps(eng: SimEngine, n: int) -> list[float]:
    return [eng.train_step() for _ in range(n)]


def test_every_registered_codec_has_an_end_to_end_setting():
    assert set(CODEC_SETTINGS) == set(CODECS.names())


@pytest.mark.parametrize("name", sorted(CODEC_SETTINGS))
def test_codec_trains_and_charges_exact_bytes(name):
    eng = SimEngine(tiny(f"transport.codec={CODEC_SETTINGS[name]}", "training.steps=2"))
    losses = steps(eng, 2)
    assert all(np.isfinite(losses))
    m = eng.log.messages
    codec = eng.codecs[Role.ACTIVATION]
    shape = (4, 16, 32)  # batch, seq_len, dim of `tiny`
    expect = [codec.expected_nbytes(shape, Role(int(r))) for r in m["role"]]
    assert m["bytes"].tolist() == expect and eng.bytes_sent == sum(expect)


def test_identity_codec_and_network_clock_leave_numbers_bit_identical():
    a = SimEngine(tiny("pipeline.replicas=2", "transport.network.enabled=false"))
    b = SimEngine(
        tiny(
            "pipeline.replicas=2",
            "transport.network.preset=heterogeneous",
            "transport.network.jitter_ms=30",
            "transport.network.compute=measured",
        )
    )
    assert steps(a, 3) == steps(b, 3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters().values(), b.parameters().values()))
    assert a.hooks == [] and network_report(b)["sim_time_s"] > 0


class _Recorder:
    """An honest interceptor that remembers every pre-codec payload (to compare with what arrives)."""

    def __init__(self):
        self.sent = {}

    def pre_codec(self, msg):
        self.sent[msg.msg_id] = msg.payload.clone()
        return msg

    def post_codec(self, msg, wire, ctx):
        return wire

    def dp_contribution(self, step, stage_idx, worker, vec):
        return vec


class _Check:
    def __init__(self, rec):
        self.rec, self.err = rec, []

    def observe(self, msg):
        from sentinel.detectors import Verdict

        sent = self.rec.sent[msg.msg_id]
        self.err.append(float((msg.payload - sent).norm() / sent.norm()))
        assert msg.wire_view is not None and msg.wire_view.is_floating_point()
        return Verdict({}, False)


@pytest.mark.parametrize("project,lossless", [(True, True), (False, False)])
def test_subspace_with_weight_projection_is_lossless(project, lossless):
    rec = _Recorder()
    check = _Check(rec)
    sc = tiny(f"transport.codec={{name: subspace, rate: 8, project_weights: {str(project).lower()}}}")
    eng = SimEngine(sc, adversary=rec, verifier=check)
    steps(eng, 3)
    acts = [e for e, r in zip(check.err, eng.log.messages["role"]) if r == Role.ACTIVATION]
    assert (max(acts) < 1e-4) == lossless
    assert eng.bytes_sent < 72 * 4 * 16 * 32 * 4 / 7  # 72 messages, ~8x smaller than float32


def test_random_mask_links_dominated_throughput_ratio():
    """Same engine run, 20x fewer bytes per message: the simulated tokens/s ratio follows the link model."""
    over = (
        "model.dim=64",
        "model.seq_len=32",
        "data.batch_size=8",
        "training.steps=2",
        "transport.network.bandwidth_mbps=5",
        "transport.network.latency_ms=1",
    )
    dense, masked = SimEngine(tiny(*over)), SimEngine(tiny(*over, "transport.codec={name: random_mask, keep: 0.05}"))
    steps(dense, 2)
    steps(masked, 2)
    d, m = network_report(dense), network_report(masked)
    assert dense.bytes_sent / masked.bytes_sent == pytest.approx(20, rel=1e-3)  # k = round(q n)
    assert 8 < m["sim_tokens_per_s"] / d["sim_tokens_per_s"] < 20


def test_async_yaml_key_and_summary_fields(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "model: {layers: 4, dim: 32, heads: 2, seq_len: 16}\n"
        "data: {source: synthetic, vocab: 32, batch_size: 4, val_batches: 1}\n"
        "training: {steps: 3, eval_every: 3, warmup_steps: 1}\n"
        "transport:\n  codec: {name: int8}\n  async: {max_staleness: 2, lookahead: true}\n"
        "  network: {preset: geo_clustered, jitter_ms: 10}\n"
    )
    sc = scenario.load(path)
    assert sc.transport.async_.max_staleness == 2 and scenario.validate(sc.to_dict()) == sc
    summary = runner.run(sc, tmp_path / "out", progress=False)
    t = json.loads((tmp_path / "out" / "summary.json").read_text())["transport"]
    assert t == summary["transport"] and t["sim_time_s"] > 0 and t["sim_tokens_per_s"] > 0
    assert t["bytes_sent"] == 3 * 2 * 3 * 4 * (4 * 16 * 32 + 4 * 16 * 4)


def test_schema_errors_are_located():
    with pytest.raises(ConfigError, match=r"transport.asyncc: unknown key 'asyncc' \(did you mean 'async'\?\)"):
        tiny("transport.asyncc.max_staleness=1")
    with pytest.raises(ConfigError, match="transport.activation_codec: random_mask must encode both roles"):
        tiny("transport.activation_codec=random_mask")
    with pytest.raises(ConfigError, match="dp.compression.method"):
        tiny("dp.compression.method=topk", "dp.sync=none")
    with pytest.raises(ConfigError, match=r"transport.codec.keep: must be > 0"):
        tiny("transport.codec={name: random_mask, keep: 0}")


MAL = ("pipeline.replicas=3", "adversary.placement=explicit", "adversary.workers=[s1r0]", "pipeline.routing=fixed")


@pytest.mark.parametrize(
    "codec,attack",
    [
        ("{name: random_mask, keep: 0.1}", "mask_seed"),
        ("int8", "quant_scale"),
        ("{name: topk, fraction: 0.2}", "topk_index"),
        ("{name: subspace, rate: 4}", "subspace_coeff"),
    ],
)
def test_post_codec_attacks_tamper_the_wire(codec, attack):
    sc = tiny(
        *MAL,
        f"transport.codec={codec}",
        f"adversary.attacks=[{{name: {attack}, role: activation, placement: post_codec, start: 1}}]",
    )
    eng = runner.build_engine(sc)
    steps(eng, 2)
    gt = eng.log.ground_truth
    assert len(gt) > 0 and set(gt["step"].tolist()) == {1}
    assert (gt["norm_ratio"] > 0).all() and {eng.log.workers[w] for w in gt["worker"]} == {"s1r0"}


def test_post_codec_attack_on_the_wrong_codec_is_rejected():
    with pytest.raises(ConfigError, match="quant_scale tampers the wire format of int8 / int4"):
        tiny(*MAL, "adversary.attacks=[{name: quant_scale, role: activation, placement: post_codec}]")


def test_scenario_library_validates():
    from sentinel.sweep import grid_points

    files = sorted(LIBRARY.glob("*.yaml"))
    assert len(files) >= 5
    n_points = 0
    for f in files:
        sc = scenario.load(f)
        for point in grid_points(sc) if sc.sweep.grid else [{}]:
            scenario.load(f, [f"{k}={json.dumps(v)}" for k, v in point.items()])
            n_points += 1
    assert n_points >= 50
