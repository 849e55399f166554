"""Result folders as `sentinel report` reads them: every file checked before anything is rebuilt.

A saved folder is untrusted input (copied around, edited, truncated, tampered with). `load(DIR)` reads

    scenario.yaml   bounded safe YAML (sentinel/safeyaml.py); the sections scoring needs are validated
                    with the scenario schema, but no plug-in is looked up: re-scoring imports no attack
                    or detector code (the verdicts and the ground truth are in the log, and the detector's
                    threshold rule was saved in events.json at run time)
    events.npz      a zip of .npy columns only (`allow_pickle=False`), its unpacked size bounded, every
                    column of a known table with the right kind of dtype, one dimension, the columns of a
                    table of equal length, and every index in range (workers, attacks, message ids, roles)
    events.json     {"workers": [str], "attacks": [str], "meta": {...}}
    summary.json    (optional) a JSON object
    twin_*/, confirm/   the same checks on the twin and confirmation runs that are present

and raises one `ConfigError` naming the folder and every problem found, or returns a `SavedRun`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npformat

from sentinel import budget, safeyaml
from sentinel.config import _Problems, build
from sentinel.errors import ConfigError
from sentinel.eventlog import BAN_RULES, EventLog, Table
from sentinel.scenario import DataConfig, DetectorSpec, ModelConfig, PipelineConfig, ScoringConfig, TrainingConfig
from sentinel.scoring.summary import threshold_rule

MAX_JSON_BYTES = 64 << 20
TWINS = ("clean", "undefended")
ROLES = (0, 1, 2)  # activation, gradient, dp_gradient (sentinel/transport/message.py)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SavedDetector:
    name: str
    mode: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class SavedScenario:
    """The parts of a saved scenario that scoring reads (same attribute names as `Scenario`)."""

    name: str
    seed: int
    model: ModelConfig
    data: DataConfig
    pipeline: PipelineConfig
    training: TrainingConfig
    scoring: ScoringConfig
    detector: SavedDetector

    @property
    def num_workers(self) -> int:
        return self.pipeline.stages * self.pipeline.replicas


@dataclasses.dataclass(frozen=True)
class SavedRun:
    path: Path
    scenario: SavedScenario
    log: EventLog
    rule: dict | None  # the detector's threshold rule as saved at run time
    old_summary: dict
    twins: dict[str, EventLog]
    confirm: tuple[EventLog, float] | None  # the confirmation run's log and the threshold it ran at


def _schema() -> dict[str, dict[str, np.dtype]]:
    log = EventLog()
    return {t: {c: getattr(log, t).as_arrays()[c].dtype for c in getattr(log, t).names} for t in EventLog.TABLES}


def _read_json(path: Path, problems: _Problems, required: bool = True) -> Any:
    if not path.is_file():
        if required:
            problems.add(path.name, "missing")
        return None
    if path.stat().st_size > MAX_JSON_BYTES:
        problems.add(path.name, f"larger than {MAX_JSON_BYTES >> 20} MiB")
        return None
    try:
        return json.loads(path.read_bytes())  # NaN tolerated: folders written before strict JSON hold it
    except (ValueError, RecursionError) as exc:
        problems.add(path.name, f"not valid JSON ({str(exc)[:120]})")
        return None


def _read_npz(path: Path, problems: _Problems) -> dict[str, np.ndarray] | None:
    """The archive's columns, after checking each member's header against the bytes it really holds."""
    name = path.name
    if not path.is_file():
        problems.add(name, "missing")
        return None
    limit = max(budget.GIB, (budget.available_memory() or 4 * budget.GIB) // 2)
    try:
        with zipfile.ZipFile(path) as z:
            declared = 0
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    problems.add(name, f"holds {info.filename!r}, not a .npy column")
                    return None
                with z.open(info) as f:
                    version = npformat.read_magic(f)
                    if version not in ((1, 0), (2, 0)):
                        raise ValueError(f"unsupported .npy version {version}")
                    read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
                    shape, _, dtype = read(f)
                nbytes = math.prod(shape) * dtype.itemsize
                if dtype.hasobject or nbytes > info.file_size:
                    problems.add(
                        name,
                        f"column {info.filename[:-4]!r} declares {shape} {dtype} values it does not hold"
                        if not dtype.hasobject
                        else f"column {info.filename[:-4]!r} holds objects",
                    )
                    return None
                declared += nbytes
            if declared > limit:
                problems.add(name, f"unpacks to {declared:,} bytes, more than half the available memory")
                return None
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as exc:  # noqa: BLE001  untrusted bytes: numpy and zipfile raise many kinds
        problems.add(name, f"not a readable numpy archive ({exc.__class__.__name__}: {str(exc)[:120]})")
        return None


OPTIONAL_COLUMNS = {"bans": {"by"}}  # columns a folder written before they existed lacks (`EventLog.ban_rules`)


def _check_columns(arrays: dict[str, np.ndarray], problems: _Problems) -> dict[str, dict[str, np.ndarray]]:
    """Group `table.column` arrays by table, checking names, dtype kinds, shapes and equal lengths."""
    schema = _schema()
    tables: dict[str, dict[str, np.ndarray]] = {}
    for key, arr in arrays.items():
        table, _, col = key.partition(".")
        want = schema.get(table, {}).get(col)
        if want is None and not (table == "verdicts" and col.startswith("score_")):
            problems.add(f"events.npz[{key}]", f"unknown column; known tables: {', '.join(schema)}")
            continue
        kind = want.kind if want is not None else "f"
        ok_kinds = {"i": "iu", "u": "iu", "f": "f", "b": "b"}[kind]
        if arr.ndim != 1 or arr.dtype.kind not in ok_kinds:
            problems.add(
                f"events.npz[{key}]", f"expected a 1-d {want or 'float'} column, got {arr.dtype} of shape {arr.shape}"
            )
            continue
        tables.setdefault(table, {})[col] = arr
    for table, cols in tables.items():
        lengths = {c: len(a) for c, a in cols.items()}
        if len(set(lengths.values())) > 1:
            problems.add(f"events.npz[{table}]", f"columns of unequal length: {lengths}")
        missing = set(schema[table]) - set(cols) - OPTIONAL_COLUMNS.get(table, set())
        if missing:
            problems.add(f"events.npz[{table}]", f"missing columns {sorted(missing)}")
    for table in ("messages", "verdicts", "evals"):
        if table not in tables:
            problems.add(f"events.npz[{table}]", "missing table")
    return tables


def _in_range(problems: _Problems, where: str, values: np.ndarray, low: int, high: int) -> None:
    if len(values) and (values.min() < low or values.max() >= high):
        problems.add(where, f"values from {values.min()} to {values.max()}, outside {low}..{high - 1}")


def _check_indexes(t: dict[str, dict[str, np.ndarray]], workers: int, attacks: int, problems: _Problems) -> None:
    m, v, gt, bans, ev = (t.get(k, {}) for k in ("messages", "verdicts", "ground_truth", "bans", "evals"))
    for col in ("sender", "receiver"):
        if col in m:
            _in_range(problems, f"events.npz[messages.{col}]", m[col], 0, workers)
    if "role" in m and len(m["role"]) and not np.isin(m["role"], ROLES).all():
        problems.add("events.npz[messages.role]", f"roles must be one of {ROLES}")
    ids = m.get("id", np.zeros(0, np.int64))
    if len(np.unique(ids)) != len(ids):
        problems.add("events.npz[messages.id]", "message ids repeat")
    if "msg" in v and not np.isin(v["msg"], ids).all():
        problems.add("events.npz[verdicts.msg]", "verdicts for message ids that were never logged")
    if "worker" in gt:
        _in_range(problems, "events.npz[ground_truth.worker]", gt["worker"], 0, workers)
    if "attack" in gt:
        _in_range(problems, "events.npz[ground_truth.attack]", gt["attack"], 0, attacks)
    if "worker" in bans:
        _in_range(problems, "events.npz[bans.worker]", bans["worker"], 0, workers)
    if "replaced_by" in bans:
        _in_range(problems, "events.npz[bans.replaced_by]", bans["replaced_by"], -1, workers)
    if "by" in bans:
        _in_range(problems, "events.npz[bans.by]", bans["by"], -1, len(BAN_RULES))
    if "val_loss" in ev and not len(ev["val_loss"]):
        problems.add("events.npz[evals]", "no validation loss was logged (a run logs one before its first step)")


def _strings(value: Any, key: str, problems: _Problems) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        problems.add(f"events.json[{key}]", "expected a list of strings")
        return []
    if len(set(value)) != len(value):
        problems.add(f"events.json[{key}]", "names repeat")
    return value


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


META_TYPES = {  # events.json meta keys the scorer reads: a check per key
    "malicious": ("a list of worker ids", lambda v: isinstance(v, list) and all(isinstance(w, str) for w in v)),
    "optimum_loss": ("a number or null", lambda v: v is None or _is_number(v)),
    "backend": ("a string", lambda v: isinstance(v, str)),
    "transport": ("an object", lambda v: isinstance(v, dict)),
    "threshold_rule": (
        "null or {key, statistic, value, warmup_steps, exact_from}",
        lambda v: (
            v is None
            or (
                isinstance(v, dict)
                and isinstance(v.get("key"), str)
                and isinstance(v.get("statistic"), str)
                and _is_number(v.get("value"))
                and (v.get("warmup_steps") is None or isinstance(v["warmup_steps"], int))
                and (v.get("exact_from") is None or _is_number(v["exact_from"]))
            )
        ),
    ),
}


def _check_meta(meta: Any, problems: _Problems) -> None:
    if not isinstance(meta, dict):
        problems.add("events.json[meta]", "expected an object")
        return
    for key, (what, ok) in META_TYPES.items():
        if key in meta and not ok(meta[key]):
            problems.add(f"events.json[meta.{key}]", f"expected {what}, got {str(meta[key])[:60]!r}")


def load_log(folder: Path, problems: _Problems) -> EventLog | None:
    """The folder's EventLog, every column and index checked (see the module docstring)."""
    arrays = _read_npz(folder / "events.npz", problems)
    names = _read_json(folder / "events.json", problems)
    if arrays is None or names is None:
        return None
    if not isinstance(names, dict):
        problems.add("events.json", f"expected an object, got {type(names).__name__}")
        return None
    before = len(problems.items)
    workers = _strings(names.get("workers"), "workers", problems)
    attacks = _strings(names.get("attacks"), "attacks", problems)
    meta = names.get("meta", {})
    _check_meta(meta, problems)
    tables = _check_columns(arrays, problems)
    if len(problems.items) == before:  # indexes are only meaningful once names and columns are sound
        _check_indexes(tables, len(workers), len(attacks), problems)
    if len(problems.items) != before:
        return None
    log = EventLog()
    for table, cols in tables.items():
        setattr(log, table, Table.from_arrays(cols))
    for w in workers:
        log.worker_index(w)
    log.bans.add_column("by", np.int8, -1)  # a folder written before bans recorded their test (OPTIONAL_COLUMNS)
    log.attacks, log.meta = list(attacks), dict(meta) if isinstance(meta, dict) else {}
    log._next_msg = len(log.messages)
    return log


