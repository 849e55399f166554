"""The subspace codec (arXiv 2506.01260): activations travel as k = d / rate coefficients.

    send      c = U^T (h - E_f[tokens])        U: fixed random orthonormal (d, k), shared by every boundary
    receive   h' = U c + E_f[tokens]           E_f: the fixed token-embedding table (the initial embedding)
    backward  c_g = U^T g,  g' = U c_g          the exact chain rule of the forward: dL/dh = U U^T dL/dh'

Lossless mode (`project_weights: true`, as in the paper): after every optimizer step each block's
output projections (attention `out`, MLP `down`) are projected onto span(U) (W <- U U^T W) and the
embedding's trainable part too (E <- E_f + (E - E_f) U U^T). The residual stream is the embedding plus
the outputs of those projections, so h - E_f[tokens] lies in span(U) at every boundary and h' = h up to
float error. This needs engine access, so the codec is also a `StepHook`: `attach(engine)` captures E_f
and projects the initial weights, `before_pipeline` reads the step's tokens, `after_update` projects.
Token ids travel beside the coefficients (the smallest integer dtype that holds the vocabulary) and are
charged to the wire. Without an engine (unit tests) call `bind(embedding, vocab, tokens_fn)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import torch

from sentinel.config import spec
from sentinel.engine.hooks import StepHook
from sentinel.errors import RunError
from sentinel.registry import CODECS
from sentinel.transport.codecs import VALUE_DTYPES, Codec, CodecContext, derive_seed, rows_of
from sentinel.transport.message import Role, Wire

if TYPE_CHECKING:  # the step program calls these hooks; they do not import it at run time
    from sentinel.engine.step import StepProgram, StepState


def token_dtype(vocab: int) -> torch.dtype:
    """Smallest integer dtype that holds ids 0..vocab-1."""
    return torch.uint8 if vocab <= 256 else torch.int16 if vocab <= 32768 else torch.int32


def orthonormal_basis(d: int, k: int, seed: int) -> torch.Tensor:
    """A fixed random (d, k) matrix with orthonormal columns (QR of a seeded Gaussian)."""
    gen = torch.Generator().manual_seed(derive_seed(seed, 0x5B5B, d, k))
    q, r = torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()  # sign fix: a unique basis for the seed


@CODECS.register("subspace")
class Subspace(Codec, StepHook):
    """Fixed random orthonormal subspace: send U^T (h - E[tokens]), k = d / rate (lossless with project_weights)."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        rate: float = spec(32.0, ge=1, help="compression rate d / k (k = max(1, round(d / rate)))")
        embed_offset: bool = spec(True, help="activations: subtract the fixed token embeddings (token ids travel)")
        project_weights: bool = spec(False, help="keep output projections in span(U) after each step: lossless")
        value_dtype: Literal["float32", "float16", "bfloat16"] = spec("float32", help="dtype of the coefficients")

    def __init__(self, config: Config | None = None):
        super().__init__(config)
        self.seed = 0
        self._bases: dict[int, torch.Tensor] = {}
        self._embed: torch.Tensor | None = None  # E_f (vocab, d)
        self._vocab = 0
        self._tokens: Callable[[int, int], torch.Tensor] | None = None
        self._batch: tuple[int, torch.Tensor] | None = None

    # -- shared facts ------------------------------------------------------------------------------
    def k(self, d: int) -> int:
        return max(1, min(d, round(d / self.config.rate)))

    def basis(self, d: int, seed: int | None = None) -> torch.Tensor:
        seed = self.seed if seed is None else seed
        key = (d, seed)
        if key not in self._bases:
            self._bases[key] = orthonormal_basis(d, self.k(d), seed)
        return self._bases[key]

    def bind(self, embedding: torch.Tensor, vocab: int, tokens: Callable[[int, int], torch.Tensor], seed: int) -> None:
        """Give the codec the fixed embedding table E_f, the vocabulary and `tokens(step, mb) -> (B, T)`."""
        self._embed, self._vocab, self._tokens, self.seed = embedding.detach().float().clone(), vocab, tokens, seed

    def _offset(self, ctx: CodecContext) -> bool:
        return self.config.embed_offset and ctx.role == Role.ACTIVATION

    # -- codec -------------------------------------------------------------------------------------
    def encode(self, payload: torch.Tensor, ctx: CodecContext) -> Wire:
        U = self.basis(ctx.shape[-1], ctx.seed)
        h = payload.detach().float()
        tensors = {}
        if self._offset(ctx):
            if self._tokens is None or self._embed is None:
                raise RunError(
                    "subspace codec with embed_offset needs token ids: attach it to an engine or call bind()"
                )
            tok = self._tokens(ctx.step, ctx.mb_idx)
            h = h - self._embed[tok]
            tensors["tokens"] = tok.to(token_dtype(self._vocab))
        c = h @ U  # ..., k
        return Wire({"c": c.to(VALUE_DTYPES[self.config.value_dtype]), **tensors})

    def decode(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        U = self.basis(ctx.shape[-1], ctx.seed)
        h = wire.tensors["c"].float() @ U.T
        if self._offset(ctx) and "tokens" in wire.tensors:
            tok = wire.tensors["tokens"].long().clamp(0, self._embed.shape[0] - 1)  # a bad id never crashes
            h = h + self._embed[tok]
        return h.reshape(ctx.shape).to(ctx.dtype)

    def expected_nbytes(self, shape: tuple[int, ...], role: Role = Role.ACTIVATION) -> int:
        rows, d = rows_of(shape)
        n = rows * self.k(d) * VALUE_DTYPES[self.config.value_dtype].itemsize
        if self.config.embed_offset and role == Role.ACTIVATION:
            n += rows * token_dtype(self._vocab or 2).itemsize
        return n

    def wire_view(self, wire: Wire, ctx: CodecContext) -> torch.Tensor:
        return wire.tensors["c"].float()

    def projects_tokens(self, role: Role) -> bool:
        """A gradient arrives as U U^T g; an activation as U U^T (h - E_f) + E_f, which is h itself only while
        `project_weights` keeps h - E_f in span(U) (see the module)."""
        return role == Role.GRADIENT or not self.config.project_weights

    # -- engine hooks ------------------------------------------------------------------------------
    def attach(self, engine: StepProgram) -> None:
        self.bind(engine.templates[0].input_embedding().weight, engine.vocab, self._step_tokens, engine.sc.seed)
        if self.config.project_weights:
            self.project(engine)

    def _step_tokens(self, step: int, mb: int) -> torch.Tensor:
        if self._batch is None or self._batch[0] != step:
            raise RunError(f"subspace codec: no tokens for step {step} (before_pipeline was not called)")
        return self._batch[1][mb, :, :-1]

    def before_pipeline(self, engine: StepProgram, st: StepState) -> None:
        self._batch = (st.step, st.batch)

    def after_update(self, engine: StepProgram, st: StepState) -> None:
        if self.config.project_weights:
            self.project(engine)

    @torch.no_grad()
    def project(self, engine: StepProgram) -> None:
        """W <- U U^T W for every output projection; E <- E_f + (E - E_f) U U^T (every live replica)."""
        d = self._embed.shape[1]
        U = self.basis(d)
        P = U @ U.T  # d, d
        for i, rep in engine.replicas.items():
            if not engine.workers.live[i]:
                continue
            m = rep.module
            m.project_residual_(P)  # every layer's output projections (and learned positions)
            embed = m.input_embedding()
            tables = ([embed.weight] if embed is not None else []) + [h for h in [m.tied_head()] if h is not None]
            for w in tables:  # a tied head's copy moves with the embedding it copies
                w.copy_(self._embed + (w - self._embed) @ P)
