"""The dist backend's pieces, without processes: rank mapping, wire checks, log merge, the relay's flow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.cli import main
from sentinel.distributed import wire as W
from sentinel.distributed.faults import parse_faults
from sentinel.distributed.flow import RelayFlow
from sentinel.distributed.mapping import RankMap
from sentinel.distributed.merge import log_from_bytes, log_to_bytes, merge
from sentinel.distributed.runtime import check_supported
from sentinel.engine.schedule import execute
from sentinel.engine.sim import SimEngine
from sentinel.engine.workers import WorkerTable
from sentinel.errors import ConfigError
from sentinel.eventlog import EventLog
from sentinel.transport.message import Message, Role, Wire
from tests.conftest import tiny

QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


# -- mapping -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("S,R,N", [(4, 2, 5), (4, 2, 9), (3, 3, 6), (3, 3, 8), (2, 5, 4), (1, 1, 2)])
def test_every_worker_has_one_rank_and_every_rank_one_stage(S, R, N):
    m = RankMap(S, R, N)
    workers = WorkerTable(S, R)
    assert set(m.host) == set(workers.ids)
    assert set(m.host.values()) == set(range(1, N))  # every worker rank hosts someone; rank 0 hosts no worker
    for rank in range(1, N):
        stages = {workers.stage[i] for i in m.hosted(rank, workers)}
        assert len(stages) == 1 and stages == {m.stage_of_rank(rank)}
        hosted = m.hosted(rank, workers)
        assert hosted == list(range(hosted[0], hosted[-1] + 1))  # contiguous groups
    if N == S * R + 1:
        assert all(len(m.hosted(r, workers)) == 1 for r in range(1, N))


def test_world_size_outside_the_mesh_is_a_located_error():
    with pytest.raises(ConfigError, match="use --nproc between 5 and 9"):
        RankMap(4, 2, 4)
    with pytest.raises(ConfigError, match="between 5 and 9"):
        RankMap(4, 2, 10)


def test_a_replacement_goes_to_the_least_loaded_rank_of_its_stage():
    m, workers = RankMap(3, 3, 6), WorkerTable(3, 3)  # stage 1 on ranks 3 (r0, r1) and 4 (r2)
    assert (m.host["s1r0"], m.host["s1r1"], m.host["s1r2"]) == (3, 3, 4)
    workers.ban("s1r2")
    idx = workers.add_replacement(1)
    assert m.place(workers.ids[idx], 1, workers) == 4
    workers.ban("s1r0")
    idx = workers.add_replacement(1)
    assert m.place(workers.ids[idx], 1, workers) == 3  # tie (one live each): the lower rank


# -- wire ----------------------------------------------------------------------------------------------
def test_a_wire_round_trips_through_its_body():
    wire = Wire({"q": torch.arange(-5, 5, dtype=torch.int8), "scale": torch.rand(3)}, {"codec": "int8", "k": 3})
    n, body = W.encode_body(wire)
    back = W.parse_body(body, n)
    assert back.meta == wire.meta and back.tensors.keys() == wire.tensors.keys()
    for k in wire.tensors:
        assert torch.equal(back.tensors[k], wire.tensors[k])


@pytest.mark.parametrize("tamper", ["extra", "short", "manifest", "dtype", "shape"])
def test_inconsistent_bodies_are_wire_errors(tamper):
    n, body = W.encode_body(Wire({"x": torch.ones(4, 8)}))
    if tamper == "extra":
        body = torch.cat([body, torch.zeros(3, dtype=torch.uint8)])
    elif tamper == "short":
        body = body[:-4]
    elif tamper == "manifest":
        body = torch.cat([torch.full((n,), 35, dtype=torch.uint8), body[n:]])
    else:
        text = bytes(body[:n].tolist()).decode().replace("float32", "complex64" if tamper == "dtype" else "float32")
        text = text.replace("[4,8]", "[-4,8]") if tamper == "shape" else text
        head = torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)
        body, n = torch.cat([head, body[n:]]), len(text)
    with pytest.raises(W.WireError):
        W.parse_body(body, n)


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=0, max_size=300), st.integers(-5, 400))
def test_arbitrary_bytes_never_crash_the_parser(data, manifest_len):
    body = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    try:
        W.parse_body(body, manifest_len)
    except W.WireError:
        pass


def test_fault_specs_are_validated():
    assert parse_faults(["shape:s1r0:2"])[0].worker == "s1r0"
    with pytest.raises(ConfigError, match="KIND:WORKER:STEP"):
        parse_faults(["explode:s1r0:2"])


# -- merge ---------------------------------------------------------------------------------------------
def _msg(log, step, mb, boundary, role, sender, receiver):
    m = Message(step, mb, boundary, Role(role), sender, receiver, torch.zeros(1), wire_bytes=4)
    m.msg_id = log.next_message_id()
    log.log_message(m)
    return m


def test_merge_maps_provisional_ids_and_orders_rows_as_sim():
    relay = EventLog()
    for w in ("s0r0", "s1r0", "s2r0"):
        relay.worker_index(w)
    a = _msg(relay, 0, 0, 0, 0, "s0r0", "s1r0")
    b = _msg(relay, 0, 0, 1, 0, "s1r0", "s2r0")
    c = _msg(relay, 0, 0, 0, 1, "s1r0", "s0r0")
    part1, part0 = EventLog(), EventLog()
    part1.log_tamper(Message(0, 0, 0, Role.GRADIENT, "s1r0", "s0r0", torch.zeros(1), msg_id=1 << 40), "scaling", 2.0)
    part1.log_tamper(Message(0, 0, 1, Role.ACTIVATION, "s1r0", "s2r0", torch.zeros(1), msg_id=7), "bias", 1.0)
    part1.log_tamper(Message(0, -1, 1, Role.DP_GRADIENT, "s1r0", "", torch.zeros(1)), "ipm", 0.5)
    part0.log_tamper(Message(0, 0, 0, Role.ACTIVATION, "s0r0", "s1r0", torch.zeros(1), msg_id=99), "bias", 1.0)
    part1.log_loss(0, 1, 2.0)
    part0.log_loss(0, 0, 3.0)
    merged = log_from_bytes(log_to_bytes(merge(relay, [log_from_bytes(log_to_bytes(p)) for p in (part1, part0)])))
    g = merged.ground_truth
    assert list(g["msg"]) == [a.msg_id, b.msg_id, c.msg_id, -1]
    assert [merged.attacks[i] for i in g["attack"]] == ["bias", "bias", "scaling", "ipm"]
    assert merged.attacks == ["bias", "scaling", "ipm"]  # first appearance, as sim appends them
    assert list(merged.losses["mb"]) == [0, 1]
    assert len(merged.messages) == 3 and merged.workers == ["s0r0", "s1r0", "s2r0"]


# -- the relay's flow is sim's control flow --------------------------------------------------------------
class _Drop:
    """Drops a fixed set of (step, mb, boundary, role) messages."""

    def __init__(self, drops):
        self.drops = drops

    def observe(self, msg):
        from sentinel.detectors import Verdict

        return Verdict({}, False)

    def deliver(self, msg, verdict, substitute=None):
        return None if (msg.step, msg.mb_idx, msg.boundary, int(msg.role)) in self.drops else msg.payload

    def substitute(self, msg):
        return None

    def end_step(self, step, records):
        pass


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_relay_flow_takes_messages_in_sims_order_under_drops(schedule):
    drops = {(0, 0, 1, 0), (0, 2, 0, 1), (0, 3, 2, 0), (0, 1, 1, 1)}
    sc = tiny("pipeline.replicas=2", "pipeline.microbatches=5", f"pipeline.schedule={schedule}", "training.steps=1")
    drop = _Drop(drops)
    eng = SimEngine(sc, verifier=drop, responder=drop)
    plan = eng.router.route(0, eng.num_microbatches)
    eng.train_step()
    m = eng.log.messages
    sim_order = list(zip(m["mb"], m["boundary"], m["role"]))
    order, posts = [], []

    def carry(mb, boundary, role, sender, receiver):
        assert (sender, receiver) == (plan[mb, boundary + (role == 1)], plan[mb, boundary + (role == 0)])
        order.append((mb, boundary, int(role)))
        return None if (0, mb, boundary, int(role)) in drops else torch.zeros(1)

    flow = RelayFlow(eng.num_stages, plan, carry, lambda kind, s, mb, t: posts.append((kind, s, mb)))
    execute(eng.schedule, flow.ready, flow.run)
    assert order == sim_order
    # every forward after stage 0 gets exactly one input; every backward that needs one gets exactly one
    assert len(posts) == len(set(posts))
    assert {(s, mb) for k, s, mb in posts if k == W.KIND_ACT} == {(s, mb) for s in range(1, 4) for mb in range(5)}


# -- what the dist backend refuses, and the CLI ------------------------------------------------------------
def test_features_the_dist_backend_does_not_run_are_config_errors():
    check_supported(tiny())
    with pytest.raises(ConfigError, match="recomputation"):
        check_supported(tiny("detector.name=duplication"))


def test_cli_dist_flags_are_checked_before_anything_starts(capsys, tmp_path):
    qs = str(QUICKSTART)
    assert main(["run", qs, "--backend", "dist", "--nproc", "3", "--out", str(tmp_path / "a")]) == 2
    assert "use --nproc between 5 and 9" in capsys.readouterr().err
    assert main(["run", qs, "--nproc", "5", "--out", str(tmp_path / "b")]) == 2
    assert "only used with --backend dist" in capsys.readouterr().err


def test_merged_logs_keep_numbers_exact():
    log = EventLog()
    log.log_loss(3, 1, np.float64(1.2345678901234567))
    assert log_from_bytes(log_to_bytes(log)).losses["loss"][0] == np.float64(1.2345678901234567)