def _scenario(folder: Path, problems: _Problems) -> tuple[SavedScenario | None, dict]:
    try:
        raw = safeyaml.load_file(folder / "scenario.yaml", "saved scenario")
    except ConfigError as exc:
        for p in exc.problems:
            problems.add("scenario.yaml", p.split(": ", 1)[-1])
        return None, {}
    if not isinstance(raw, dict):
        problems.add("scenario.yaml", "expected a mapping of sections")
        return None, {}
    inner = _Problems()
    sections = {
        name: build(cls, raw.get(name), name, inner)
        for name, cls in (
            ("model", ModelConfig),
            ("data", DataConfig),
            ("pipeline", PipelineConfig),
            ("training", TrainingConfig),
            ("scoring", ScoringConfig),
        )
    }
    det = raw.get("detector") if isinstance(raw.get("detector"), dict) else {}
    name, seed = raw.get("name", "unnamed"), raw.get("seed", 0)
    if not isinstance(name, str):
        inner.add("name", "expected a string")
    if isinstance(seed, bool) or not isinstance(seed, int):
        inner.add("seed", "expected an integer")
    if det.get("mode", "closed_loop") not in ("closed_loop", "open_loop") or not isinstance(
        det.get("name", "none"), str
    ):
        inner.add("detector", "expected a detector name and mode closed_loop or open_loop")
    for p in inner.items:
        problems.add("scenario.yaml", p)
    if inner.items:
        return None, raw
    detector = SavedDetector(name=det.get("name", "none"), mode=det.get("mode", "closed_loop"))
    return SavedScenario(name=name, seed=seed, detector=detector, **sections), raw


