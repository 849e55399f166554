"""Transformers causal LMs split into pipeline stages at decoder-layer boundaries.

    build_model(cfg, vocab, seed)      the unsplit transformers model: random init from the seed, or loaded
    split_model(model, num_stages)     -> [HFStage]: embeddings (+ learned positions) in stage 0, final
                                          norm + LM head in the last stage, contiguous layers in between
    build_hf_stages(...)               both

Each stage rebuilds what the unsplit model's `forward` computes once at model level -- position ids
0..T-1, the rotary tables, the causal (or sliding-window) masks -- with the same transformers
functions, so the S stages chained compute the unsplit model's logits (tests/unit/model/test_hf.py
checks this against the model's own forward and loss, and S=4 against S=1 through the engine).

Weights: with `model.hf.config` every matrix is drawn from one generator seeded by the scenario seed,
in the unsplit model's parameter order (std = the config's `initializer_range`; GPT-2's output
projections scaled by 1/sqrt(2 n_layer) as transformers does), vectors are ones (norm scales) or zeros
(biases): the weights depend on the seed only, not on S, torch's global RNG or transformers' own init.
With `model.hf.path` the safetensors weights are loaded offline (`local_files_only`; no pickle).

Tied embeddings (GPT-2): with S = 1 the stage holds the model's one shared matrix; with S > 1 the
last stage holds a copy of the head, kept equal to stage 0's embedding by `TiedEmbeddings`.
Dropout is forced to 0 (runs are deterministic).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from sentinel.model.base import Stage, split_layers
from sentinel.model.hf_config import resolve_config
from sentinel.model.hf_families import FAMILIES, FULL, Family
from sentinel.scenario import ModelConfig

_MASKS = {FULL: create_causal_mask}


class HFStage(Stage):
    """A contiguous slice of a transformers causal LM behind the `Stage` interface."""

    def __init__(
        self,
        family: Family,
        config,
        layers: list[nn.Module],
        *,
        layer_offset: int,
        embed: nn.Embedding | None = None,
        positions: nn.Embedding | None = None,
        norm: nn.Module | None = None,
        head: nn.Linear | None = None,
        rotary: nn.Module | None = None,
        tied_copy: bool = False,
    ):
        super().__init__()
        self.family, self.config = family, config
        self.first, self.last = embed is not None, head is not None
        self.layer_offset, self.hidden_size = layer_offset, config.hidden_size
        self.embed, self.positions, self.rotary = embed, positions, rotary
        self.layers = nn.ModuleList(layers)
        self.norm, self.head = norm, head
        self.tied_copy = tied_copy  # the head is this stage's own copy of stage 0's embedding
        self.mask_kinds = [family.mask_kind(config, layer_offset + i) for i in range(len(layers))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)  # B, T -> B, T, C
        B, T, C = x.shape  # batch, sequence, embedding
        position_ids = torch.arange(T, device=x.device).unsqueeze(0)  # 1, T: as the unsplit model builds them
        if self.positions is not None:
            x = x + self.positions(position_ids)  # GPT-2: learned absolute positions, stage 0 only
        kwargs = {"position_ids": position_ids}
        if self.rotary is not None:
            kwargs["position_embeddings"] = self.rotary(x, position_ids)  # (cos, sin), B, T, head_dim
        masks = {kind: self._mask(kind, x, position_ids) for kind in set(self.mask_kinds)}
        for layer, kind in zip(self.layers, self.mask_kinds):
            out = layer(x, attention_mask=masks[kind], **kwargs)
            x = out[0] if isinstance(out, tuple) else out  # B, T, C
        if self.head is not None:
            x = self.head(self.norm(x))  # B, T, V
        return x

    def _mask(self, kind: str, x: torch.Tensor, position_ids: torch.Tensor):
        """The model-level mask for this kind of layer (None when the kernel's own causal flag suffices)."""
        make = _MASKS.get(kind, create_sliding_window_causal_mask)
        return make(self.config, x, None, None, position_ids=position_ids)

    def input_embedding(self) -> nn.Embedding | None:
        return self.embed

    def decoder_layers(self) -> nn.ModuleList:
        return self.layers

    def tied_head(self) -> nn.Parameter | None:
        return self.head.weight if self.tied_copy else None

    def global_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The unsplit transformers model's own parameter names (`model.layers.7.mlp.up_proj.weight`)."""
        fam, out = self.family, []
        prefix = {"embed": fam.embed, "positions": fam.positions, "norm": fam.norm, "head": "lm_head"}
        for name, p in self.named_parameters():  # a matrix shared by embed and head (S = 1) comes once
            part, rest = name.split(".", 1)
            if part == "layers":
                i, rest = rest.split(".", 1)
                out.append((f"{fam.layers}.{self.layer_offset + int(i)}.{rest}", p))
            elif not (part == "head" and self.tied_copy):
                out.append((f"{prefix[part]}.{rest}", p))
        return out

    @torch.no_grad()
    def project_residual_(self, P: torch.Tensor) -> None:
        for layer in self.layers:
            for path in self.family.residual_writers:
                _project_output_(layer.get_submodule(path), P)
        if self.positions is not None:
            self.positions.weight.copy_(self.positions.weight @ P)  # T_max, C


def _project_output_(module: nn.Module, P: torch.Tensor) -> None:
    """y <- P y for a linear map: nn.Linear keeps W as (out, in), GPT-2's Conv1D as (in, out)."""
    w = module.weight
    w.copy_(P @ w if isinstance(module, nn.Linear) else w @ P)
    if getattr(module, "bias", None) is not None:
        module.bias.copy_(P @ module.bias)


# -- building -----------------------------------------------------------------------------------------
def build_model(cfg: ModelConfig, vocab: int, seed: int, device: str | torch.device = "cpu") -> PreTrainedModel:
    """The unsplit model: loaded from `cfg.hf.path`, or built from `cfg.hf.config` with seeded weights.

    On the `meta` device nothing is allocated or initialised (shapes and parameter counts only).
    """
    config = resolve_config(cfg, vocab)
    if cfg.hf.path is not None and str(device) != "meta":
        model = AutoModelForCausalLM.from_pretrained(
            cfg.hf.path,
            config=config,
            local_files_only=True,
            use_safetensors=True,
            dtype=torch.float32,
            attn_implementation=cfg.hf.attn_implementation,
        )
        return model.train()
    with torch.device(device), torch.random.fork_rng(devices=[]):  # transformers' own init draws from the global RNG
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=cfg.hf.attn_implementation, dtype=torch.float32
        )
    if str(device) != "meta":
        init_weights_(model, seed)
    return model.train()


