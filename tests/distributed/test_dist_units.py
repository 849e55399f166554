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
from sentinel.distributed.mapping import RankMap
from sentinel.distributed.merge import log_from_bytes, log_to_bytes, merge
from sentinel.distributed.runtime import check_supported
from sentinel.engine.workers import WorkerTable
from sentinel.errors import ConfigError
from sentinel.eventlog import EventLog
from sentinel.transport.message import Message, Role, Wire, message_id
from tests.conftest import tiny

QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


# -- mapping -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "S,R,N", [(4, 2, 5), (4, 2, 7), (4, 2, 11), (3, 3, 6), (3, 3, 8), (2, 5, 4), (1, 1, 2), (16, 11, 191)]
)
def test_every_worker_has_one_rank_and_every_rank_one_stage(S, R, N):
    m = RankMap(S, R, N)
    workers = WorkerTable(S, R)
    V = m.num_verifiers
    assert V == max(1, min(S - 1, N - S))  # one verifier per boundary when the processes allow it
    assert sorted(b for r in range(V) for b in m.boundaries(r)) == list(range(S - 1))  # each boundary once
    assert all(list(m.boundaries(r)) == sorted(m.boundaries(r)) for r in range(V))  # contiguous groups
    assert set(m.host) == set(workers.ids)
    assert set(m.host.values()) == set(range(V, N))  # every worker rank hosts someone; verifiers host no worker
    for rank in range(V, N):
        stages = {workers.stage[i] for i in m.hosted(rank, workers)}
        assert len(stages) == 1 and stages == {m.stage_of_rank(rank)}
        hosted = m.hosted(rank, workers)
        assert hosted == list(range(hosted[0], hosted[-1] + 1))  # contiguous groups
    if N == S * R + V:
        assert all(len(m.hosted(r, workers)) == 1 for r in range(V, N))


def test_verifier_count_is_chosen_or_checked():
    assert RankMap(4, 2, 11).num_verifiers == 3 and RankMap(4, 2, 5).num_verifiers == 1
    assert RankMap(4, 2, 8, verifiers=2).boundaries(0) == [0, 1]  # several boundaries per process
    with pytest.raises(ConfigError, match="--verifiers 4: between 1 and 3"):
        RankMap(4, 2, 11, verifiers=4)


def test_world_size_outside_the_mesh_is_a_located_error():
    with pytest.raises(ConfigError, match="use --nproc between 5 and 9"):
        RankMap(4, 2, 4)
    with pytest.raises(ConfigError, match="use --nproc between 7 and 11"):
        RankMap(4, 2, 12)


def test_a_replacement_goes_to_the_least_loaded_rank_of_its_stage():
    m, workers = RankMap(3, 3, 7), WorkerTable(3, 3)  # 2 verifiers; stage 1 on ranks 4 (r0, r1) and 5 (r2)
    assert (m.host["s1r0"], m.host["s1r1"], m.host["s1r2"]) == (4, 4, 5)
    workers.ban("s1r2")
    idx = workers.add_replacement(1)
    assert m.place(workers.ids[idx], 1, workers) == 5
    workers.ban("s1r0")
    idx = workers.add_replacement(1)
    assert m.place(workers.ids[idx], 1, workers) == 4  # tie (one live each): the lower rank


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
    m = Message(
        step, mb, boundary, Role(role), sender, receiver, torch.zeros(1), wire_bytes=4, msg_id=len(log.messages)
    )
    log.log_message(m)
    return m


def test_merge_joins_the_parts_and_orders_rows_as_sim():
    """Verifier parts hold messages and verdicts, worker parts ground truth and losses; ids are canonical."""
    base, verifier1, worker1, worker2 = EventLog(), EventLog(), EventLog(), EventLog()
    for w in ("s0r0", "s1r0", "s2r0"):
        base.worker_index(w)
    a = _msg(base, 0, 0, 0, 0, "s0r0", "s1r0")
    c = _msg(base, 0, 0, 0, 1, "s1r0", "s0r0")
    b = Message(0, 0, 1, Role.ACTIVATION, "s1r0", "s2r0", torch.zeros(1), wire_bytes=4, msg_id=a.msg_id + 1)
    verifier1.log_message(b)
    a, b, c = a.replace(msg_id=0), b.replace(msg_id=1), c.replace(msg_id=3)  # hop order: 0 -> 1 forward, 1 -> 0 back
    base.messages._cols["id"][:2] = [0, 3]
    verifier1.messages._cols["id"][:1] = [1]
    worker1.log_tamper(c, "scaling", 2.0)
    worker1.log_tamper(b, "bias", 1.0)
    worker1.log_tamper(Message(0, -1, 1, Role.DP_GRADIENT, "s1r0", "", torch.zeros(1)), "ipm", 0.5)
    worker2.log_tamper(a, "bias", 1.0)
    worker1.log_loss(0, 1, 2.0)
    worker2.log_loss(0, 0, 3.0)
    base.log_ban(0, "s1r0")
    worker1.log_ban(0, "s1r0")  # every rank applies a ban: the coordinator's record is the one kept
    parts = [("verifier", verifier1), ("worker", worker1), ("worker", worker2)]
    merged = log_from_bytes(log_to_bytes(merge(base, [(k, log_from_bytes(log_to_bytes(p))) for k, p in parts])))
    assert list(merged.messages["id"]) == [0, 1, 3]
    g = merged.ground_truth
    assert list(g["msg"]) == [0, 1, 3, -1]
    assert [merged.attacks[i] for i in g["attack"]] == ["bias", "bias", "scaling", "ipm"]
    assert merged.attacks == ["bias", "scaling", "ipm"]  # first appearance in canonical order
    assert list(merged.losses["mb"]) == [0, 1] and len(merged.bans) == 1
    assert merged.workers == ["s0r0", "s1r0", "s2r0"]


