"""Scenario schema: YAML -> validated, frozen dataclasses.

Section names are a contract (see README "Scenario files"). Every key is validated before any
worker starts; errors name the YAML path, the bad value, the rule and a fix. `--set a.b=v`
overrides go through the same validation. YAML is read by `sentinel/safeyaml.py` (safe tags only, bounded).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path
from typing import Any, ClassVar, Literal

from sentinel import safeyaml
from sentinel.config import PluginSpec, build, set_path, spec, to_plain
from sentinel.errors import ConfigError

MAX_STEPS = 10_000_000  # steps, step counts and step offsets (a run of 10^7 steps is weeks of compute)
MAX_WORKERS = 16_384  # stages x replicas in one mesh (the library's largest is 512)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    layers: int = spec(4, ge=1, le=1024, help="transformer blocks, split evenly over the stages")
    dim: int = spec(64, ge=4, le=65536, help="model width")
    heads: int = spec(4, ge=1, le=1024, help="attention heads; dim / heads must be even (rotary)")
    seq_len: int = spec(64, ge=2, le=65536, help="tokens per sequence")
    vocab: int | None = spec(None, ge=2, le=2**20, help="vocabulary size; default: the data source's")
    ffn_hidden: int | None = spec(None, ge=1, le=2**18, help="SwiGLU hidden width; default ~8/3 * dim")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    source: Literal["synthetic", "text"] = spec("synthetic", help="seeded Markov source, or local text")
    path: str | None = spec(None, help="text file for source=text (default: Python's bundled docs)")
    batch_size: int = spec(8, ge=1, le=65536, help="sequences per microbatch")
    vocab: int = spec(64, ge=2, le=4096, help="synthetic source: number of token types")
    order: int = spec(1, ge=1, le=3, help="synthetic source: Markov order")
    concentration: float = spec(0.1, gt=0, le=1e6, help="synthetic source: Dirichlet concentration of each transition row")
    val_fraction: float = spec(0.1, gt=0, lt=1, help="text source: held-out tail fraction")
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
    bandwidth_mbps: float = spec(200.0, gt=0, le=1e9, help="link bandwidth (heterogeneous: median; geo: between regions)")
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
        "per_stage", help="per_stage: min(max, S-1-s); fixed: max; random: uniform 0..max per step and worker")
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
        "decoded", help="what the detector reads: the decoded tensor, or the codec's compressed representation "
        "(quantization codes, top-k values, kept mask entries, subspace coefficients; see Codec.wire_view)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResponseConfig:
    on_flag: Literal["drop", "substitute", "accept"] = spec("drop")
    ban_after: int = spec(1, ge=1, le=MAX_STEPS, help="strikes before a worker is banned")
    replace_banned: bool = spec(False, help="a banned worker is replaced by a fresh honest replica")
    strike_window: int | None = spec(50, ge=1, le=MAX_STEPS, help="count strikes over the last n steps only (null: ever)")
    rejoin_after: int | None = spec(None, ge=1, le=MAX_STEPS, help="a banned worker returns under a new id n steps later (Sybil)")
    attribution: Literal["route", "sender"] = spec(
        "route", help="a flag strikes every worker on the microbatch's route up to it, or only its sender")
    ban_pvalue: float = spec(1e-5, gt=0, le=1, help="peer test (sentinel/response.py): ban only if P(this much "
                             "evidence | struck like the stage's other replicas) < ban_pvalue; 1 disables the test")
    base_fpr: float = spec(0.01, gt=0, lt=1, help="honest flag rate assumed for a stage with no peers")
    sequential_alpha: float | None = spec(
        1e-8, gt=0, lt=1, help="sequential evidence test (sentinel/response.py): ban a worker once the CUSUM of its "
        "messages' log e-values, from the detector's per-message p-values, exceeds ln(1 / sequential_alpha) while "
        "most of its stage peers' stay below half of it; null: off (detectors without p-values never use it)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoringConfig:
    twins: tuple[Literal["clean", "undefended"], ...] = spec(
        (), help="twin runs (same seed and data order): clean = no attack, same defence; undefended = attack, "
        "no detector")
    target_fpr: float = spec(0.01, gt=0, lt=1, help="message FPR the recommended threshold must keep (ROC)")
    confirm: bool = spec(True, help="after an open_loop run, confirm the recommended threshold with a "
                         "closed-loop run (result folder confirm/)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    grid: dict[str, Any] = dataclasses.field(default_factory=dict)
    reference: dict[str, str] = dataclasses.field(default_factory=dict, metadata={
        "help": "text shown beside each grid row in a `reference` column (e.g. a paper's reported numbers), "
        "keyed by the row's label (its grid values, an attack list as name/role)"})


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


# Cross-field rules run after every section is well-typed. Each returns (path, message) problems.
CROSS_CHECKS: list = []


def cross_check(fn):
    CROSS_CHECKS.append(fn)
    return fn


@cross_check
def _wire_view(sc: Scenario) -> list[tuple[str, str]]:
    """A recomputing detector compares with the decoded recomputation: it needs the decoded view."""
    if sc.detector.view != "wire":
        return []
    from sentinel.detectors.recompute import Duplication
    from sentinel.registry import DETECTORS

    if issubclass(DETECTORS.get(sc.detector.name), Duplication):
        return [("detector.view", f"{sc.detector.name} compares a message with its trusted recomputation, which "
                 "is a decoded tensor: use view: decoded")]
    return []


@cross_check
def _model_shape(sc: Scenario) -> list[tuple[str, str]]:
    m, out = sc.model, []
    if sc.pipeline.stages > m.layers:
        out.append(("pipeline.stages", f"{sc.pipeline.stages} stages but model.layers is {m.layers}; "
                    f"every stage needs a block: set pipeline.stages <= {m.layers} or raise model.layers"))
    if m.dim % m.heads:
        out.append(("model.heads", f"model.dim ({m.dim}) must be divisible by model.heads ({m.heads})"))
    elif (m.dim // m.heads) % 2:
        out.append(("model.heads", f"head size dim/heads = {m.dim // m.heads} must be even for rotary positions"))
    data_vocab = 256 if sc.data.source == "text" else sc.data.vocab
    if m.vocab is not None and m.vocab < data_vocab:
        out.append(("model.vocab", f"{m.vocab} is smaller than the data source's vocabulary ({data_vocab}); "
                    "raise it or leave it unset"))
    if sc.data.source == "synthetic" and sc.data.vocab ** sc.data.order > 2_000_000:
        out.append(("data.order", f"vocab**order = {sc.data.vocab ** sc.data.order} Markov contexts is too many "
                    "(max 2,000,000); lower data.vocab or data.order"))
    return out


@cross_check
def _data_path(sc: Scenario) -> list[tuple[str, str]]:
    """The text file exists, is readable and holds a sequence for each split (the rule TextSource applies)."""
    d = sc.data
    if d.path is not None and d.source != "text":
        return [("data.path", "only used with data.source: text")]
    if d.path is None:
        return []
    try:
        st = os.stat(d.path)
        if stat.S_ISDIR(st.st_mode) or not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            return [("data.path", f"{d.path!r} is {kind}; give a text file")]
        with open(d.path, "rb") as f:
            f.read(1)
    except FileNotFoundError:
        return [("data.path", f"file not found: {d.path!r}")]
    except (OSError, ValueError) as exc:  # permission, a name too long, a NUL byte
        return [("data.path", f"cannot read {d.path!r}: {getattr(exc, 'strerror', None) or exc}")]
    train = int(st.st_size * (1 - d.val_fraction))
    need = sc.model.seq_len + 2
    if min(train, st.st_size - train) < need:
        return [("data.path", f"{d.path!r} has {st.st_size:,} bytes: its training ({train:,}) and validation "
                 f"({st.st_size - train:,}) splits (data.val_fraction {d.val_fraction}) each need model.seq_len + 2 "
                 f"= {need} bytes; use a longer file, a smaller model.seq_len or another data.val_fraction")]
    return []


@cross_check
def _mesh_and_name(sc: Scenario) -> list[tuple[str, str]]:
    """The mesh size bound, and a name that can label a result folder and a terminal line."""
    out = []
    if sc.num_workers > MAX_WORKERS:
        out.append(("pipeline.replicas", f"{sc.pipeline.stages} stages x {sc.pipeline.replicas} replicas = "
                    f"{sc.num_workers:,} workers; at most {MAX_WORKERS:,}: lower pipeline.replicas or pipeline.stages"))
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
            out.append((key, f"{name} must encode both roles with the same settings (the backward applies the "
                        f"forward's {'mask' if name == 'random_mask' else 'projection'}: chain rule); "
                        "set transport.codec and leave activation_codec / gradient_codec unset"))
    if sc.dp.compression.method != "none" and sc.dp.sync != "allreduce":
        out.append(("dp.compression.method", f"{sc.dp.compression.method!r} compresses the all-reduce; "
                    f"dp.sync is {sc.dp.sync!r}: set dp.sync=allreduce or dp.compression.method=none"))
    return out


@cross_check
def _adversary(sc: Scenario) -> list[tuple[str, str]]:
    """Who is malicious, honest majority, attack roles / workers / schedules (rules in attacks/validation.py)."""
    from attacks.validation import check_adversary

    return check_adversary(sc)


@cross_check
def _dp_aggregator_domain(sc: Scenario) -> list[tuple[str, str]]:
    """A robust DP aggregator must tolerate the malicious replicas of a stage when they attack the DP sync."""
    if not any(a.role == "dp_gradient" for a in sc.adversary.attacks):
        return []
    from attacks.assignment import assign_malicious
    from sentinel.registry import AGGREGATORS

    try:
        malicious = assign_malicious(sc.adversary, sc.pipeline.stages, sc.pipeline.replicas, sc.seed)
    except Exception:  # malformed adversary sections are reported by _adversary
        return []
    per_stage: dict[str, int] = {}
    for wid in malicious:
        stage = wid.split("r")[0]
        per_stage[stage] = per_stage.get(stage, 0) + 1
    f = max(per_stage.values(), default=0)
    agg = sc.dp.aggregator
    msg = AGGREGATORS.get(agg.name).check_domain(agg.config, sc.pipeline.replicas, f) if f else None
    if msg:
        return [("dp.aggregator.name", f"{msg}; the adversary holds {f} of {sc.pipeline.replicas} replicas of a "
                 "stage and attacks the DP sync: choose another aggregator, raise pipeline.replicas or lower "
                 "adversary.fraction")]
    return []


@cross_check
def _detector_params(sc: Scenario) -> list[tuple[str, str]]:
    """Rules a detector states about its own parameters (`check_config(config) -> [(key, message)]`)."""
    from sentinel.registry import DETECTORS

    check = getattr(DETECTORS.get(sc.detector.name), "check_config", None)
    return [(f"detector.{key}", msg) for key, msg in check(sc.detector.config)] if check else []


def validate(data: Any, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Mapping (parsed YAML) + `KEY=VALUE` overrides -> Scenario, or ConfigError with every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"<root>: a scenario must be a mapping of sections, got {type(data).__name__}")
    data = _apply_overrides(data, overrides)
    sc = build(Scenario, data)
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


def warnings_for(sc: Scenario) -> list[str]:
    """Non-fatal notes about a valid scenario (printed by `sentinel validate` and `sentinel run`).

    Lemma 1 (proofs/honest_majority.md): SENTINEL assumes an honest majority in every stage. This
    testbed's `placement: random` places the same number of malicious replicas in each open stage, so
    the assumption holds by construction; a real deployment that assigns workers to stages uniformly at
    random does not get that guarantee. We report the probability it would be broken for the same
    number of malicious workers, and warn when it is above 1%.
    """
    out = []
    adv, p = sc.adversary, sc.pipeline
    if adv.attacks and adv.placement == "random" and adv.fraction > 0:
        from attacks.assignment import malicious_per_stage, open_stages
        from proofs.honest_majority import prob_stage_compromised

        stages = open_stages(p.stages, adv.protect)
        f = malicious_per_stage(adv.fraction, p.replicas) * len(stages)
        protect_ends = len(stages) == p.stages - 2 and p.stages > 2
        try:
            prob = prob_stage_compromised(p.stages, p.replicas, f, exact=p.stages * p.replicas <= 4096, protect_ends=protect_ends)
        except ValueError:
            return out
        if prob > 0.01:
            out.append(
                f"adversary.fraction: {f} malicious workers assigned uniformly at random over the mesh (not per stage, "
                f"as here) would break some stage's honest majority with probability {prob:.3f} (Lemma 1, "
                "proofs/honest_majority.md); results here assume the per-stage placement"
            )
    return out
