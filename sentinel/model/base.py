"""What every model source hands the engine: stages behind one interface, and the facts about the model.

A `Stage` is one contiguous slice of a decoder-only language model:

    stage 0          token ids (B, T)      -> hidden states (B, T, C)   [token embedding + layers]
    middle stages    hidden (B, T, C)      -> hidden (B, T, C)          [layers]
    last stage       hidden (B, T, C)      -> logits (B, T, V)          [layers + final norm + LM head]
    (S = 1: one stage does all of it)

The engine, the transport and the detectors only call `forward` and the few methods below, so a
builtin stage and a transformers stage are interchangeable. `ModelDims` holds the sizes other parts
need (boundary tensor width, vocabulary, layer count) without building a model.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelDims:
    """The sizes of a scenario's model, known before any weight exists.

    Attributes:
        source: "builtin" or "hf".
        family: "builtin", or the transformers `model_type` (llama, gpt2, ...).
        hidden: width C of every boundary tensor (B, T, C).
        layers: decoder layers (blocks) split over the stages.
        vocab: rows of the token embedding and of the LM head.
        seq_len: tokens per sequence T.
        ffn: hidden width of each layer's MLP.
        tied: the LM head shares the token embedding's weight (GPT-2); with S > 1 the first and last
            stage then hold two copies kept equal by `TiedEmbeddings`.
    """

    source: str
    family: str
    hidden: int
    layers: int
    vocab: int
    seq_len: int
    ffn: int
    tied: bool = False


class Stage(nn.Module):
    """One pipeline stage. Subclasses set the attributes below and implement `forward`.

    Attributes:
        first / last: holds the token embedding / the final norm and LM head.
        layer_offset: global index of its first decoder layer (for split-independent parameter names).
        hidden_size: width C of its hidden states.
    """

    first: bool
    last: bool
    layer_offset: int
    hidden_size: int

    def input_embedding(self) -> nn.Embedding | None:
        """The token embedding (stage 0 only), e.g. the subspace codec's fixed offset table."""
        raise NotImplementedError

    def decoder_layers(self) -> nn.ModuleList:
        """This stage's decoder layers, in order."""
        raise NotImplementedError

    def tied_head(self) -> nn.Parameter | None:
        """The last stage's own copy of a tied token embedding (S > 1 only), else None."""
        return None

    def global_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) with names that do not depend on the split (layer i is layer i for every S).

        A tied head's copy is left out: it stands for the embedding, which stage 0 names.
        """
        raise NotImplementedError

    @torch.no_grad()
    def project_residual_(self, P: torch.Tensor) -> None:
        """Project everything this stage writes into the residual stream onto span(P) (P: (C, C), symmetric).

        Every layer's output projections (attention and MLP) and learned position embeddings; the
        token embedding is left to the caller (the subspace codec keeps its own fixed table).
        """
        raise NotImplementedError


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def split_layers(num_layers: int, num_stages: int) -> list[range]:
    """Contiguous, as-even-as-possible split: stage sizes differ by at most one (earlier stages larger)."""
    base, extra = divmod(num_layers, num_stages)
    out, start = [], 0
    for s in range(num_stages):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def num_params(modules: list[nn.Module]) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def global_parameters(stages: list[Stage]) -> dict[str, torch.Tensor]:
    """Flat name -> tensor over a list of stages (one per stage, in order), names independent of the split."""
    return {name: p.detach() for m in stages for name, p in m.global_named_parameters()}