def test_canonical_order_does_not_depend_on_logging_order():
    """The same rows logged in two orders give identical logs once canonical (sim logs in executor order)."""
    import random

    rows = [(step, mb, b, role) for step in range(2) for mb in range(3) for b in range(2) for role in (0, 1)]
    logs = []
    for seed in (0, 1):
        log = EventLog()
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        for step, mb, b, role in shuffled:
            m = Message(
                step,
                mb,
                b,
                Role(role),
                "s1r0",
                "s0r0",
                torch.zeros(1),
                msg_id=message_id(step, mb, b, Role(role), 3, 3),
            )
            log.log_message(m)
            if mb == 1:
                log.log_tamper(m, "bias" if role else "scaling", 1.0)
            log.log_loss(step, mb, float(mb))
        logs.append(log.canonicalize())
    for t in EventLog.TABLES:
        for k, v in getattr(logs[0], t).as_arrays().items():
            np.testing.assert_array_equal(v, getattr(logs[1], t)[k], err_msg=f"{t}.{k}")
    assert logs[0].attacks == logs[1].attacks


# -- what the dist backend refuses, and the CLI ------------------------------------------------------------
def test_the_dist_backend_refuses_no_scenario_feature():
    for overrides in (
        (),
        ("detector.name=duplication",),
        ("transport.async.max_staleness=2",),
        (
            "pipeline.replicas=3",
            "adversary.fraction=0.34",
            "detector.name=sentinel",
            "adversary.attacks=[{name: intermittent, attack: fence_evasion}]",
        ),
    ):
        check_supported(tiny(*overrides))


def test_cli_dist_flags_are_checked_before_anything_starts(capsys, tmp_path):
    qs = str(QUICKSTART)
    assert main(["run", qs, "--backend", "dist", "--nproc", "3", "--out", str(tmp_path / "a")]) == 2
    assert "use --nproc between 5 and 9" in capsys.readouterr().err  # 3 processes cannot host 4 stages
    assert main(["run", qs, "--nproc", "5", "--out", str(tmp_path / "b")]) == 2
    assert "only used with --backend dist" in capsys.readouterr().err


def test_merged_logs_keep_numbers_exact():
    log = EventLog()
    log.log_loss(3, 1, np.float64(1.2345678901234567))
    assert log_from_bytes(log_to_bytes(log)).losses["loss"][0] == np.float64(1.2345678901234567)


def test_verdict_records_cross_processes_with_their_pvalues():
    """The coordinator's response policy accumulates sequential evidence: the p-values must survive the channel."""
    import json

    from sentinel.distributed.channels import _record_from_json, _record_to_json
    from sentinel.transport.verdict import Marker, Verdict

    msg = Message(3, 1, 2, Role.GRADIENT, "s3r0", "s2r1", torch.ones(1), msg_id=17)
    for v in (Verdict({"l1": 0.5}, True, frozenset({Marker.OUTLIER}), 1.5e-300, 0.25), Verdict({}, False)):
        m2, v2 = _record_from_json(json.loads(json.dumps(_record_to_json(msg, v))))
        assert v2 == v and (m2.step, m2.mb_idx, m2.boundary, m2.role, m2.sender, m2.msg_id) == (
            3,
            1,
            2,
            Role.GRADIENT,
            "s3r0",
            17,
        )


def test_a_slot_carries_its_header_and_body_in_one_buffer():
    shape = (2, 4, 8)
    n, body = W.encode_body(Wire({"x": torch.randn(shape)}))
    size = W.message_slot(shape)
    assert W.HEAD_BYTES + body.numel() <= size  # an honest identity-codec body travels in the slot
    head = W.message_header(
        Message(3, 1, 0, Role.ACTIVATION, "a", "b", torch.empty(0)), 0, 1, n, body.numel() - n, True
    )
    h, rest = W.unpack(W.pack(head, body, size))
    assert h == head.tolist() and h[10] == 1
    back = W.parse_body(rest[: h[8] + h[9]].clone(), h[8])
    assert torch.equal(back.tensors["x"], W.parse_body(body, n).tensors["x"])
    payload = torch.randn(shape)
    h, rest = W.unpack(W.pack(W.header(W.DELIVER, 3, 1, 1, 0, 0), payload, W.deliver_slot(shape)))
    assert h[1] == W.DELIVER and torch.equal(rest.view(torch.float32).view(shape), payload)
