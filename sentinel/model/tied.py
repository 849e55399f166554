"""Tied embeddings across the pipeline: the first and the last stage hold two copies of one matrix.

GPT-2 uses its token embedding E (V, C) as the LM head too. Split over S > 1 stages, stage 0 needs E
to embed tokens and stage S-1 needs it to produce logits, so each holds a copy; the unsplit model's
gradient of E is the sum of both uses. Megatron-LM's rule keeps the copies equal: after the DP
all-reduce inside each stage, sum the two gradients and give the sum to both copies, which then take
the same optimizer step from the same state.

`TiedEmbeddings` does that as a step hook (the engine calls `before_update` after DP sync and
`after_update` after the optimizer step). When only one side has a gradient this step (every
microbatch was dropped before reaching the other), only that side steps; `after_update` then copies
its weight and optimizer state to the other side, which is what stepping both with the sum would
have given. On the distributed backend the same exchange runs between the processes hosting stage 0 and
stage S-1 (the step program's `collective.share`), after their stage all-reduce.
"""

from __future__ import annotations

import copy

import torch


class TiedEmbeddings:
    """Step hook: sums the tied embedding's two gradients (stage 0 and stage S-1) after DP sync.

    Written against the step program's `collective.share(key, mine)`, which merges what every process hosting
    the first or the last stage contributes: in sim everything is here; on the distributed backend the first
    and the last stage's processes exchange their gradient (and, in the one-sided case, the stepped weight and
    optimizer state) within a process group of their own.
    """

    def __init__(self) -> None:
        self._stepped = (False, False)

    def attach(self, engine) -> None:
        pass

    def before_pipeline(self, engine, st) -> None:
        pass

    def _involved(self, engine) -> bool:
        """Does this process host the first or the last stage (and so take part in the exchange)?"""
        return bool({0, engine.num_stages - 1} & set(engine.placement.stages()))

    def _copies(self, engine) -> tuple[list, list]:
        """(replica, tied parameter) for every live hosted replica of the first and of the last stage."""
        reps = [rep for i, rep in engine.replicas.items() if engine.workers.live[i]]
        first = [(r, r.module.input_embedding().weight) for r in reps if r.stage_idx == 0]
        last = [(r, r.module.tied_head()) for r in reps if r.stage_idx == engine.num_stages - 1]
        return first, last

    @torch.no_grad()
    def before_update(self, engine, st) -> None:
        if not self._involved(engine):
            return
        first, last = self._copies(engine)
        mine = {}
        for side, copies in (("first", first), ("last", last)):
            g = next((p.grad for _, p in copies if p.grad is not None), None)  # equal over replicas (all-reduce)
            if g is not None:
                mine[side] = g
        every = engine.collective.share("tied", mine)
        g_first, g_last = every.get("first"), every.get("last")
        self._stepped = (g_first is not None, g_last is not None)
        if g_first is None or g_last is None:
            return
        total = g_first + g_last  # V, C: d loss / d E of the unsplit model
        for _, p in first + last:
            if p.grad is not None:
                p.grad = total.clone()

    @torch.no_grad()
    def after_update(self, engine, st) -> None:
        """Only one side stepped: the other adopts its weight and optimizer state (what the sum would have given)."""
        if not self._involved(engine) or self._stepped[0] == self._stepped[1]:
            return
        first, last = self._copies(engine)
        src_side, src, dst = ("first", first, last) if self._stepped[0] else ("last", last, first)
        mine = {}
        if src:
            rep, p = src[0]
            mine[src_side] = {"weight": p.detach().clone(), "state": copy.deepcopy(rep.optimizer.state.get(p, {}))}
        got = engine.collective.share("tied_state", mine)[src_side]
        for rep, p in dst:
            p.copy_(got["weight"])
            if got["state"]:
                rep.optimizer.state[p] = copy.deepcopy(got["state"])