def _rule(sc: SavedScenario, log: EventLog, raw: dict) -> dict | None:
    """The threshold rule saved at run time; folders from before it was saved ask the detector's plug-in."""
    if "threshold_rule" in log.meta:
        return log.meta["threshold_rule"]  # checked by _check_meta

    try:  # an old folder: the rule comes from the detector's code, as it did when the folder was written
        return threshold_rule(type("Saved", (), {"detector": build(DetectorSpec, raw.get("detector"))})())
    except ConfigError:
        return None


def _confirm(folder: Path, rule: dict | None, problems: _Problems) -> tuple[EventLog, float] | None:
    sub = folder / "confirm"
    if not rule or not (sub / "events.npz").is_file():
        return None
    inner = _Problems()
    log = load_log(sub, inner)
    try:
        raw = safeyaml.load_file(sub / "scenario.yaml", "saved scenario")
    except ConfigError as exc:
        inner.items += exc.problems
        raw = None
    detector = raw.get("detector") if isinstance(raw, dict) else None
    used = detector.get(rule["key"]) if isinstance(detector, dict) else None
    if raw is not None and (isinstance(used, bool) or not isinstance(used, (int, float))):
        inner.add("scenario.yaml", f"detector.{rule['key']}: expected the threshold the run used, got {used!r}")
    problems.items += [f"confirm/{p}" for p in inner.items]
    return (log, float(used)) if log is not None and not inner.items else None


def load(folder: Path) -> SavedRun:
    """The validated contents of a result folder, or one ConfigError naming the folder and each problem."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: " + ("not a folder" if folder.exists() else "no such folder"))
    problems = _Problems()
    sc, raw = _scenario(folder, problems)
    log = load_log(folder, problems)
    old = _read_json(folder / "summary.json", problems, required=False)
    if old is not None and not isinstance(old, dict):
        problems.add("summary.json", f"expected an object, got {type(old).__name__}")
    twins = {}
    for kind in TWINS:
        if (folder / f"twin_{kind}" / "events.npz").is_file():
            inner = _Problems()
            twins[kind] = load_log(folder / f"twin_{kind}", inner)
            problems.items += [f"twin_{kind}/{p}" for p in inner.items]
    rule = _rule(sc, log, raw) if sc is not None and log is not None else None
    confirm = _confirm(folder, rule, problems)
    if problems.items:
        raise ConfigError([f"{folder}: {p}" for p in problems.items])
    return SavedRun(folder, sc, log, rule, old if isinstance(old, dict) else {}, twins, confirm)
