"""DP-sync compression (low rank, top-k, error feedback) and AsyncMesh sparse averaging."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sentinel.engine.dp_compress import DPCompressor
from sentinel.engine.sim import SimEngine
from sentinel.engine.sparse_avg import SparseAveraging, flat_slice, write_slice
from tests.conftest import tiny


def cfg(**kw):
    return tiny(*[f"dp.compression.{k}={v}" for k, v in kw.items()]).dp.compression


def test_low_rank_reconstructs_a_low_rank_gradient_and_counts_p_and_q():
    gen = torch.Generator().manual_seed(0)
    M = torch.randn(12, 2, generator=gen) @ torch.randn(2, 9, generator=gen)  # rank 2
    bias = torch.randn(5, generator=gen)
    vec = torch.cat([M.reshape(-1), bias])
    comp = DPCompressor(cfg(method="low_rank", rank=2, error_feedback="false"), seed=0)
    out = comp(0, 1, ["a", "b"], torch.stack([vec, vec]), [torch.Size([12, 9]), torch.Size([5])])
    torch.testing.assert_close(out[0], vec, atol=1e-4, rtol=1e-4)
    assert comp.step_bytes[1] == 4 * 2 * (12 + 9) + 4 * 5


def test_error_feedback_telescopes():
    """sum_t sent_t + e_T = sum_t g_t: nothing compression drops is lost for good."""
    comp = DPCompressor(cfg(method="topk", fraction=0.1), seed=0)
    gen = torch.Generator().manual_seed(1)
    total_in, total_sent = torch.zeros(50), torch.zeros(50)
    for t in range(6):
        g = torch.randn(2, 50, generator=gen)
        sent = comp(t, 0, ["a", "b"], g, [torch.Size([50])])
        assert int((sent[0] != 0).sum()) <= 5 and comp.step_bytes[0] == 5 * 8
        total_in += g[0]
        total_sent += sent[0]
    torch.testing.assert_close(total_sent + comp.errors["a"], total_in, atol=1e-5, rtol=1e-5)


def test_a_single_replica_sends_nothing():
    comp = DPCompressor(cfg(method="topk"), seed=0)
    v = torch.randn(1, 10)
    assert comp(0, 0, ["a"], v, [torch.Size([10])]) is v and comp.step_bytes[0] == 0


def test_compressed_allreduce_trains_and_counts_bytes():
    eng = SimEngine(
        tiny("pipeline.replicas=2", "dp.compression.method=low_rank", "dp.compression.rank=2", "training.steps=6")
    )
    before = eng.evaluate()
    for _ in range(6):
        eng.train_step()
    assert eng.evaluate() < before
    dense = sum(p.numel() for r in eng.replicas.values() for p in r.params) * 4 * 6
    assert 0 < eng.dp_compressor.bytes_sent < dense / 2


def test_flat_slices_cross_parameter_boundaries():
    params = [torch.nn.Parameter(torch.arange(4.0)), torch.nn.Parameter(torch.arange(4.0, 10.0).reshape(2, 3))]
    assert flat_slice(params, 2, 7).tolist() == [2, 3, 4, 5, 6]
    write_slice(params, 3, 6, torch.tensor([-1.0, -2.0, -3.0]))
    assert params[0].tolist() == [0, 1, 2, -1] and params[1].reshape(-1).tolist()[:3] == [-2, -3, 6]


def _two_replicas(values_a, values_b):
    from sentinel.engine.aggregators import Mean

    reps = [
        SimpleNamespace(wid=w, params=[torch.nn.Parameter(torch.tensor(v))])
        for w, v in (("a", values_a), ("b", values_b))
    ]
    return SimpleNamespace(
        num_stages=1,
        replicas=dict(enumerate(reps)),
        aggregator=Mean(),
        adversary=None,
        templates=[torch.nn.ParameterList(reps[0].params)],
        placement=SimpleNamespace(stages=lambda: [0]),
        workers=SimpleNamespace(live_in_stage=lambda s: [0, 1]),
        collective=SimpleNamespace(gather=_gather),
    )


def _gather(stage_idx, rows, numel):
    """One process's collective: it returns the rows, which must be as long as the caller says (other processes size
    their all-gather rows from `numel`)."""
    assert all(v.numel() == numel for _, _, v in rows)
    return rows


def test_sparse_averaging_rotates_over_all_parameters():
    sc = tiny("dp.sync=sparse_avg", "dp.sparse_avg.every=2", "dp.sparse_avg.fraction=0.25")
    hook = SparseAveraging(sc.dp.sparse_avg)
    eng = _two_replicas([0.0] * 8, [8.0] * 8)
    for step in range(8):
        hook.after_update(eng, SimpleNamespace(step=step))
        done = (step + 1) // 2  # rounds so far: 2 entries each
        a = eng.replicas[0].params[0].tolist()
        assert a == [4.0] * (2 * done) + [0.0] * (8 - 2 * done)
        assert hook.step_bytes == ({0: 8} if step % 2 else {})


def test_delayed_average_delta_correction_keeps_local_progress():
    sc = tiny("dp.sync=sparse_avg", "dp.sparse_avg.every=1", "dp.sparse_avg.fraction=1", "dp.sparse_avg.delay=1")
    hook = SparseAveraging(sc.dp.sparse_avg)
    eng = _two_replicas([0.0], [2.0])
    hook.after_update(eng, SimpleNamespace(step=0))  # average 1.0 taken now, applied after step 1
    assert eng.replicas[0].params[0].item() == 0.0
    with torch.no_grad():
        for r in eng.replicas.values():
            r.params[0].add_(10.0)  # one more local step each
    hook.pending = hook.pending[:1]
    hook.round = 0
    hook.cfg = tiny(
        "dp.sync=sparse_avg", "dp.sparse_avg.every=1000", "dp.sparse_avg.fraction=1", "dp.sparse_avg.delay=1"
    ).dp.sparse_avg  # no new round: watch the pending one land
    hook.after_update(eng, SimpleNamespace(step=1))
    assert [r.params[0].item() for r in eng.replicas.values()] == [11.0, 11.0]  # 10 + avg(0, 2)


def test_sparse_avg_engine_runs_local_steps_and_averages():
    eng = SimEngine(
        tiny(
            "pipeline.replicas=2",
            "dp.sync=sparse_avg",
            "dp.sparse_avg.every=3",
            "dp.sparse_avg.fraction=1",
            "training.steps=6",
        )
    )
    for _ in range(5):
        eng.train_step()
    reps = [eng.replicas[i] for i in eng.workers.live_in_stage(1)]
    assert not torch.equal(reps[0].params[0], reps[1].params[0])  # drifted by local steps 3 and 4
    eng.train_step()  # step 5: (5 + 1) % 3 == 0 -> full average
    for a, b in zip(reps[0].params, reps[1].params):
        torch.testing.assert_close(a, b)
