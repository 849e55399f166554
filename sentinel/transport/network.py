"""The network model and the simulated clock.

Workers are nodes of a `networkx` graph; a link's bandwidth (Mb/s) and latency (ms) are edge
attributes, drawn per worker from the scenario seed so they do not depend on the order in which
links are first used (edges are added lazily: memory grows with the links traffic uses, not with
every pair of workers). Presets (`transport.network.preset`):

    uniform         every link bandwidth_mbps / latency_ms (default 200 Mb/s, 50 ms)
    heterogeneous   worker factors f_w ~ LogNormal(0, spread): link bandwidth = B * min(f_u, f_v),
                    latency = L * sqrt(g_u g_v) with g_w ~ LogNormal(0, spread / 2)
    geo_clustered   each worker sits in one of `regions` regions: intra_* inside a region, else B / L

A message of n bytes on link (u, v) occupies the link's transmitter for 8 n / bandwidth seconds
(FIFO per directed link) and arrives `latency (+ jitter)` later; without `reorder`, arrivals on a
link keep their send order. The **simulated clock** replays each step as an event simulation over the
schedule's actions: every worker runs its own actions in schedule order, an action starts when its
worker is free and its input message has arrived, takes its compute time (modelled from FLOPs at
`tflops`, or the measured wall time; x `straggler_slowdown` on a straggler), and its output message
then crosses the link. A stage's step ends with its DP sync (ring all-reduce time of the bytes its
replicas exchanged); a worker's next step may start once its stage has the weights it computes with
(the previous step's, or `max_staleness` steps older under asynchrony). It only reads what the engine
did (the EventLog's message rows and byte counts), so it never changes a training number.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import networkx as nx
import numpy as np

from sentinel.engine.schedule import Action


def _unit(seed: int, salt: int, wid: str) -> np.random.Generator:
    return np.random.default_rng([seed, salt, zlib.crc32(wid.encode())])


class Network:
    """The worker graph with per-link bandwidth / latency (see module docstring for the presets)."""

    def __init__(self, cfg, seed: int):
        self.cfg, self.seed = cfg, seed
        self.graph = nx.Graph()

    def node(self, wid: str) -> dict:
        """Add (once) and return a worker's attributes: bandwidth/latency factors, region."""
        if wid not in self.graph:
            rng = _unit(self.seed, 0x4E37, wid)
            f, g = rng.lognormal(0.0, self.cfg.spread), rng.lognormal(0.0, self.cfg.spread / 2)
            self.graph.add_node(
                wid, bw_factor=float(f), lat_factor=float(g), region=int(rng.integers(self.cfg.regions))
            )
        return self.graph.nodes[wid]

    def link(self, u: str, v: str) -> tuple[float, float]:
        """(bandwidth in bit/s, latency in s) of the link u-v, added to the graph on first use."""
        if not self.graph.has_edge(u, v):
            a, b = self.node(u), self.node(v)
            c = self.cfg
            if c.preset == "heterogeneous":
                bw, lat = (
                    c.bandwidth_mbps * min(a["bw_factor"], b["bw_factor"]),
                    c.latency_ms * math.sqrt(a["lat_factor"] * b["lat_factor"]),
                )
            elif c.preset == "geo_clustered" and a["region"] == b["region"]:
                bw, lat = c.intra_bandwidth_mbps, c.intra_latency_ms
            else:
                bw, lat = c.bandwidth_mbps, c.latency_ms
            self.graph.add_edge(u, v, bandwidth_mbps=bw, latency_ms=lat)
        e = self.graph.edges[u, v]
        return e["bandwidth_mbps"] * 1e6, e["latency_ms"] * 1e-3

    def jitter_s(self, msg_id: int) -> float:
        if self.cfg.jitter_ms <= 0:
            return 0.0
        rng = np.random.default_rng([self.seed, 0x1177, msg_id])
        return abs(float(rng.normal(0.0, self.cfg.jitter_ms))) * 1e-3

    def ring_allreduce_s(self, workers: list[str], nbytes: float) -> float:
        """Ring all-reduce of `nbytes` per worker: 2 (n-1)/n * bytes / slowest link + 2 (n-1) * largest latency."""
        n = len(workers)
        if n < 2 or nbytes <= 0:
            return 0.0
        ring = sorted(workers)
        links = [self.link(ring[i], ring[(i + 1) % n]) for i in range(n)]
        bw, lat = min(b for b, _ in links), max(la for _, la in links)
        return 2 * (n - 1) / n * 8 * nbytes / bw + 2 * (n - 1) * lat