@torch.no_grad()
def init_weights_(model: PreTrainedModel, seed: int) -> None:
    """Seeded init in the unsplit model's parameter order: N(0, std) matrices, unit scales, zero biases."""
    gen = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    c_proj_std = std / math.sqrt(2 * model.config.num_hidden_layers)  # GPT-2's scaled residual projections
    for name, p in model.named_parameters():  # a tied matrix is listed once
        if p.dim() >= 2:
            s = c_proj_std if model.config.model_type == "gpt2" and name.endswith("c_proj.weight") else std
            p.copy_(torch.randn(p.shape, generator=gen) * s)
        else:
            p.fill_(0.0 if name.endswith("bias") else 1.0)
    embed = model.get_input_embeddings()
    if embed.padding_idx is not None:
        embed.weight[embed.padding_idx] = 0.0  # as transformers initialises a padding row


def split_model(model: PreTrainedModel, num_stages: int) -> list[HFStage]:
    """Hand out the unsplit model's modules to `num_stages` stages (shared modules, no copy but a tied head)."""
    fam = FAMILIES[model.config.model_type]
    get = model.get_submodule
    layers, embed, head = get(fam.layers), get(fam.embed), model.lm_head
    tied = head.weight is embed.weight
    stages = []
    for s, idx in enumerate(split_layers(len(layers), num_stages)):
        first, last = s == 0, s == num_stages - 1
        stage_head = head if not (last and tied and not first) else copy.deepcopy(head)  # its own Parameter
        stages.append(
            HFStage(
                fam,
                model.config,
                [layers[i] for i in idx],
                layer_offset=idx.start,
                embed=embed if first else None,
                positions=get(fam.positions) if first and fam.positions else None,
                norm=get(fam.norm) if last else None,
                head=stage_head if last else None,
                rotary=get(fam.rotary) if fam.rotary else None,
                tied_copy=last and tied and not first,
            )
        )
    return stages


def build_hf_stages(
    cfg: ModelConfig, vocab: int, num_stages: int, seed: int, device: str | torch.device = "cpu"
) -> list[HFStage]:
    return split_model(build_model(cfg, vocab, seed, device), num_stages)
