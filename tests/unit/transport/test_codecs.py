"""Codecs: round-trip error bounds, exact byte accounting, the shared random mask, robustness (hypothesis)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.registry import CODECS
from sentinel.transport.codecs import CodecContext, RandomMask, TopK
from sentinel.transport.message import Role
from sentinel.transport.subspace import Subspace

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)
shapes = st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple)
seeds = st.integers(0, 2**31 - 1)
roles = st.sampled_from([Role.ACTIVATION, Role.GRADIENT])


def make(name: str, **kw):
    cls = CODECS.get(name)
    if name == "subspace":
        kw.setdefault("embed_offset", False)  # no engine in a unit test (tokens: see test_subspace_*)
    return cls(cls.Config(**kw))


def ctx_for(x: torch.Tensor, step=3, mb=1, boundary=0, role=Role.ACTIVATION, seed=0) -> CodecContext:
    return CodecContext(step, mb, boundary, role, seed, tuple(x.shape), x.dtype)


def tensor(shape, seed, scale=1.0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def roundtrip(codec, x, ctx):
    wire = codec.encode(x, ctx)
    return wire, codec.decode(wire, ctx)


@pytest.mark.parametrize("name", CODECS.names())
@SETTINGS
@given(shape=shapes, seed=seeds, role=roles)
def test_every_codec_keeps_shape_dtype_and_charges_exact_bytes(name, shape, seed, role):
    codec = make(name)
    x = tensor(shape, seed)
    wire, y = roundtrip(codec, x, ctx_for(x, role=role))
    assert y.shape == x.shape and y.dtype == x.dtype and torch.isfinite(y).all()
    assert wire.nbytes() == codec.expected_nbytes(tuple(shape), role)
    assert wire.nbytes() == sum(t.numel() * t.element_size() for t in wire.tensors.values())


@SETTINGS
@given(shape=shapes, seed=seeds, scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_casts_relative_error(shape, seed, scale):
    x = tensor(shape, seed, scale)
    for name, rel in (("fp16", 2**-11), ("bf16", 2**-8)):
        _, y = roundtrip(make(name), x, ctx_for(x))
        assert ((y - x).abs() <= rel * x.abs() + 1e-7).all(), name
    _, y = roundtrip(make("identity"), x, ctx_for(x))
    assert torch.equal(y, x)


def test_fp16_saturates_instead_of_overflowing():
    x = torch.tensor([[1e6, -1e6, 3.0]])
    _, y = roundtrip(make("fp16"), x, ctx_for(x))
    assert torch.isfinite(y).all() and y[0, 0] == 65504 and y[0, 1] == -65504


@pytest.mark.parametrize("name,qmax", [("int8", 127), ("int4", 7)])
@SETTINGS
@given(shape=shapes, seed=seeds, scale=st.sampled_from([1e-4, 1.0, 1e4]))
def test_quantization_error_is_at_most_half_a_step_per_row(name, qmax, shape, seed, scale):
    x = tensor(shape, seed, scale)
    _, y = roundtrip(make(name), x, ctx_for(x))
    rows = x.reshape(-1, shape[-1])
    step = rows.abs().amax(1, keepdim=True) / qmax
    err = (y.reshape(rows.shape) - rows).abs()
    assert (err <= step / 2 * (1 + 1e-5) + 1e-30).all()


def test_quantization_of_non_finite_input_stays_finite():
    x = torch.tensor([[float("inf"), 1.0, float("nan")], [0.0, 0.0, 0.0]])
    for name in ("int8", "int4"):
        _, y = roundtrip(make(name), x, ctx_for(x))
        assert torch.isfinite(y).all() and (y[1] == 0).all()


@SETTINGS
@given(shape=shapes, seed=seeds, fraction=st.sampled_from([0.01, 0.1, 0.5, 1.0]))
def test_topk_keeps_the_largest_entries_exactly(shape, seed, fraction):
    codec = make("topk", fraction=fraction)
    x = tensor(shape, seed)
    wire, y = roundtrip(codec, x, ctx_for(x))
    n, k = x.numel(), codec.k(x.numel())
    kept = y != 0
    assert int(kept.sum()) <= k and torch.equal(y[kept], x[kept])
    if k < n:
        assert x[~kept].abs().max() <= x[kept].abs().min()
    assert (x - y).pow(2).sum() <= (1 - k / n) * x.pow(2).sum() + 1e-6
    assert wire.tensors["idx"].dtype == torch.int32


def test_topk_decode_survives_out_of_range_indices():
    codec = make("topk", fraction=0.5)
    x = torch.arange(1.0, 9.0).reshape(2, 4)
    ctx = ctx_for(x)
    wire = codec.encode(x, ctx)
    wire.tensors["idx"] = wire.tensors["idx"] + 1000  # a tampered index: taken modulo n, never a crash
    assert codec.decode(wire, ctx).shape == x.shape


@SETTINGS
@given(
    shape=shapes, seed=seeds, keep=st.sampled_from([0.05, 0.1, 0.5, 1.0]), gran=st.sampled_from(["element", "feature"])
)
def test_random_mask_is_shared_by_both_ends_and_both_directions(shape, seed, keep, gran):
    sender, receiver = (
        make("random_mask", keep=keep, granularity=gran),
        make("random_mask", keep=keep, granularity=gran),
    )
    x = tensor(shape, seed)
    fwd = ctx_for(x, step=seed % 97, mb=2, boundary=1, role=Role.ACTIVATION, seed=seed)
    bwd = ctx_for(x, step=seed % 97, mb=2, boundary=1, role=Role.GRADIENT, seed=seed)
    assert torch.equal(sender.mask_indices(fwd), receiver.mask_indices(fwd))  # two independent instances
    assert torch.equal(sender.mask_indices(fwd), receiver.mask_indices(bwd))  # forward mask == backward mask
    wire = sender.encode(x, fwd)
    y = receiver.decode(wire, fwd)
    # no indices on the wire: one floating tensor holding exactly the kept values
    assert list(wire.tensors) == ["v"] and wire.tensors["v"].is_floating_point()
    idx = sender.mask_indices(fwd)
    n = shape[-1] if gran == "feature" else x.numel()
    scale = n / len(idx)
    if gran == "element":
        dense = torch.zeros(x.numel())
        dense[idx] = x.reshape(-1)[idx] * scale
    else:
        dense = torch.zeros_like(x)
        dense[..., idx] = x[..., idx] * scale
    torch.testing.assert_close(y, dense.reshape(x.shape))


def test_random_mask_differs_across_messages_and_seeds():
    codec = make("random_mask", keep=0.1)
    x = torch.zeros(4, 8, 16)
    base = codec.mask_indices(ctx_for(x))
    for other in (ctx_for(x, step=4), ctx_for(x, mb=2), ctx_for(x, boundary=1), ctx_for(x, seed=1)):
        assert not torch.equal(codec.mask_indices(other), base)


def test_random_mask_is_unbiased_over_masks():
    """E[decoded] = x: the mean over many (step) masks converges to x."""
    codec = make("random_mask", keep=0.25)
    x = tensor((6, 5), 7)
    mean = torch.stack([roundtrip(codec, x, ctx_for(x, step=t))[1] for t in range(4000)]).mean(0)
    assert (mean - x).abs().max() < 0.12 * x.abs().max()


def test_random_mask_backward_is_the_chain_rule_of_the_masked_forward():
    codec = make("random_mask", keep=0.2)
    h = tensor((3, 4, 5), 1).requires_grad_()
    fwd, bwd = ctx_for(h), ctx_for(h, role=Role.GRADIENT)
    g = tensor((3, 4, 5), 2)
    idx = codec.mask_indices(fwd)
    mask = torch.zeros(h.numel())
    mask[idx] = h.numel() / len(idx)
    (h.reshape(-1) * mask).reshape(h.shape).backward(g)  # autograd through the masked forward
    _, sent_back = roundtrip(codec, g, bwd)
    torch.testing.assert_close(sent_back, h.grad)


@SETTINGS
@given(
    shape=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(2, 24)),
    seed=seeds,
    rate=st.sampled_from([1.0, 2.0, 4.0, 32.0]),
)
def test_subspace_is_the_orthogonal_projection_onto_span_u(shape, seed, rate):
    codec = make("subspace", rate=rate)
    x = tensor(shape, seed)
    ctx = ctx_for(x, seed=seed)
    _, y = roundtrip(codec, x, ctx)
    U = codec.basis(shape[-1], seed)
    assert U.shape == (shape[-1], codec.k(shape[-1]))
    torch.testing.assert_close(U.T @ U, torch.eye(U.shape[1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(y, x @ U @ U.T, atol=1e-5, rtol=1e-5)
    assert y.norm() <= x.norm() * (1 + 1e-5)
    inside = (x @ U) @ U.T  # a tensor already in span(U) crosses losslessly
    torch.testing.assert_close(roundtrip(codec, inside, ctx)[1], inside, atol=1e-5, rtol=1e-5)


def test_subspace_embed_offset_sends_tokens_and_restores_the_embedding():
    codec = Subspace(Subspace.Config(rate=8))
    vocab, d = 50, 16
    E = tensor((vocab, d), 3)
    tokens = torch.randint(0, vocab, (2, 5), generator=torch.Generator().manual_seed(0))
    codec.bind(E, vocab, lambda step, mb: tokens, seed=0)
    U = codec.basis(d)
    h = E[tokens] + tensor((2, 5, codec.k(d)), 4) @ U.T  # embedding + a residual inside span(U)
    ctx = ctx_for(h)
    wire, y = roundtrip(codec, h, ctx)
    torch.testing.assert_close(y, h, atol=1e-5, rtol=1e-5)  # lossless
    assert wire.tensors["tokens"].dtype == torch.uint8
    assert wire.nbytes() == codec.expected_nbytes(tuple(h.shape)) == 2 * 5 * (codec.k(d) * 4 + 1)
    grad_wire = codec.encode(h, ctx_for(h, role=Role.GRADIENT))
    assert "tokens" not in grad_wire.tensors  # gradients carry no embedding offset


def test_subspace_without_tokens_fails_clearly():
    from sentinel.errors import RunError

    codec = Subspace(Subspace.Config(rate=2))
    x = torch.zeros(1, 2, 4)
    with pytest.raises(RunError, match="needs token ids"):
        codec.encode(x, ctx_for(x))


def test_compression_rates_of_the_typical_settings():
    shape = (8, 64, 256)
    ident = make("identity").expected_nbytes(shape)
    rates = {
        "fp16": make("fp16"),
        "int8": make("int8"),
        "int4": make("int4"),
        "topk10": TopK(TopK.Config(fraction=0.1)),
        "mask90": RandomMask(RandomMask.Config(keep=0.1)),
        "mask95": RandomMask(RandomMask.Config(keep=0.05)),
        "subspace32": make("subspace", rate=32),
    }
    got = {k: ident / c.expected_nbytes(shape, Role.GRADIENT) for k, c in rates.items()}
    assert (
        got["fp16"] == 2
        and math.isclose(got["mask90"], 10, rel_tol=1e-3)
        and math.isclose(got["mask95"], 20, rel_tol=1e-3)
    )
    assert math.isclose(got["subspace32"], 32) and math.isclose(got["topk10"], 5, rel_tol=1e-3)
    assert 3.9 < got["int8"] < 4 and 7.5 < got["int4"] < 8


@pytest.mark.parametrize("name", CODECS.names())
def test_wire_view_is_a_float_tensor(name):
    codec = make(name)
    x = tensor((2, 3, 8), 0)
    ctx = ctx_for(x)
    view = codec.wire_view(codec.encode(x, ctx), ctx)
    assert view.is_floating_point() and view.numel() > 0
