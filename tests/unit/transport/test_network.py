"""The network model: presets, links, and the event-simulated clock on hand-computed pipelines."""

from __future__ import annotations

import math

import pytest

from sentinel import scenario
from sentinel.engine.clock import pipeline_throughput
from sentinel.transport.network import Network, _Links, stragglers


def net_cfg(**kw):
    return scenario.validate({"transport": {"network": kw}}).transport.network


def test_uniform_default_is_200_mbps_50_ms_and_links_are_added_lazily():
    net = Network(net_cfg(), seed=0)
    assert net.graph.number_of_edges() == 0
    bw, lat = net.link("s0r0", "s1r0")
    assert (bw, lat) == (200e6, 0.05)
    assert net.graph.number_of_edges() == 1 and net.graph.edges["s0r0", "s1r0"]["bandwidth_mbps"] == 200.0


def test_heterogeneous_links_are_seeded_and_independent_of_first_use_order():
    cfg = net_cfg(preset="heterogeneous", spread=0.8)
    a, b = Network(cfg, seed=3), Network(cfg, seed=3)
    pairs = [("s0r0", "s1r0"), ("s0r1", "s1r1"), ("s1r0", "s2r1")]
    got_a = [a.link(u, v) for u, v in pairs]
    got_b = [b.link(u, v) for u, v in reversed(pairs)][::-1]
    assert got_a == got_b
    assert len({bw for bw, _ in got_a}) > 1  # heterogeneous indeed
    assert got_a != [Network(cfg, seed=4).link(u, v) for u, v in pairs]


def test_geo_clustered_links_are_fast_inside_a_region():
    cfg = net_cfg(preset="geo_clustered", regions=2, intra_bandwidth_mbps=1000, intra_latency_ms=5)
    net = Network(cfg, seed=0)
    ids = [f"s{s}r{r}" for s in range(4) for r in range(4)]
    for u in ids:
        for v in ids:
            if u < v:
                same = net.node(u)["region"] == net.node(v)["region"]
                assert net.link(u, v) == ((1000e6, 0.005) if same else (200e6, 0.05))
    assert len({net.node(w)["region"] for w in ids}) == 2


def test_links_are_fifo_unless_reordering_is_allowed():
    for reorder in (False, True):
        links = _Links(Network(net_cfg(jitter_ms=200, reorder=reorder), seed=0))
        arrivals = [links.transfer("a", "b", 1000, t * 1e-3, msg_id=t) for t in range(200)]
        inversions = sum(x > y for x, y in zip(arrivals, arrivals[1:]))
        assert (inversions > 0) == reorder


def test_one_link_serialises_its_messages():
    links = _Links(Network(net_cfg(), seed=0))
    one = 25_000_000  # bytes: 1 s at 200 Mb/s
    assert math.isclose(links.transfer("a", "b", one, 0.0, 0), 1.05)
    assert math.isclose(links.transfer("a", "b", one, 0.0, 1), 2.05)  # waited for the transmitter
    assert math.isclose(links.transfer("b", "a", one, 0.0, 2), 1.05)  # the other direction is free


def test_two_stage_pipeline_clock_by_hand():
    """s0 F 0-1, act 1 s + 50 ms, s1 F 2.05-3.05, B 3.05-5.05, grad 1.05 s, s0 B 6.1-8.1: 8.1 s per step."""
    out = pipeline_throughput(
        net_cfg(),
        num_stages=2,
        num_microbatches=1,
        act_bytes=25_000_000,
        grad_bytes=25_000_000,
        fwd_s=1.0,
        bwd_s=2.0,
        tokens_per_mb=100,
        steps=2,
    )
    assert math.isclose(out["sim_time_s"], 16.2)
    assert math.isclose(out["sim_tokens_per_s"], 200 / 16.2)


def test_pipelining_overlaps_microbatches():
    """With compute only, S stages and M microbatches take (M + S - 1) forward slots plus as many backward."""
    S, M = 4, 8
    out = pipeline_throughput(
        net_cfg(latency_ms=0, bandwidth_mbps=1e6),
        num_stages=S,
        num_microbatches=M,
        act_bytes=0,
        grad_bytes=0,
        fwd_s=1.0,
        bwd_s=1.0,
        tokens_per_mb=1,
        steps=1,
    )
    assert math.isclose(out["sim_time_s"], 2 * (M + S - 1))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_compression_speedup_follows_bytes_and_latency(schedule):
    """Link-bound pipeline: the speed-up of a 20x smaller message is bounded by latency and compute."""
    kw = dict(num_stages=4, num_microbatches=4, fwd_s=0.01, bwd_s=0.02, tokens_per_mb=8192, schedule=schedule)
    big = 8 * 1024 * 2048 * 4  # (B, T, d) float32 = 67 MB: 2.7 s per hop at 200 Mb/s
    dense = pipeline_throughput(net_cfg(), act_bytes=big, grad_bytes=big, **kw)
    masked = pipeline_throughput(net_cfg(), act_bytes=big // 20, grad_bytes=big // 20, **kw)
    ratio = masked["sim_tokens_per_s"] / dense["sim_tokens_per_s"]
    assert 5 < ratio < 20
    no_latency = net_cfg(latency_ms=0)
    ratio0 = (
        pipeline_throughput(no_latency, act_bytes=big // 20, grad_bytes=big // 20, **kw)["sim_tokens_per_s"]
        / pipeline_throughput(no_latency, act_bytes=big, grad_bytes=big, **kw)["sim_tokens_per_s"]
    )
    assert ratio < ratio0 <= 20 + 1e-9  # latency is what keeps the ratio below the byte ratio


def test_stragglers_are_a_seeded_fraction():
    ids = [f"s{s}r{r}" for s in range(4) for r in range(4)]
    chosen = stragglers(net_cfg(stragglers=0.25), 0, ids)
    assert len(chosen) == 4 and chosen == stragglers(net_cfg(stragglers=0.25), 0, ids)
    assert stragglers(net_cfg(), 0, ids) == frozenset()
