"""Scenario schema: YAML -> validated, frozen dataclasses.

Section names are a contract (see README "Scenario files"). Every key is validated before any
worker starts; errors name the YAML path, the bad value, the rule and a fix. `--set a.b=v`
overrides go through the same validation. YAML is read by `sentinel/safeyaml.py` (safe tags only, bounded).
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, ClassVar, Literal

from sentinel import safeyaml
from sentinel.config import PluginSpec, build, set_path, spec, to_plain
from sentinel.errors import ConfigError
from sentinel.grid import check_sweep
from sentinel.registry import REGISTRIES

MAX_STEPS = 10_000_000  # steps, step counts and step offsets (a run of 10^7 steps is weeks of compute)
MAX_WORKERS = 16_384  # stages x replicas in one mesh (the library's largest is 512)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HFModelConfig:
    """A transformers causal LM (model.source: hf): built from a config at random init, or loaded from a folder."""

    config: dict[str, Any] | None = spec(
        None,
        help="a transformers config: `model_type` (llama, mistral, qwen2, "
        "gpt2) and that family's keys, e.g. hidden_size; random init from the seed",
    )
    path: str | None = spec(None, help="local folder with config.json and *.safetensors weights (loaded offline)")
    attn_implementation: Literal["sdpa", "eager"] = spec("sdpa", help="transformers attention kernel")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    source: Literal["builtin", "hf"] = spec(
        "builtin",
        help="the built-in Llama-style model, or a transformers model (model.hf; needs pip install -e '.[hf]')",
    )
    layers: int = spec(4, ge=1, le=1024, help="builtin: transformer blocks, split evenly over the stages")
    dim: int = spec(64, ge=4, le=65536, help="builtin: model width")
    heads: int = spec(4, ge=1, le=1024, help="builtin: attention heads; dim / heads must be even (rotary)")
    seq_len: int = spec(64, ge=2, le=65536, help="tokens per sequence")
    vocab: int | None = spec(
        None, ge=2, le=2**20, help="vocabulary size; default: the tokenizer's (or the hf config's)"
    )
    ffn_hidden: int | None = spec(None, ge=1, le=2**18, help="builtin: SwiGLU hidden width; default ~8/3 * dim")
    hf: HFModelConfig = dataclasses.field(default_factory=HFModelConfig)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    source: Literal["synthetic", "text"] = spec("synthetic", help="seeded Markov source, or local text")
    path: str | None = spec(
        None,
        help="source=text: a text file, a folder of text files, or a JSONL file "
        "(one document per line; default: Python's bundled docs)",
    )
    tokenizer: Literal["bytes", "bpe", "hf"] = spec(
        "bytes",
        help="source=text: bytes (vocab 256), a byte-level "
        "BPE trained on the training split, or a local transformers "
        "tokenizer (tokenizer_path)",
    )
    bpe_vocab: int = spec(4096, ge=257, le=2**20, help="tokenizer=bpe: vocabulary size to train")
    tokenizer_path: str | None = spec(None, help="tokenizer=hf: local tokenizer folder (default: model.hf.path)")
    text_field: str = spec("text", help="JSONL corpus: the key holding each document's text")
    batch_size: int = spec(8, ge=1, le=65536, help="sequences per microbatch")
    vocab: int = spec(64, ge=2, le=4096, help="synthetic source: number of token types")
    order: int = spec(1, ge=1, le=3, help="synthetic source: Markov order")
    concentration: float = spec(
        0.1, gt=0, le=1e6, help="synthetic source: Dirichlet concentration of each transition row"
    )
    val_fraction: float = spec(
        0.1, gt=0, lt=1, help="text source: held-out fraction (of the documents, or the tail of a single text)"
    )
    val_batches: int = spec(4, ge=1, le=4096, help="validation microbatches per evaluation")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    stages: int = spec(4, ge=1, le=1024, help="pipeline stages S")
    replicas: int = spec(1, ge=1, le=4096, help="data-parallel replicas R per stage")
    microbatches: int = spec(4, ge=1, le=4096, help="microbatches M per step")
    schedule: Literal["gpipe", "1f1b"] = spec("1f1b", help="pipeline schedule")
    routing: Literal["random", "fixed"] = spec("random", help="replica choice per microbatch and stage")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    steps: int = spec(200, ge=1, le=MAX_STEPS, help="optimizer steps")
    lr: float = spec(3e-3, gt=0, le=10, help="peak learning rate")
    optimizer: Literal["adamw", "sgd"] = spec("adamw")
    weight_decay: float = spec(0.0, ge=0, le=10)
    momentum: float = spec(0.9, ge=0, lt=1, help="sgd momentum")
    warmup_steps: int = spec(20, ge=0, le=MAX_STEPS, help="linear learning-rate warm-up")
    lr_schedule: Literal["cosine", "constant"] = spec("cosine")
    eval_every: int = spec(50, ge=1, le=MAX_STEPS, help="validation every n steps (and at the end)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AggregatorSpec(PluginSpec):
    PLUGIN_KIND: ClassVar[str] = "aggregators"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPCompressionConfig:
    """Compression of the gradients replicas exchange in `sync: allreduce` (sentinel/engine/dp_compress.py)."""

    method: Literal["none", "low_rank", "topk"] = spec("none", help="PowerSGD-style low rank, or top-k")
    rank: int = spec(4, ge=1, le=4096, help="low_rank: rank r of each weight matrix's approximation")
    fraction: float = spec(0.01, gt=0, le=1, help="topk: kept fraction of the gradient entries")
    error_feedback: bool = spec(True, help="add back what compression dropped last step (per replica)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SparseAvgConfig:
    """AsyncMesh sparse averaging for `sync: sparse_avg` (sentinel/engine/sparse_avg.py)."""

    every: int = spec(20, ge=1, le=MAX_STEPS, help="average every H local steps")
    fraction: float = spec(0.05, gt=0, le=1, help="fraction of each stage's parameters averaged per round (rotating)")
    delay: int = spec(0, ge=0, le=1000, help="steps between taking the average and applying it")
    correction: Literal["delta", "ema", "none"] = spec("delta", help="how a delayed average is applied")
    ema: float = spec(0.5, gt=0, le=1, help="correction ema: pull strength toward the average")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPConfig:
    sync: Literal["allreduce", "sparse_avg", "none"] = spec("allreduce", help="gradient sync inside a stage")
    aggregator: AggregatorSpec = dataclasses.field(default_factory=lambda: build(AggregatorSpec, "mean"))
    compression: DPCompressionConfig = dataclasses.field(default_factory=DPCompressionConfig)
    sparse_avg: SparseAvgConfig = dataclasses.field(default_factory=SparseAvgConfig)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodecSpec(PluginSpec):
    PLUGIN_KIND: ClassVar[str] = "codecs"


@dataclasses.dataclass(frozen=True, kw_only=True)
class NetworkConfig:
    """The simulated network and clock (sentinel/transport/network.py); never changes training numbers."""

    enabled: bool = spec(True, help="run the simulated clock (fills transport.sim_time_s)")
    preset: Literal["uniform", "heterogeneous", "geo_clustered"] = spec("uniform")
    bandwidth_mbps: float = spec(
        200.0, gt=0, le=1e9, help="link bandwidth (heterogeneous: median; geo: between regions)"
    )
    latency_ms: float = spec(50.0, ge=0, le=1e7, help="one-way link latency (geo: between regions)")
    jitter_ms: float = spec(0.0, ge=0, le=1e7, help="extra per-message latency |N(0, jitter)|")
    reorder: bool = spec(False, help="links are not FIFO: a jittered message may overtake an earlier one")
    spread: float = spec(0.5, ge=0, le=10, help="heterogeneous: log-normal sigma of per-worker bandwidth and latency")
    regions: int = spec(3, ge=1, le=1024, help="geo_clustered: number of regions")
    intra_bandwidth_mbps: float = spec(1000.0, gt=0, le=1e9, help="geo_clustered: bandwidth inside a region")
    intra_latency_ms: float = spec(5.0, ge=0, le=1e7, help="geo_clustered: latency inside a region")
    compute: Literal["modelled", "measured"] = spec("modelled", help="action time from FLOPs, or measured wall time")
    tflops: float = spec(100.0, gt=0, le=1e6, help="modelled: effective TFLOP/s of a worker")
    stragglers: float = spec(0.0, ge=0, le=1, help="fraction of workers that compute slowly (seeded choice)")
    straggler_slowdown: float = spec(3.0, ge=1, le=1e6, help="a straggler's compute time multiplier")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AsyncConfig:
    """Bounded-staleness pipeline (sentinel/engine/asynchrony.py). YAML key: `transport.async`."""

    max_staleness: int = spec(0, ge=0, le=64, help="0: synchronous; else a stage computes with weights this old")
    staleness: Literal["per_stage", "fixed", "random"] = spec(
        "per_stage", help="per_stage: min(max, S-1-s); fixed: max; random: uniform 0..max per step and worker"
    )
    lookahead: bool = spec(False, help="Nesterov-style look-ahead: extrapolate stale weights by the update EMA")
    momentum_head: float = spec(0.99, ge=0, lt=1, help="look-ahead EMA decay at stage 0")
    momentum_tail: float = spec(0.9, ge=0, lt=1, help="look-ahead EMA decay at the last stage")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransportConfig:
    codec: CodecSpec = dataclasses.field(default_factory=lambda: build(CodecSpec, "identity"))
    activation_codec: CodecSpec | None = spec(None, help="codec for activations (default: codec)")
    gradient_codec: CodecSpec | None = spec(None, help="codec for activation-gradients (default: codec)")
    network: NetworkConfig = dataclasses.field(default_factory=NetworkConfig)
    async_: AsyncConfig = dataclasses.field(default_factory=AsyncConfig, metadata={"alias": "async"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttackSpec(PluginSpec):
    """One attack: which plugin, where it acts and when (its own parameters go beside these keys)."""

    PLUGIN_KIND: ClassVar[str] = "attacks"
    role: Literal["activation", "gradient", "both", "dp_gradient"] = spec("activation")
    placement: Literal["pre_codec", "post_codec"] = spec("pre_codec")
    workers: tuple[str, ...] = spec((), help="malicious workers that run it (default: all malicious)")
    start: int = spec(0, ge=0, le=MAX_STEPS, help="first step it acts on")
    stop: int | None = spec(None, ge=0, le=MAX_STEPS, help="first step it no longer acts on")
    every: int = spec(1, ge=1, le=MAX_STEPS, help="acts on steps where (step - start) % every < duty")
    duty: int = spec(1, ge=1, le=MAX_STEPS)
    prob: float = spec(1.0, ge=0, le=1, help="probability it acts on a given message")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdversaryConfig:
    fraction: float = spec(0.0, ge=0, le=1, help="malicious fraction of each stage's replicas")
    placement: Literal["random", "explicit"] = spec("random")
    workers: tuple[str, ...] = spec((), help="explicit malicious worker ids, e.g. s1r0")
    protect: tuple[Literal["first", "last"], ...] = spec(("first", "last"), help="stages kept honest")
    allow_dishonest_majority: bool = spec(False)
    attacks: tuple[AttackSpec, ...] = spec(())


@dataclasses.dataclass(frozen=True, kw_only=True)
class DetectorSpec(PluginSpec):
    PLUGIN_KIND: ClassVar[str] = "detectors"
    mode: Literal["closed_loop", "open_loop"] = spec("closed_loop", help="open_loop records scores, never acts")
    view: Literal["decoded", "wire"] = spec(
        "decoded",
        help="what the detector reads: the decoded tensor, or the codec's compressed representation "
        "(quantization codes, top-k values, kept mask entries, subspace coefficients; see Codec.wire_view)",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResponseConfig:
    on_flag: Literal["drop", "drop_suspect", "substitute", "accept"] = spec(
        "drop",
        help="what a flagged message's receiver gets: nothing (drop), nothing unless it is its sender's first flag "
        "(drop_suspect), the detector's stand-in (substitute), or the message (accept); sentinel/response.py",
    )
    ban_after: int = spec(1, ge=1, le=MAX_STEPS, help="strikes before a worker is banned")
    replace_banned: bool = spec(False, help="a banned worker is replaced by a fresh honest replica")
    strike_window: int | None = spec(
        50, ge=1, le=MAX_STEPS, help="count strikes over the last n steps only (null: ever)"
    )
    rejoin_after: int | None = spec(
        None, ge=1, le=MAX_STEPS, help="a banned worker returns under a new id n steps later (Sybil)"
    )
    attribution: Literal["route", "sender"] = spec(
        "route", help="a flag strikes every worker on the microbatch's route up to it, or only its sender"
    )
    ban_pvalue: float = spec(
        1e-5,
        gt=0,
        le=1,
        help="peer test (sentinel/response.py): ban only if P(this much "
        "evidence | struck like the stage's other replicas) < ban_pvalue; 1 disables the test",
    )
    base_fpr: float = spec(0.01, gt=0, lt=1, help="honest flag rate assumed for a stage with no peers")
    sequential_alpha: float | None = spec(
        1e-8,
        gt=0,
        lt=1,
        help="sequential evidence test (sentinel/sequential.py): ban a worker once the CUSUM of its "
        "messages' log e-values in one direction (activations or gradients), from the detector's per-message "
        "p-values less the level its stage shares, exceeds ln(2 / sequential_alpha) while most of its stage "
        "peers' stay below half of it; "
        "null: off (detectors without p-values never use it)",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoringConfig:
    twins: tuple[Literal["clean", "undefended"], ...] = spec(
        (),
        help="twin runs (same seed and data order): clean = no attack, same defence; undefended = attack, no detector",
    )
    target_fpr: float = spec(0.01, gt=0, lt=1, help="message FPR the recommended threshold must keep (ROC)")
    confirm: bool = spec(
        True,
        help="after an open_loop run, confirm the recommended threshold with a "
        "closed-loop run (result folder confirm/)",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    grid: dict[str, Any] = dataclasses.field(default_factory=dict)
    seeds: int | tuple[int, ...] | None = spec(
        None,
        ge=0,
        le=2**63 - 1,
        help="every grid point runs for every seed: N means seed..seed+N-1, or a list "
        "of seeds (default: the scenario's seed only); `--seeds N` on the command line",
    )
    reference: dict[str, Any] = dataclasses.field(
        default_factory=dict,
        metadata={
            "help": "a grid point every row is compared with (paired by seed), e.g. {transport.codec: identity}: "
            "grid keys and one of each key's values (the other keys follow the row)"
        },
    )
    notes: dict[str, str] = dataclasses.field(
        default_factory=dict,
        metadata={
            "help": "text shown beside each grid row in a `notes` column (e.g. a paper's reported numbers), "
            "keyed by the row's label (its grid values, an attack list as name/role)"
        },
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str = spec("unnamed")
    description: str = spec("")
    seed: int = spec(0, ge=0, le=2**63 - 1, help="the one seed every random choice derives from")
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig)
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    dp: DPConfig = dataclasses.field(default_factory=DPConfig)
    transport: TransportConfig = dataclasses.field(default_factory=TransportConfig)
    adversary: AdversaryConfig = dataclasses.field(default_factory=AdversaryConfig)
    detector: DetectorSpec = dataclasses.field(default_factory=lambda: build(DetectorSpec, "none"))
    response: ResponseConfig = dataclasses.field(default_factory=ResponseConfig)
    scoring: ScoringConfig = dataclasses.field(default_factory=ScoringConfig)
    sweep: SweepConfig = dataclasses.field(default_factory=SweepConfig)

    @property
    def num_workers(self) -> int:
        return self.pipeline.stages * self.pipeline.replicas

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


# Cross-field rules run after every section is well-typed. Each returns (path, message) problems. Rules about a
# plug-in kind or a section another package owns live with that package and register here (attacks/validation.py,
# sentinel/detectors/__init__.py, sentinel/model/facts.py, sentinel/data/dataset.py); `validate` loads those
# packages first (every registry, and CHECKERS), so the rules are in place whatever the scenario names.
CROSS_CHECKS: list = []
CHECKERS = ("sentinel.model", "sentinel.data")  # packages that check their own sections


def cross_check(fn):
    CROSS_CHECKS.append(fn)
    return fn


@cross_check
def _mesh_and_name(sc: Scenario) -> list[tuple[str, str]]:
    """The mesh size bound, and a name that can label a result folder and a terminal line."""
    out = []
    if sc.num_workers > MAX_WORKERS:
        out.append(
            (
                "pipeline.replicas",
                f"{sc.pipeline.stages} stages x {sc.pipeline.replicas} replicas = "
                f"{sc.num_workers:,} workers; at most {MAX_WORKERS:,}: lower pipeline.replicas or pipeline.stages",
            )
        )
    if len(sc.name) > 200 or any(not ch.isprintable() for ch in sc.name):
        shown = repr(sc.name) if len(sc.name) <= 40 else f"{sc.name[:40]!r}... ({len(sc.name)} characters)"
        out.append(("name", f"{shown}: at most 200 printable characters (it names the result folder)"))
    return out


@cross_check
def _transport(sc: Scenario) -> list[tuple[str, str]]:
    """Codecs that change the forward must be mirrored backward; DP compression needs all-reduce."""
    t, out = sc.transport, []
    act, grad = t.activation_codec or t.codec, t.gradient_codec or t.codec
    for name in ("random_mask", "subspace"):
        if (act.name == name or grad.name == name) and act != grad:
            key = "transport.activation_codec" if t.activation_codec is not None else "transport.gradient_codec"
            out.append(
                (
                    key,
                    f"{name} must encode both roles with the same settings (the backward applies the "
                    f"forward's {'mask' if name == 'random_mask' else 'projection'}: chain rule); "
                    "set transport.codec and leave activation_codec / gradient_codec unset",
                )
            )
    if sc.dp.compression.method != "none" and sc.dp.sync != "allreduce":
        out.append(
            (
                "dp.compression.method",
                f"{sc.dp.compression.method!r} compresses the all-reduce; "
                f"dp.sync is {sc.dp.sync!r}: set dp.sync=allreduce or dp.compression.method=none",
            )
        )
    return out


@cross_check
def _sweep(sc: Scenario) -> list[tuple[str, str]]:
    """Seeds in range, a reference that names a grid point (sentinel/grid.py)."""
    return check_sweep(sc)


def validate(data: Any, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Mapping (parsed YAML) + `KEY=VALUE` overrides -> Scenario, or ConfigError with every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"<root>: a scenario must be a mapping of sections, got {type(data).__name__}")
    data = _apply_overrides(data, overrides)
    sc = build(Scenario, data)
    for registry in REGISTRIES.values():  # the plug-in packages register their cross-checks when they load
        registry.names()
    for module in CHECKERS:
        importlib.import_module(module)
    problems = [f"{path}: {msg}" for check in CROSS_CHECKS for path, msg in check(sc)]
    if problems:
        raise ConfigError(problems)
    return sc


def _apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    import copy

    data = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item[:80]}: expected KEY=VALUE, e.g. --set training.steps=50")
        key, raw = item.split("=", 1)
        if len(key) > 200 or key.count(".") + key.count("[") > 16:
            raise ConfigError(f"--set {key[:80]}: a key path of at most 200 characters and 16 levels, e.g. a.b[0].c")
        try:
            value = safeyaml.loads(raw, f"--set {key.strip()}") if raw.strip() else ""
        except safeyaml.YAMLProblem as exc:
            raise ConfigError(f"--set {key.strip()}: value {raw[:80]!r} is not valid YAML ({exc.detail})") from None
        set_path(data, key.strip(), value)
    return data


def load(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Read and validate a scenario file (bounded, duplicate-free YAML: sentinel/safeyaml.py)."""
    data = safeyaml.load_file(path)
    try:
        return validate(data, overrides)
    except ConfigError as exc:
        raise ConfigError([f"{path}: {p}" for p in exc.problems]) from None
