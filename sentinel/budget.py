"""What a scenario will cost before it runs: peak memory and work, from its keys alone (nothing allocated).

`sentinel validate` prints the estimate; `validate`, `run` and `sweep` refuse a scenario whose memory
estimate exceeds the budget (default: this machine's available memory; `--max-memory GIB` sets it,
`--force` skips the check) with exit 2, naming the term that dominates and the key that drives it.

Memory (bytes; float32 training state, the sim backend's single process unless noted):

    runtime        a Python process with torch and numpy imported (dist: one per process)
    model          R x P x (4 param + 4 grad + 8 AdamW moments | 4 SGD momentum) bytes, plus the DP sync's
                   flat gradients and aggregation stack (2 x R x P_stage x 4) and, with `transport.async`,
                   `max_staleness` stale copies of the parameters; dist ranks each also build the whole model
    activations    what autograd keeps per microbatch in flight: B x T x (12 d + 4 h) floats per block, the
                   embedding output, and 3 x B x T x V for the logits; in flight = M (gpipe) or
                   min(M, S - s) at stage s (1f1b); plus the boundary messages of a step (2 (S-1) M payloads)
    data           synthetic: two V^order x V float64 tables (transitions, cdf) and the sampler's
                   (M B) x V comparison per token; text: 9 bytes per byte of the file (raw + int64 tokens)
    event log      ~1 KiB per boundary message (columns, verdict scores, the scorer's indexes), for the run
                   and every twin / confirmation run held at the end
    plug-ins       what a plug-in declares through an optional `memory_bytes(config, scenario)` classmethod
                   (a detector's windows, an attack's replay buffers); none of the built-ins declares it yet

Work: boundary messages (2 (S-1) M per step, per run) and training FLOPs (6 x parameters x tokens, forward
and backward, per run). Assumes attention kernels with memory linear in T (torch's fused CPU and GPU
kernels): a T x T score matrix per head is not counted.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from sentinel.errors import ConfigError

GIB = 1 << 30
RUNTIME_BYTES = GIB // 2  # measured: ~0.45 GiB resident for `sentinel run` on the quickstart
LOG_BYTES_PER_MESSAGE = 1024


@dataclasses.dataclass(frozen=True)
class ModelDims:
    """The model's sizes, as the estimate needs them."""

    params_per_stage: tuple[int, ...]
    layers_per_stage: tuple[int, ...]
    hidden: int  # boundary tensor width d
    ffn: int
    vocab: int

    @property
    def params(self) -> int:
        return sum(self.params_per_stage)


