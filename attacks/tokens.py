"""Token-level attacks: they keep the multiset of token vectors, or change only a few tokens.

A boundary tensor x has shape (B, T, C): B sequences of T tokens of C features. Every statistic pooled
over tokens (per-feature means and moments, the token cloud's 1-D marginals) is a function of the
multiset {x[b, t]}: these attacks leave it intact, or move it by a few tokens among B x T, while the
receiver computes on the wrong content (a token at the wrong position of its sequence, a sequence in
another's place, another microbatch's sequences). Threat model: a malicious sender rearranges the tensor
it is about to send (its output forward, its input-gradient backward); it needs no knowledge of the
detector. Only tensors of rank >= 3 are rearranged (a DP-sync vector has no tokens); others are declined.

    token_permute        x'[b, t] = x[b, pi_b(t)]: tokens reordered along each sequence
    batch_permute        x'[b] = x[sigma(b)]: whole sequences exchanged within the microbatch
    sequence_swap        two sequences exchange their tails from a random position on
    microbatch_exchange  a share of the sequences replaced by those of the sender's previous message (another
                         microbatch): fresh, honest-looking content for the wrong inputs
    few_tokens           an inner attack (any registered one) applied to a handful of tokens only
    token_copy           a handful of tokens overwritten by copies of nearby tokens of their sequence (one token
                         vector duplicated, one lost: the multiset moves by a few tokens, every vector is honest)
    token_fade           a handful of tokens pulled toward the message's mean token (fade 1: replaced by it), the
                         pooled mean kept exactly (one token at fade 1 keeps its direction from the mean)
    token_turn           a handful of tokens turned by a chosen angle toward a random direction, each one's norm
                         kept exactly (90 degrees: orthogonal to what was computed; 180: negated)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from attacks.base import Attack, AttackContext
from attacks.gating import WrapConfig
from sentinel.config import build, spec
from sentinel.errors import ConfigError
from sentinel.registry import ATTACKS

TOKEN_ROLES = frozenset({"activation", "gradient"})


def _tokens_view(x: torch.Tensor) -> torch.Tensor | None:
    """x as (B, T, C) (leading dimensions folded into B), or None when it has no token axes."""
    if x.dim() < 3:
        return None
    return x.reshape(-1, x.shape[-2], x.shape[-1])


def _subset_permutation(n: int, share: float, gen: torch.Generator) -> torch.Tensor:
    """A permutation of range(n) that moves a random subset of round(share * n) positions among themselves
    (a cyclic shift of the chosen positions, so every chosen one moves when there are two or more)."""
    idx = torch.arange(n)
    k = round(share * n)
    if k < 2:
        return idx
    chosen = torch.randperm(n, generator=gen)[:k]
    idx[chosen] = chosen.roll(1)
    return idx


@ATTACKS.register("token_permute")
class TokenPermute(Attack):
    """Reorder the tokens of every sequence along the sequence axis (each token vector intact).

    Formula: x'[b, t] = x[b, pi_b(t)], pi_b a seeded permutation per sequence that moves a random subset of
    round(share * T) positions (a cyclic shift among them). The multiset of token vectors, hence every
    token-pooled statistic, is unchanged. No-op at share = 0.
    """

    ROLES = TOKEN_ROLES
    NOOP = {"share": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        share: float = spec(1.0, ge=0, le=1, help="share of each sequence's positions that are moved")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        v = _tokens_view(x)
        if v is None:
            return x
        gen = ctx.generator()
        out = torch.stack([v[b, _subset_permutation(v.shape[1], self.config.share, gen)] for b in range(v.shape[0])])
        return out.reshape(x.shape)


@ATTACKS.register("batch_permute")
class BatchPermute(Attack):
    """Exchange whole sequences within the microbatch: every token is at its position, in another's sequence.

    Formula: x'[b] = x[sigma(b)], sigma a seeded permutation moving round(share * B) sequences (a cyclic shift
    among them). Per-position and pooled statistics are unchanged. Declines a microbatch of one sequence.
    """

    ROLES = TOKEN_ROLES
    NOOP = {"share": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        share: float = spec(1.0, ge=0, le=1, help="share of the sequences moved")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        v = _tokens_view(x)
        if v is None or v.shape[0] < 2:
            return x
        return v[_subset_permutation(v.shape[0], self.config.share, ctx.generator())].reshape(x.shape)


@ATTACKS.register("sequence_swap")
class SequenceSwap(Attack):
    """Two sequences of the microbatch exchange their tails (from a random position t0 to the end).

    Formula: for a seeded pair (a, b) and t0 ~ U{min_start * T, ..., T - 1}: x'[a, t0:] = x[b, t0:],
    x'[b, t0:] = x[a, t0:]. Each exchanged token keeps its position: per-position and pooled statistics are
    unchanged; the receiver continues two sequences with each other's contexts. Declines B < 2.
    """

    ROLES = TOKEN_ROLES

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        min_start: float = spec(0.0, ge=0, lt=1, help="earliest swap position, as a share of the sequence length")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        v = _tokens_view(x)
        if v is None or v.shape[0] < 2:
            return x
        gen = ctx.generator()
        a, b = torch.randperm(v.shape[0], generator=gen)[:2].tolist()
        T = v.shape[1]
        lo = min(int(self.config.min_start * T), T - 1)
        t0 = int(torch.randint(lo, T, (1,), generator=gen))
        out = v.clone()
        out[a, t0:], out[b, t0:] = v[b, t0:], v[a, t0:]
        return out.reshape(x.shape)


@ATTACKS.register("microbatch_exchange")
class MicrobatchExchange(Attack):
    """Replace a share of the sequences by the sender's previous message's (another microbatch's) sequences.

    Formula: x'[b] = x_prev[b] for a seeded subset of round(share * B) sequences (at least one), x_prev the
    sender's most recent honest message on this boundary and direction (another microbatch of this step or
    the last one it was routed). Fresh, honest content with honest statistics, for the wrong inputs.
    Declines until the sender has sent one message. Memory: one tensor per (boundary, role) and sender.
    """

    ROLES = TOKEN_ROLES

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        share: float = spec(1.0, gt=0, le=1, help="share of the sequences replaced")

    def __init__(self, config=None):
        super().__init__(config)
        self._last: dict[tuple, torch.Tensor] = {}

    def wants(self, ctx: AttackContext) -> bool:
        return ctx.stream in self._last

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        prev, v = self._last.get(ctx.stream), _tokens_view(x)
        if prev is None or prev.shape != x.shape or v is None:
            return x
        B = v.shape[0]
        rows = torch.randperm(B, generator=ctx.generator())[: max(1, round(self.config.share * B))]
        out = v.clone()
        out[rows] = prev.reshape(v.shape)[rows]
        return out.reshape(x.shape)

    def observe(self, x: torch.Tensor, ctx: AttackContext) -> None:
        self._last[ctx.stream] = x.detach().clone()


@ATTACKS.register("token_copy")
class TokenCopy(Attack):
    """Overwrite a few tokens with copies of other tokens of the same sequence, up to `reach` positions earlier.

    Formula: for `tokens` seeded positions (b, t) with t >= 1 (over all B x T, drawn with replacement) and a seeded
    distance d ~ U{1, ..., min(reach, t)}: x'[b, t] = x[b, t - d] (applied in turn, each copy from the message as
    computed). Every vector sent is one the sender computed, at the wrong position: pooled statistics move by a
    few tokens' worth, per-token magnitudes not at all. No-op at tokens = 0; declines sequences of one token.
    """

    ROLES = TOKEN_ROLES
    NOOP = {"tokens": 0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        tokens: int = spec(1, ge=0, help="how many token positions of the message are overwritten")
        reach: int = spec(1, ge=1, help="a copy comes from at most this many positions earlier (1: the left neighbour)")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        v = _tokens_view(x)
        if v is None or v.shape[1] < 2 or self.config.tokens == 0:
            return x
        B, T, _ = v.shape
        gen = ctx.generator()
        rows = torch.randint(B, (self.config.tokens,), generator=gen).tolist()
        cols = torch.randint(1, T, (self.config.tokens,), generator=gen).tolist()
        dist = torch.randint(0, 1 << 30, (self.config.tokens,), generator=gen).tolist()
        out = v.clone()
        for b, t, u in zip(rows, cols, dist):
            out[b, t] = v[b, t - 1 - u % min(self.config.reach, t)]
        return out.reshape(x.shape)


@ATTACKS.register("token_fade")
class TokenFade(Attack):
    """Pull a few tokens toward the message's mean token, and keep the pooled mean exactly.

    Formula: m = the mean token over all B x T; for `tokens` seeded positions i (distinct): x'[i] = m + (1 - fade)
    (x[i] - m); then every token is shifted by the same vector, fade / (B T) x the sum of the faded tokens' x[j] - m,
    so that the mean token of x' is m. After centring, a faded token is (1 - fade) (x[i] - m) plus that shift: one
    token at fade 1 is its old centred self scaled by 1 / (B T), so its direction from the mean, and every cosine with
    it, is kept; where tokens share a large mean (a residual stream) its norm as sent barely moves either, while the
    receiver loses what the token carried (it learns the average token). No-op at tokens = 0 or fade = 0.
    """

    ROLES = TOKEN_ROLES
    NOOP = {"tokens": 0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        tokens: int = spec(1, ge=0, help="how many token positions of the message are faded")
        fade: float = spec(1.0, ge=0, le=1, help="how far toward the mean token (1: replaced by it)")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        if x.dim() < 3 or self.config.tokens == 0 or self.config.fade == 0:
            return x
        flat = x.reshape(-1, x.shape[-1])
        m = flat.mean(0)
        rows = torch.randperm(flat.shape[0], generator=ctx.generator())[: self.config.tokens]
        out = flat.clone()
        out[rows] = m + (1.0 - self.config.fade) * (flat[rows] - m)
        out += m - out.mean(0)
        return out.reshape(x.shape)


@ATTACKS.register("token_turn")
class TokenTurn(Attack):
    """Turn a few tokens by a chosen angle toward random directions, each token's norm kept exactly.

    Formula: for `tokens` seeded positions i (distinct, over all B x T): x'[i] = cos(a) x[i] + sin(a) |x[i]| u_i, u_i
    a seeded random unit vector orthogonal to x[i], a = `angle` degrees; every other token as computed. The token's
    norm is kept and its cosine with what was computed is cos(a) exactly: at 90 degrees it carries none of it on (what
    `retain` sees), at 180 it is negated. A token of zero norm stays zero. No-op at tokens = 0 or angle = 0.
    """

    ROLES = TOKEN_ROLES
    NOOP = {"tokens": 0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        tokens: int = spec(1, ge=0, help="how many token positions of the message are turned")
        angle: float = spec(90.0, ge=0, le=180, help="degrees each token turns (90: orthogonal, 180: negated)")

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        if x.dim() < 3 or self.config.tokens == 0 or self.config.angle == 0:
            return x
        flat = x.reshape(-1, x.shape[-1])
        gen = ctx.generator()
        rows = torch.randperm(flat.shape[0], generator=gen)[: self.config.tokens]
        t = flat[rows].double()
        norm = t.norm(dim=1, keepdim=True)
        unit = t / norm.clamp_min(1e-300)
        u = torch.randn(t.shape, generator=gen, dtype=torch.float64)
        u -= (u * unit).sum(1, keepdim=True) * unit  # orthogonal to the token
        u /= u.norm(dim=1, keepdim=True).clamp_min(1e-300)
        a = math.radians(self.config.angle)
        out = flat.clone()
        out[rows] = (math.cos(a) * t + math.sin(a) * norm * u).to(flat.dtype)
        return out.reshape(x.shape)


@ATTACKS.register("few_tokens")
class FewTokens(Attack):
    """Apply an inner attack to a few tokens only: the rest of the message is sent as computed.

    Formula: x'[i] = A(x)[i] for a seeded set of `tokens` token positions i (over all B x T), x'[i] = x[i]
    elsewhere, A the inner attack (any registered attack, with its parameters) applied to the whole message.
    A statistic pooled over hundreds of tokens moves by tokens / (B T) of the inner attack's effect.
    """

    ROLES = TOKEN_ROLES
    NOOP = {"attack": "scaling", "params": {"alpha": 1.0}}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config(WrapConfig):
        tokens: int = spec(2, ge=1, help="how many tokens of the message the inner attack changes")

    def __init__(self, config=None):
        super().__init__(config)
        inner_cls = ATTACKS.get(self.config.attack)
        self.inner: Attack = inner_cls(build(inner_cls.Config, self.config.params))

    def wants(self, ctx: AttackContext) -> bool:
        return self.inner.wants(ctx)

    def observe(self, x: torch.Tensor, ctx: AttackContext) -> None:
        self.inner.observe(x, ctx)

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        if x.dim() < 2:
            return x
        full = self.inner.apply(x, ctx)
        if full is x:
            return x
        flat, new = x.reshape(-1, x.shape[-1]), full.reshape(-1, x.shape[-1])
        rows = torch.randperm(flat.shape[0], generator=ctx.generator(salt=0xF3))[: self.config.tokens]
        out = flat.clone()
        out[rows] = new[rows]
        return out.reshape(x.shape)

    @classmethod
    def check(cls, index: int, spec_: Any, scenario: Any, malicious: list[str]) -> list[tuple[str, str]]:
        path, cfg = f"adversary.attacks[{index}]", spec_.config
        if cfg.attack in ("target_corruption", "few_tokens"):
            return [
                (
                    f"{path}.attack",
                    f"{cfg.attack!r} cannot be applied to a few tokens; choose a value attack "
                    "(e.g. scaling, random, constant)",
                )
            ]
        try:
            inner_cls = ATTACKS.get(cfg.attack)
        except ConfigError as exc:
            return [(f"{path}.attack", str(exc))]
        try:
            build(inner_cls.Config, cfg.params, f"{path}.params")
        except ConfigError as exc:
            return [tuple(p.split(": ", 1)) if ": " in p else (f"{path}.params", p) for p in exc.problems]
        return inner_cls.check(index, spec_, scenario, malicious)
