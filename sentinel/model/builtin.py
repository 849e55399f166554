"""A small Llama-style decoder (RMSNorm, rotary positions, SwiGLU, causal attention) split into stages.

`build_builtin_stages(cfg, vocab, num_stages, seed)` initialises the *whole* model from one seeded
generator in a fixed order, then hands out contiguous blocks to stages, so the parameters do not depend
on S: a 4-stage pipeline starts from exactly the same weights as a single stage. Stage 0 holds the
token embedding, the last stage holds the final norm and the head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sentinel.model.base import Stage, split_layers
from sentinel.scenario import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)  # T, hd/2
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]  # B, H, T, hd/2 each
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape  # batch, sequence, embedding
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(q, cos[:T], sin[:T]), apply_rotary(k, cos[:T], sin[:T])
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # B, H, T, hd
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp_norm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class BuiltinStage(Stage):
    """One pipeline stage: [embedding] -> blocks -> [norm, head].

    forward(x): token ids (B, T) on stage 0, hidden states (B, T, dim) elsewhere;
    returns hidden states (B, T, dim), or logits (B, T, vocab) on the last stage.
    """

    def __init__(
        self, cfg: ModelConfig, vocab: int, blocks: list[Block], first: bool, last: bool, layer_offset: int = 0
    ):
        super().__init__()
        self.first, self.last = first, last
        self.layer_offset, self.hidden_size = layer_offset, cfg.dim
        self.embed = nn.Embedding(vocab, cfg.dim) if first else None
        self.blocks = nn.ModuleList(blocks)
        self.norm = RMSNorm(cfg.dim) if last else None
        self.head = nn.Linear(cfg.dim, vocab, bias=False) if last else None
        cos, sin = rotary_tables(cfg.seq_len, cfg.dim // cfg.heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x

    def input_embedding(self) -> nn.Embedding | None:
        return self.embed

    def decoder_layers(self) -> nn.ModuleList:
        return self.blocks

    def global_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        out = []
        for name, p in self.named_parameters():
            if name.startswith("blocks."):
                i, rest = name.split(".", 2)[1:]
                name = f"blocks.{self.layer_offset + int(i)}.{rest}"
            out.append((name, p))
        return out

    @torch.no_grad()
    def project_residual_(self, P: torch.Tensor) -> None:
        for block in self.blocks:
            for lin in (block.attn.out, block.mlp.down):  # the two writers into the residual stream
                lin.weight.copy_(P @ lin.weight)


def ffn_hidden(cfg: ModelConfig) -> int:
    if cfg.ffn_hidden is not None:
        return cfg.ffn_hidden
    return max(8, (int(8 * cfg.dim / 3) + 7) // 8 * 8)  # Llama's 2/3 * 4d, rounded to 8


@torch.no_grad()
def _init_(module: nn.Module, gen: torch.Generator, std: float = 0.02) -> None:
    for name, p in module.named_parameters():
        if name.endswith("weight") and p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def build_builtin_stages(cfg: ModelConfig, vocab: int, num_stages: int, seed: int) -> list[BuiltinStage]:
    """Build the model split into `num_stages` stages; weights independent of `num_stages`."""
    gen = torch.Generator().manual_seed(seed)
    hidden = ffn_hidden(cfg)
    embed = nn.Embedding(vocab, cfg.dim)
    _init_(embed, gen)
    blocks = []
    for _ in range(cfg.layers):
        b = Block(cfg.dim, cfg.heads, hidden)
        _init_(b, gen)
        blocks.append(b)
    head = nn.Linear(cfg.dim, vocab, bias=False)
    _init_(head, gen)
    stages = []
    for s, idx in enumerate(split_layers(cfg.layers, num_stages)):
        st = BuiltinStage(
            cfg, vocab, [blocks[i] for i in idx], first=s == 0, last=s == num_stages - 1, layer_offset=idx.start
        )
        if st.embed is not None:
            st.embed.load_state_dict(embed.state_dict())
        if st.head is not None:
            st.head.load_state_dict(head.state_dict())
        stages.append(st)
    return stages


def meta_builtin_stages(cfg: ModelConfig, vocab: int, num_stages: int) -> list[BuiltinStage]:
    """The same stages on the `meta` device: shapes and parameter counts, no memory, no initialisation."""
    with torch.device("meta"):
        hidden = ffn_hidden(cfg)
        return [
            BuiltinStage(
                cfg,
                vocab,
                [Block(cfg.dim, cfg.heads, hidden) for _ in idx],
                first=s == 0,
                last=s == num_stages - 1,
                layer_offset=idx.start,
            )
            for s, idx in enumerate(split_layers(cfg.layers, num_stages))
        ]