def model_dims(sc) -> ModelDims:
    """Parameter counts per stage from the built-in model's formula (sentinel/model.py), no weights built.

    The one place the estimate depends on the model family (HF models will answer here instead).
    """
    from sentinel.model import split_layers

    m = sc.model
    vocab = m.vocab or (256 if sc.data.source == "text" else sc.data.vocab)
    d = m.dim
    ffn = m.ffn_hidden if m.ffn_hidden is not None else max(8, (int(8 * d / 3) + 7) // 8 * 8)
    block = 4 * d * d + 3 * d * ffn + 2 * d  # qkv + out, gate + up + down, two RMSNorms
    S = sc.pipeline.stages
    layers = tuple(len(r) for r in split_layers(m.layers, S))
    params = [n * block for n in layers]
    params[0] += vocab * d  # token embedding
    params[-1] += vocab * d + d  # head and final norm
    return ModelDims(tuple(params), layers, d, ffn, vocab)


@dataclasses.dataclass(frozen=True)
class Term:
    """One part of the memory estimate and the scenario keys it grows with."""

    name: str
    bytes: int
    keys: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Estimate:
    terms: tuple[Term, ...]
    dims: ModelDims
    message_bytes: int  # one activation (or activation-gradient) message, B x T x d float32
    messages: int  # boundary messages over every run (main, twins, confirmation)
    flops: float
    runs: int

    @property
    def total(self) -> int:
        return sum(t.bytes for t in self.terms)

    def lines(self) -> list[str]:
        """The estimate as `sentinel validate` prints it."""
        d = self.dims
        per_stage = ", ".join(_count(p) for p in d.params_per_stage[:8]) + (
            ", ..." if len(d.params_per_stage) > 8 else ""
        )
        return [
            f"model: {_count(d.params)} parameters ({per_stage} per stage), width {d.hidden}, vocab {d.vocab}",
            f"memory: ~{_size(self.total)} peak (" + ", ".join(f"{t.name} {_size(t.bytes)}" for t in self.terms) + ")",
            f"work: {_count(self.messages)} boundary messages of {_size(self.message_bytes)}, "
            f"~{self.flops:.2g} training FLOPs over {self.runs} run{'s' if self.runs > 1 else ''}",
        ]


def _count(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(int(n))


def _size(n: float) -> str:
    for unit, div in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{int(n)} B"


def runs_of(sc) -> int:
    """Training runs `sentinel run` makes for this scenario: the run, its twins, the confirmation."""
    confirm = sc.detector.mode == "open_loop" and sc.scoring.confirm
    return 1 + len(sc.scoring.twins) + int(confirm)


def _activation_bytes(sc, dims: ModelDims) -> int:
    """Autograd state of the microbatches in flight at the schedule's peak, plus a step's messages."""
    p, B, T = sc.pipeline, sc.data.batch_size, sc.model.seq_len
    tokens = B * T
    S, M = p.stages, p.microbatches
    total = 0
    for s, n_layers in enumerate(dims.layers_per_stage):
        per_mb = tokens * n_layers * (12 * dims.hidden + 4 * dims.ffn)
        per_mb += tokens * dims.hidden if s == 0 else 0  # embedding output
        per_mb += 3 * tokens * dims.vocab + 2 * tokens * dims.hidden if s == S - 1 else 0  # logits, loss, norm
        in_flight = M if p.schedule == "gpipe" else min(M, S - s)
        total += 4 * per_mb * in_flight
    return total + 2 * (S - 1) * M * 4 * tokens * dims.hidden


def _model_bytes(sc, dims: ModelDims, backend: str, nproc: int) -> int:
    opt = 8 if sc.training.optimizer == "adamw" else 4
    R = sc.pipeline.replicas
    out = R * dims.params * (8 + opt) + 2 * R * max(dims.params_per_stage) * 4
    out += sc.transport.async_.max_staleness * R * dims.params * 4
    if backend == "dist":
        out += nproc * dims.params * 4  # each rank builds the whole model, then keeps its stages
    return out


def _data_bytes(sc) -> int:
    d, p = sc.data, sc.pipeline
    seqs = p.microbatches * d.batch_size
    batch = (seqs + d.val_batches * d.batch_size) * (sc.model.seq_len + 1) * 8
    if d.source == "synthetic":
        contexts = d.vocab**d.order
        return batch + 4 * contexts * d.vocab * 8 + seqs * d.vocab * 9
    if d.path is None:
        return batch + 9 * 500_000  # the built-in corpus, ~460 kB
    try:
        return batch + 9 * Path(d.path).stat().st_size
    except (OSError, ValueError):
        return batch  # an unreadable path is reported by the scenario's own check


def plugin_bytes(sc) -> int:
    """State the scenario's plug-ins declare: an optional `memory_bytes(config, scenario) -> int` classmethod
    on a detector, aggregator, codec or attack (e.g. a detector's windows per stream) joins the estimate."""
    from sentinel.registry import REGISTRIES

    t = sc.transport
    specs = [
        ("detectors", sc.detector),
        ("aggregators", sc.dp.aggregator),
        ("codecs", t.codec),
        ("codecs", t.activation_codec),
        ("codecs", t.gradient_codec),
    ]
    specs += [("attacks", a) for a in sc.adversary.attacks]
    total = 0
    for kind, spec in specs:
        fn = getattr(REGISTRIES[kind].get(spec.name), "memory_bytes", None) if spec is not None else None
        total += int(fn(spec.config, sc)) if callable(fn) else 0
    return total


def messages_per_step(sc) -> int:
    p = sc.pipeline
    dp = p.stages * p.replicas if any(a.role == "dp_gradient" for a in sc.adversary.attacks) else 0
    return 2 * (p.stages - 1) * p.microbatches + dp


def estimate(sc, backend: str = "sim", nproc: int | None = None) -> Estimate:
    """Peak memory and work of `sentinel run` on this scenario (see the module docstring)."""
    dims = model_dims(sc)
    runs = runs_of(sc)
    nproc = nproc or (sc.num_workers + 1 if backend == "dist" else 1)
    messages = messages_per_step(sc) * sc.training.steps * runs
    size_keys = ("model.dim", "model.layers", "model.vocab", "model.ffn_hidden")
    act_keys = (
        "data.batch_size",
        "model.seq_len",
        "pipeline.microbatches",
        "model.dim",
        "model.layers",
        "model.vocab",
        "data.vocab",
    )
    data_keys = (
        ("data.path",)
        if sc.data.source == "text"
        else ("data.vocab", "data.order", "data.batch_size", "pipeline.microbatches")
    )
    plugins = plugin_bytes(sc)
    terms = (
        Term("runtime", nproc * RUNTIME_BYTES, ("pipeline.replicas", "pipeline.stages") if backend == "dist" else ()),
        Term(
            "model",
            _model_bytes(sc, dims, backend, nproc),
            ("pipeline.replicas", *size_keys, "transport.async.max_staleness"),
        ),
        Term("activations", _activation_bytes(sc, dims), act_keys),
        Term("data", _data_bytes(sc), data_keys),
        *([Term("plug-ins", plugins, ("detector.name",))] if plugins else []),
        Term(
            "event log",
            LOG_BYTES_PER_MESSAGE * messages,
            ("training.steps", "pipeline.microbatches", "pipeline.stages", "scoring.twins"),
        ),
    )
    tokens = sc.pipeline.microbatches * sc.data.batch_size * sc.model.seq_len * sc.training.steps * runs
    return Estimate(
        terms, dims, 4 * sc.data.batch_size * sc.model.seq_len * dims.hidden, messages, 6.0 * dims.params * tokens, runs
    )


def available_memory() -> int | None:
    """This machine's available memory in bytes (`MemAvailable` of /proc/meminfo), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _lookup(data: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def driving_key(sc, term: Term) -> str:
    """The key of `term` furthest above its default (by ratio): the one to lower first."""
    from sentinel.scenario import Scenario

    now, default = sc.to_dict(), Scenario().to_dict()
    best, best_ratio = term.keys[0], 0.0
    for key in term.keys:
        value, base = _lookup(now, key), _lookup(default, key)
        if isinstance(value, list):
            value, base = len(value) + 1, len(base or []) + 1
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            continue
        ratio = value / base if isinstance(base, (int, float)) and base and base > 0 else float(value)
        if ratio > best_ratio:
            best, best_ratio = key, ratio
    return best


def check(sc, est: Estimate, budget: int | None, source: str) -> None:
    """ConfigError when the memory estimate exceeds `budget` bytes (None: no budget known, no check)."""
    if budget is None or est.total <= budget:
        return
    top = max(est.terms, key=lambda t: t.bytes)
    if not top.keys:
        raise ConfigError(
            f"<root>: the process alone needs ~{_size(top.bytes)} ({top.name}), over the budget of "
            f"{_size(budget)} ({source}); raise --max-memory or pass --force to run anyway"
        )
    key = driving_key(sc, top)
    value = _lookup(sc.to_dict(), key)
    raise ConfigError(
        f"{key}: {value!r} drives the largest term of the memory estimate ({top.name} {_size(top.bytes)} of "
        f"~{_size(est.total)} peak), over the budget of {_size(budget)} ({source}); lower {key} "
        "(`sentinel validate` prints the estimate), raise --max-memory, or pass --force to run anyway"
    )


def budget_from(max_memory_gib: float | None) -> tuple[int | None, str]:
    """(budget bytes, where it came from) for `--max-memory GIB` (None: this machine's available memory)."""
    if max_memory_gib is not None:
        if not math.isfinite(max_memory_gib) or max_memory_gib <= 0:
            raise ConfigError(f"--max-memory: {max_memory_gib!r} must be a positive number of GiB, e.g. 8")
        return int(max_memory_gib * GIB), "--max-memory"
    return available_memory(), "this machine's available memory"