def stragglers(cfg, seed: int, workers: list[str]) -> frozenset[str]:
    """The ceil(fraction * n) workers with the lowest seeded draw (honest or not: a property of the machine)."""
    if cfg.stragglers <= 0:
        return frozenset()
    draws = sorted((float(_unit(seed, 0x57A6, w).random()), w) for w in workers)
    return frozenset(w for _, w in draws[: math.ceil(cfg.stragglers * len(workers))])


class _Links:
    """Per-directed-link transmitter state carried across steps."""

    def __init__(self, net: Network):
        self.net = net
        self.free: dict[tuple[str, str], float] = {}
        self.last_arrival: dict[tuple[str, str], float] = {}

    def transfer(self, src: str, dst: str, nbytes: int, t_send: float, msg_id: int) -> float:
        bw, lat = self.net.link(src, dst)
        start = max(t_send, self.free.get((src, dst), 0.0))
        self.free[(src, dst)] = start + 8 * nbytes / bw
        arrival = self.free[(src, dst)] + lat + self.net.jitter_s(msg_id)
        if not self.net.cfg.reorder:
            arrival = max(arrival, self.last_arrival.get((src, dst), 0.0))
        self.last_arrival[(src, dst)] = max(arrival, self.last_arrival.get((src, dst), 0.0))
        return arrival


def _input_of(a: Action, num_stages: int) -> tuple[str, int, int] | None:
    """The (kind, stage, mb) of the action whose output message `a` waits for (None: no message)."""
    if a.kind == "F":
        return ("F", a.stage - 1, a.mb) if a.stage > 0 else None
    return ("B", a.stage + 1, a.mb) if a.stage < num_stages - 1 else None


def simulate_step(
    queues: dict[str, list[Action]],
    gate: dict[str, float],
    worker_free: dict[str, float],
    compute_s: Callable[[str, Action], float],
    messages: dict[tuple[str, int, int], tuple[str, str, int, int]],
    links: _Links,
    num_stages: int,
) -> dict[str, float]:
    """Event simulation of one step. Returns each worker's finish time (and updates `worker_free`).

    Args:
        queues: each worker's actions in schedule order.
        gate: earliest start of each worker this step (its stage's weights are ready).
        compute_s: seconds an action takes on a worker (0 for an action the engine skipped).
        messages: the output message of an action, keyed (kind, stage, mb) -> (sender, receiver, bytes, msg id).
        links: link state (FIFO transmitters), updated in place.
    """
    done: dict[tuple[str, int, int], float] = {}  # action -> finish time
    arrival: dict[tuple[str, int, int], float] = {}  # producing action -> arrival of its message
    pos = {w: 0 for w in queues}
    remaining = sum(len(q) for q in queues.values())
    while remaining:
        progressed = False
        for w, q in queues.items():
            while pos[w] < len(q):
                a = q[pos[w]]
                dep = _input_of(a, num_stages)
                if dep is not None and dep not in done:
                    break
                ready = arrival.get(dep, done.get(dep, 0.0)) if dep is not None else 0.0
                start = max(worker_free.get(w, 0.0), gate.get(w, 0.0), ready)
                end = start + compute_s(w, a)
                worker_free[w] = end
                key = (a.kind, a.stage, a.mb)
                done[key] = end
                if key in messages:
                    src, dst, nbytes, msg_id = messages[key]
                    arrival[key] = links.transfer(src, dst, nbytes, end, msg_id)
                pos[w] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("network clock: schedule deadlock (a schedule bug)")
    return {w: worker_free.get(w, 0.0) for w in queues}


def stage_flops(module, batch_size: int, seq_len: int) -> float:
    """Forward FLOPs of a stage on one microbatch: 2 * params * tokens + causal attention 2 L B T^2 d."""
    embed = module.input_embedding()  # a lookup, not a product
    params = sum(p.numel() for p in module.parameters() if embed is None or p is not embed.weight)
    tokens, layers = batch_size * seq_len, len(module.decoder_layers())
    return 2.0 * params * tokens + 2.0 * layers * batch_size * seq_len**2 * module.hidden_size
