"""Replay memories: exact fingerprints, and replays of randomly masked tensors (re-masked, never exact)."""

from __future__ import annotations

import torch

from sentinel.detectors.replay import SparseReplayMemory
from sentinel.transport.codecs import CodecContext, RandomMask
from sentinel.transport.message import Role

SHAPE = (4, 32, 64)


def _masked(x: torch.Tensor, step: int, mb: int, keep: float = 0.05, dtype: str = "float32") -> torch.Tensor:
    """What the relay sees of x sent at (step, mb): the random mask of that message, rescaled."""
    codec = RandomMask(RandomMask.Config(keep=keep, value_dtype=dtype))
    ctx = CodecContext(step=step, mb_idx=mb, boundary=1, role=Role.ACTIVATION, seed=0, shape=x.shape, dtype=x.dtype)
    return codec.decode(codec.encode(x, ctx), ctx)


def _honest(gen: torch.Generator, step: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=gen) * (1.0 + 0.01 * step)


def test_a_re_masked_replay_is_recognised_and_honest_masked_traffic_is_not():
    gen = torch.Generator().manual_seed(0)
    mem = SparseReplayMemory(seed=0)
    sent = {}
    for step in range(60):  # 4 microbatches a step, all honest: never a replay
        for mb in range(4):
            x = _honest(gen, step)
            sent[(step, mb)] = x
            assert not mem.seen_before((1, 0), _masked(x, step, mb))
    # a 5-step delay: the stale tensor goes out under this message's (different) mask
    assert mem.seen_before((1, 0), _masked(sent[(55, 2)], 60, 2))
    assert mem.seen_before((1, 0), _masked(sent[(40, 0)], 60, 3))  # another microbatch's, 20 steps old
    assert not mem.seen_before((1, 1), _masked(sent[(55, 1)], 60, 1))  # another stream: nothing remembered


def test_coarse_honest_values_do_not_look_like_replays():
    # bfloat16 values repeat by chance at the same position; chance matches are spread over many messages
    gen = torch.Generator().manual_seed(1)
    mem = SparseReplayMemory(seed=0)
    flags = [
        mem.seen_before((1, 0), _masked(_honest(gen, s), s, mb, keep=0.1, dtype="bfloat16"))
        for s in range(60)
        for mb in range(4)
    ]
    assert not any(flags)
    x = _honest(gen, 0)
    mem.seen_before((1, 0), _masked(x, 61, 0, keep=0.1, dtype="bfloat16"))
    assert mem.seen_before((1, 0), _masked(x, 66, 0, keep=0.1, dtype="bfloat16"))


def test_dense_payloads_are_left_to_the_exact_fingerprint():
    mem = SparseReplayMemory(seed=0)
    x = torch.randn(SHAPE)
    assert not mem.seen_before((1, 0), x) and not mem.seen_before((1, 0), x)  # not its job: no exact zeros
    assert not mem._streams  # nothing stored for dense traffic


def test_large_tensors_track_a_subset_of_positions():
    gen = torch.Generator().manual_seed(2)
    mem = SparseReplayMemory(seed=0, max_positions=4096)
    shape = (8, 64, 128)  # 65536 entries, 4096 tracked
    xs = [torch.randn(shape, generator=gen) for _ in range(12)]
    for i, x in enumerate(xs):
        assert not mem.seen_before((1, 0), _masked(x, i, 0))
    track, values, _, _ = next(iter(mem._streams.values()))
    assert values.shape[0] == 4096 and (track >= 0).sum() == 4096
    assert mem.seen_before((1, 0), _masked(xs[3], 20, 0))


def test_the_exact_fingerprint_does_not_confuse_two_sparse_payloads():
    from sentinel.detectors.replay import Fingerprint

    fp = Fingerprint(seed=0)
    a, b = torch.zeros(SHAPE), torch.zeros(SHAPE)
    a.view(-1)[7], b.view(-1)[9] = 1.0, 1.0  # top-k at 1/8192: the 64 sampled entries are all zero in both
    assert fp(a) != fp(b) and fp(a) == fp(a.clone())
