"""AsyncMesh-style sparse parameter averaging for `dp.sync: sparse_avg` (arXiv 2601.22442).

Replicas step on their own gradients (no per-step all-reduce). Every H = `every` steps each stage
averages a rotating slice of its flattened parameters: round r covers [r c, (r+1) c) with
c = ceil(fraction * n), so all n parameters are covered every ceil(1 / fraction) rounds
(production: 5% every 20 steps). The average is the stage's DP aggregator over the replicas' slices
(each slice passes `transport.dp_contribution`, so DP-axis attacks and robust aggregators apply).

With `delay` d the average taken after step t is applied after step t + d, when the replicas have
moved on by their own d local steps. Correction (our reading of the paper's "EMA-based correction";
the paper's exact rule is not public):
    none    theta_i <- avg                                 (overwrites the last d local updates)
    delta   theta_i <- theta_i + (avg - theta_i^(t))        (keeps them: moves by the averaging delta)
    ema     theta_i <- theta_i + ema (avg - theta_i^(t))    (a partial, EMA-style pull)
With d = 0, none and delta are the plain average of the slice.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from sentinel.engine.hooks import StepHook

if TYPE_CHECKING:  # the step program calls these hooks; they do not import it at run time
    from sentinel.engine.step import StepProgram, StepState


def flat_slice(params, lo: int, hi: int) -> torch.Tensor:
    """Entries [lo, hi) of the concatenation of `params` (a copy)."""
    out, off = [], 0
    for p in params:
        n = p.numel()
        a, b = max(lo, off), min(hi, off + n)
        if a < b:
            out.append(p.detach().reshape(-1)[a - off : b - off].clone())
        off += n
    return torch.cat(out) if out else torch.zeros(0)


@torch.no_grad()
def write_slice(params, lo: int, hi: int, values: torch.Tensor) -> None:
    """Write `values` into entries [lo, hi) of the concatenation of `params`."""
    off = 0
    for p in params:
        n = p.numel()
        a, b = max(lo, off), min(hi, off + n)
        if a < b:
            p.view(-1)[a - off : b - off].copy_(values[a - lo : b - lo])
        off += n


class SparseAveraging(StepHook):
    """Every H steps, average a rotating fraction of each stage's parameters (see module docstring).

    Attributes:
        step_bytes: stage -> bytes one replica sent this step (0 off-round; read by the network clock).
        bytes_sent: total bytes all replicas sent.
    """

    def __init__(self, cfg):
        self.cfg = cfg
        self.round = 0
        self.pending: list[tuple[int, int, int, int, torch.Tensor, dict[str, torch.Tensor]]] = []
        self.step_bytes: dict[int, int] = {}
        self.bytes_sent = 0

    def after_update(self, engine: StepProgram, st: StepState) -> None:
        self.step_bytes = {}
        if (st.step + 1) % self.cfg.every == 0:
            for s in engine.placement.stages():
                self._average(engine, st.step, s)
            self.round += 1
        due = [p for p in self.pending if p[0] <= st.step]
        self.pending = [p for p in self.pending if p[0] > st.step]
        for _, s, lo, hi, avg, snaps in due:
            self._apply(engine, s, lo, hi, avg, snaps)

    def _average(self, engine: StepProgram, step: int, s: int) -> None:
        """Every live replica of stage s contributes its slice (through the adversary, over the DP collective)."""
        live = engine.workers.live_in_stage(s)
        if len(live) < 2:
            return
        n = sum(p.numel() for p in engine.templates[s].parameters())
        chunk = max(1, math.ceil(self.cfg.fraction * n - 1e-9))
        lo = (self.round % math.ceil(n / chunk)) * chunk
        hi = min(n, lo + chunk)
        mine = [i for i in live if i in engine.replicas]
        snaps = {engine.replicas[i].wid: flat_slice(engine.replicas[i].params, lo, hi) for i in mine}
        rows = []
        for i in mine:
            r = engine.replicas[i]
            sent = snaps[r.wid]
            if engine.adversary is not None:
                sent = engine.adversary.dp_contribution(step, s, r.wid, sent)
            rows.append((i, 1, sent))
        rows = engine.collective.gather(s, rows, hi - lo)  # every live replica's slice, in worker-table order
        avg = engine.aggregator(torch.stack([v for _, _, v in rows]), torch.ones(len(rows), dtype=torch.float64))
        self.pending.append((step + self.cfg.delay, s, lo, hi, avg, snaps))
        self.step_bytes[s] = 4 * (hi - lo)
        self.bytes_sent += 4 * (hi - lo) * len(rows)

    def _apply(
        self, engine: StepProgram, s: int, lo: int, hi: int, avg: torch.Tensor, snaps: dict[str, torch.Tensor]
    ) -> None:
        for i in engine.workers.live_in_stage(s):
            if i not in engine.replicas:
                continue
            r = engine.replicas[i]
            cur = flat_slice(r.params, lo, hi)
            then = snaps.get(r.wid, cur)  # a replica that joined since the snapshot takes the average
            if self.cfg.correction == "none" or r.wid not in snaps:
                new = avg
            elif self.cfg.correction == "delta":
                new = cur + (avg - then)
            else:
                new = cur + self.cfg.ema * (avg - then)
            write_slice(r.params, lo, hi, new)
