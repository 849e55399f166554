"""A catalogue of bad inputs for every command, and what each must produce.

Each `Case` builds its inputs in a fresh workspace, runs one CLI command, and states the exit code
(2: bad input, 0: accepted, 1: a genuine failure) and a fragment of the located message. Every case is
also held to the harness's rules: no traceback, no hang, bounded memory, and for a refused `run` or
`sweep`, nothing written (no `runs/`, no `--out` folder).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

# A scenario that trains in about a second, so a case that wrongly passes pre-flight still ends quickly.
BASE = {
    "name": "tiny",
    "seed": 0,
    "model": {"layers": 2, "dim": 16, "heads": 2, "seq_len": 8},
    "data": {"source": "synthetic", "vocab": 16, "batch_size": 2, "val_batches": 1},
    "pipeline": {"stages": 2, "replicas": 1, "microbatches": 2},
    "training": {"steps": 2, "warmup_steps": 0, "eval_every": 1},
}
# The result folder `report` cases tamper with: a defended run with an attack and a clean twin.
REPORT_BASE = copy.deepcopy(BASE) | {
    "pipeline": {"stages": 3, "replicas": 3, "microbatches": 2},
    "model": {"layers": 3, "dim": 16, "heads": 2, "seq_len": 8},
    "training": {"steps": 4, "warmup_steps": 0, "eval_every": 2},
    "adversary": {"fraction": 0.34, "attacks": [{"name": "bias", "role": "gradient", "start": 1}]},
    "detector": {"name": "sentinel", "warmup_steps": 1, "min_history": 4},
    "scoring": {"twins": ["clean"]},
}


class Workspace:
    """A case's folder: scenario files, data files and copies of the report base folder."""

    def __init__(self, root: Path, report_base: Path | None = None):
        self.root, self.report_base = Path(root), report_base

    def scenario(self, data=None, filename: str = "s.yaml", **changes) -> str:
        """Write BASE (or `data`: a dict or YAML text) with dotted `changes`; return its path."""
        if data is None:
            data = copy.deepcopy(BASE)
        if isinstance(data, dict):
            for dotted, value in changes.items():
                node = data
                *parents, leaf = dotted.split("__")
                for p in parents:
                    node = node.setdefault(p, {})
                node[leaf] = value
            data = yaml.safe_dump(data, sort_keys=False)
        p = self.root / filename
        p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
        return str(p)

    def folder(self, name: str) -> str:
        p = self.root / name
        p.mkdir(exist_ok=True)
        return str(p)

    def file(self, name: str, content: bytes | str = b"") -> str:
        p = self.root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(p)

    def result(self, name: str = "res") -> Path:
        """A copy of the report base folder to tamper with."""
        dst = self.root / name
        shutil.copytree(self.report_base, dst)
        return dst


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[Workspace], list[str]]
    rc: int = 2
    expect: str = ""  # a fragment of stderr (rc != 0) or stdout (rc == 0)
    check: Callable[[Workspace, object], None] | None = None  # extra assertions on the workspace


def _deep_flow(n: int) -> str:
    return "name: x\nsweep: {grid: {a: " + "[" * n + "]" * n + "}}\n"


def _npz(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _tamper_npz(ws: Workspace, d: Path, edit: Callable[[dict], None]) -> None:
    with np.load(d / "events.npz") as z:
        arrays = {k: z[k] for k in z.files}
    edit(arrays)
    (d / "events.npz").write_bytes(_npz(arrays))


def _huge_header(ws: Workspace, d: Path) -> None:
    """A column whose .npy header declares 10^12 values (the archive holds eight bytes of them)."""
    with zipfile.ZipFile(d / "events.npz") as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<i8", "fortran_order": False, "shape": (10**12,)})
    members["messages.id.npy"] = buf.getvalue() + b"\0" * 8
    with zipfile.ZipFile(d / "events.npz", "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _one_ban(by: int) -> dict:
    """A bans table of one row whose test (`bans.by`) is `by`."""
    one = {"step": np.int32, "worker": np.int32, "replaced_by": np.int32, "by": np.int8}
    return {
        f"bans.{k}": np.array([by if k == "by" else -1 if k == "replaced_by" else 0], dtype=t) for k, t in one.items()
    }


def _report(edit: Callable[[Workspace, Path], None], *more: str) -> Callable[[Workspace], list[str]]:
    def argv(ws: Workspace) -> list[str]:
        d = ws.result()
        edit(ws, d)
        return ["report", str(d), *more]

    return argv


def _nothing_written(ws: Workspace, outcome) -> None:
    assert not (ws.root / "runs").exists(), "a refused command created runs/"
    assert not (ws.root / "out").exists(), "a refused command created its --out folder"


def _summary_is_strict(ws: Workspace, outcome) -> None:
    from sentinel import strictjson

    for f in ws.root.rglob("summary.json"):
        strictjson.loads(f.read_text())  # raises on NaN / Infinity tokens


def _stays_under_runs(ws: Workspace, outcome) -> None:
    made = [p for p in ws.root.rglob("summary.json")]
    assert made and all((ws.root / "runs") in p.parents for p in made), made
    assert not Path("/tmp/sentinel-abs-name").exists()


def _good_rebuilt_bad_named(ws: Workspace, outcome) -> None:
    assert "rebuilt" in outcome.out and "good" in outcome.out, outcome.out
    assert "bad" in outcome.err


def _deep(n: int):
    v = 1
    for _ in range(n):
        v = {"k": v}
    return v


def _cases() -> list[Case]:
    c: list[Case] = []

    def add(id_, argv, rc=2, expect="", check=None):
        c.append(Case(id_, argv, rc, expect, check))

    def val(**changes):  # validate a BASE mutation
        return lambda ws: ["validate", ws.scenario(**changes)]

    def run(**changes):
        return lambda ws: ["run", ws.scenario(**changes), "--quiet"]

    # -- the file itself --------------------------------------------------------------------------
    add("missing_file", lambda ws: ["validate", str(ws.root / "nope.yaml")], expect="scenario file not found")
    add("file_is_folder", lambda ws: ["validate", str(ws.root)], expect="(it is a folder)")
    add("dev_zero", lambda ws: ["validate", "/dev/zero"], expect="scenario file not found")
    add("not_utf8", lambda ws: ["validate", ws.scenario(b"name: \xff\xfe\n")], expect="not UTF-8")
    add("nul_byte", lambda ws: ["validate", ws.scenario("name: a\x00b\n")], expect="special characters")
    add("malformed", lambda ws: ["validate", ws.scenario("model: {layers: [1\n")], expect="malformed YAML")
    add("nested_5000_flow", lambda ws: ["validate", ws.scenario(_deep_flow(5000))], expect="nested deeper than 64")
    add(
        "nested_5000_run",
        lambda ws: ["run", ws.scenario(_deep_flow(5000))],
        expect="nested deeper than 64",
        check=_nothing_written,
    )
    add(
        "nested_300_block",
        lambda ws: ["validate", ws.scenario(yaml.safe_dump({"sweep": {"grid": _deep(300)}}))],
        expect="nested deeper",
    )
    add(
        "duplicate_top_key",
        lambda ws: ["validate", ws.scenario("seed: 1\nname: a\nseed: 2\n")],
        expect="duplicate key 'seed' (first at line 1, column 1)",
    )
    add(
        "duplicate_nested_key",
        lambda ws: ["validate", ws.scenario("model:\n  dim: 16\n  dim: 32\n")],
        expect="duplicate key 'dim' (first at line 2",
    )
    add(
        "recursive_alias",
        lambda ws: ["validate", ws.scenario("sweep: {grid: &a {x: [*a]}}\n")],
        expect="recursive alias",
    )
    bomb = (
        "a: &a [1,1,1,1,1,1,1,1,1,1]\n"
        + "".join(f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcde", "bcdef"))
        + "sweep: {grid: {x: *f}}\n"
    )
    add("alias_bomb", lambda ws: ["validate", ws.scenario(bomb)], expect="expands to more than")
    add(
        "python_tag",
        lambda ws: ["validate", ws.scenario("name: !!python/object/apply:os.system ['true']\n")],
        expect="could not determine a constructor",
    )
    add(
        "binary_tag",
        lambda ws: ["validate", ws.scenario("name: !!binary aGVsbG8=\n")],
        expect="could not determine a constructor",
    )
    add("top_level_list", lambda ws: ["validate", ws.scenario("- 1\n- 2\n")], expect="must be a mapping")
    add("top_level_scalar", lambda ws: ["validate", ws.scenario("42\n")], expect="must be a mapping")
    add("two_documents", lambda ws: ["validate", ws.scenario("a: 1\n---\nb: 2\n")], expect="malformed YAML")
    add(
        "over_1mib",
        lambda ws: ["validate", ws.scenario("description: '" + "x" * (1 << 20) + "'\n")],
        expect="larger than 1,048,576 bytes",
    )
    add("empty_file_is_defaults", lambda ws: ["validate", ws.scenario("")], rc=0, expect=": ok")
    add("date_stays_string", lambda ws: ["validate", ws.scenario("name: 2024-01-02\n")], rc=0, expect="(2024-01-02:")

    # -- schema: keys, types, ranges -------------------------------------------------------------
    add("unknown_top_key", val(modle={}), expect="modle: unknown key 'modle' (did you mean 'model'?)")
    add("unknown_nested_key", val(training__setps=3), expect="training.setps: unknown key")
    add("wrong_type", val(training__steps="many"), expect="training.steps: expected an integer")
    add("bool_for_int", val(seed=True), expect="seed: expected an integer")
    add("float_for_int", val(training__steps=1.5), expect="training.steps: expected an integer")
    add("negative_layers", val(model__layers=-2), expect="model.layers: must be >= 1")
    add("zero_batch", val(data__batch_size=0), expect="data.batch_size: must be >= 1")
    add(
        "nan_lr", lambda ws: ["validate", ws.scenario("training: {lr: .nan}\n")], expect="training.lr: must be a finite"
    )
    add(
        "inf_lr", lambda ws: ["validate", ws.scenario("training: {lr: .inf}\n")], expect="training.lr: must be a finite"
    )
    add("lr_1e308", val(training__lr=1e308), expect="training.lr: must be <= 10")
    add(
        "lr_400_digits",
        lambda ws: ["validate", ws.scenario("training: {lr: " + "9" * 400 + "}\n")],
        expect="training.lr: must be a finite number, got an integer of 400 digits",
    )
    add(
        "steps_400_digits",
        lambda ws: ["validate", ws.scenario("training: {steps: " + "9" * 400 + "}\n")],
        expect="training.steps: must be <= 10000000, got an integer of 400 digits",
    )
    add("stages_2_64", val(pipeline__stages=2**64), expect="pipeline.stages: must be <= 1024")
    add(
        "stages_2_64_run",
        run(pipeline__stages=2**64),
        expect="pipeline.stages: must be <= 1024",
        check=_nothing_written,
    )
    add("replicas_3e9", val(pipeline__replicas=3_000_000_000), expect="pipeline.replicas: must be <= 4096")
    add(
        "replicas_3e9_run",
        run(pipeline__replicas=3_000_000_000),
        expect="pipeline.replicas: must be <= 4096",
        check=_nothing_written,
    )
    add(
        "microbatches_1e12_float", val(pipeline__microbatches=1e12), expect="pipeline.microbatches: expected an integer"
    )
    add("microbatches_1e12", val(pipeline__microbatches=10**12), expect="pipeline.microbatches: must be <= 4096")
    add(
        "microbatches_1e12_run",
        run(pipeline__microbatches=10**12),
        expect="pipeline.microbatches: must be <=",
        check=_nothing_written,
    )
    add("batch_1e11", val(data__batch_size=10**11), expect="data.batch_size: must be <= 65536")
    add("workers_4e12", val(pipeline__stages=2_000_000, pipeline__replicas=2_000_000), expect="must be <=")
    add(
        "workers_over_max",
        lambda ws: ["validate", ws.scenario(model__layers=1024, pipeline__stages=1024, pipeline__replicas=4096)],
        expect="workers; at most 16,384",
    )
    add("seed_2_64", val(seed=2**64), expect="seed: must be <= 9223372036854775807")
    add("seed_2_63", val(seed=2**63), expect="seed: must be <= 9223372036854775807")
    add("seed_2_63_minus_1", val(seed=2**63 - 1), rc=0, expect=": ok")
    add("seed_negative", val(seed=-1), expect="seed: must be >= 0")
    add("dim_huge", val(model__dim=10**6), expect="model.dim: must be <= 65536")
    add("heads_not_divisor", val(model__heads=3), expect="model.heads: model.dim (16) must be divisible")
    add("vocab_too_small", val(model__vocab=8), expect="model.vocab: 8 is smaller than")
    add("seq_len_1", val(model__seq_len=1), expect="model.seq_len: must be >= 2")
    add("stages_gt_layers", val(pipeline__stages=3), expect="pipeline.stages: 3 stages but model.layers is 2")
    add("markov_contexts", val(data__vocab=4096, data__order=2), expect="Markov contexts is too many")
    add("section_not_mapping", val(pipeline=[1, 2]), expect="pipeline: expected a mapping")
    add("steps_over_max", val(training__steps=10**8), expect="training.steps: must be <= 10000000")
    add("warmup_huge", val(training__warmup_steps=2**40), expect="training.warmup_steps: must be <=")
    add("weight_decay_huge", val(training__weight_decay=1e300), expect="training.weight_decay: must be <= 10")
    add(
        "staleness_100",
        lambda ws: ["validate", ws.scenario("transport: {async: {max_staleness: 100}}\n")],
        expect="transport.async.max_staleness: must be <= 64",
    )
    add(
        "bandwidth_zero",
        lambda ws: ["validate", ws.scenario("transport: {network: {bandwidth_mbps: 0}}\n")],
        expect="transport.network.bandwidth_mbps: must be > 0",
    )
    add(
        "regions_huge",
        lambda ws: ["validate", ws.scenario("transport: {network: {regions: 100000000}}\n")],
        expect="transport.network.regions: must be <= 1024",
    )
    add(
        "dp_compression_without_allreduce",
        lambda ws: ["validate", ws.scenario("dp: {sync: none, compression: {method: topk}}\n")],
        expect="dp.compression.method",
    )
    add("name_control_chars", val(name="a\x1b[2Jb"), expect="name: ")
    add("name_too_long", val(name="n" * 1000), expect="at most 200 printable characters")
    add("name_not_string", val(name=[1]), expect="name: expected a string")

    # -- plug-ins ---------------------------------------------------------------------------------
    add("unknown_aggregator", val(dp={"aggregator": "meen"}), expect="did you mean 'mean'")
    add(
        "unknown_attack",
        val(pipeline__replicas=3, adversary={"fraction": 0.34, "attacks": [{"name": "bais"}]}),
        expect="unknown attacks 'bais'",
    )
    add(
        "attack_unknown_param",
        val(pipeline__replicas=3, adversary={"fraction": 0.34, "attacks": [{"name": "bias", "bb": 1}]}),
        expect="unknown key 'bb'",
    )
    add(
        "attack_param_type",
        val(pipeline__replicas=3, adversary={"fraction": 0.34, "attacks": [{"name": "bias", "b": "big"}]}),
        expect="expected a number",
    )
    add(
        "attack_param_nan",
        lambda ws: [
            "validate",
            ws.scenario("pipeline: {replicas: 3}\nadversary: {fraction: 0.34, attacks: [{name: bias, b: .nan}]}\n"),
        ],
        expect="must be a finite number",
    )
    add(
        "attack_int_param_huge",
        val(pipeline__replicas=3, adversary={"fraction": 0.34, "attacks": [{"name": "delay", "d": 10**30}]}),
        expect="must be <= 10000000",
    )
    add(
        "attack_start_huge",
        val(pipeline__replicas=3, adversary={"fraction": 0.34, "attacks": [{"name": "bias", "start": 2**70}]}),
        expect="start: must be <= 10000000",
    )
    add(
        "attack_role",
        val(pipeline__replicas=3, adversary={"fraction": 0.34, "attacks": [{"name": "bias", "role": "sideways"}]}),
        expect="'sideways' is not one of",
    )
    add("fraction_2", val(adversary={"fraction": 2}), expect="adversary.fraction: must be <= 1")
    add(
        "explicit_worker_missing",
        val(adversary={"placement": "explicit", "workers": ["s9r9"], "attacks": [{"name": "bias"}]}),
        expect="does not exist",
    )
    add(
        "dishonest_majority",
        val(
            pipeline__stages=2,
            pipeline__replicas=2,
            adversary={"fraction": 0.5, "protect": [], "attacks": [{"name": "bias"}]},
        ),
        expect="no honest majority",
    )
    add("unknown_detector", val(detector="sentinal"), expect="did you mean 'sentinel'")
    add("detector_param_range", val(detector={"name": "sentinel", "k": -1}), expect="detector.k: must be > 0")
    add("detector_window_huge", val(detector={"name": "sentinel", "window": 2**40}), expect="must be <= 10000000")
    add(
        "unknown_codec",
        lambda ws: ["validate", ws.scenario("transport: {codec: {name: zipp}}\n")],
        expect="unknown codecs 'zipp'",
    )

    # -- data files -------------------------------------------------------------------------------
    add(
        "data_path_missing",
        lambda ws: [
            "validate",
            ws.scenario(data={**BASE, "data": {"source": "text", "path": str(ws.root / "none.txt")}}),
        ],
        expect="data.path: file not found",
    )
    add(
        "data_path_empty",
        lambda ws: ["validate", ws.scenario(data={**BASE, "data": {"source": "text", "path": ws.file("empty.txt")}})],
        expect="data.path: ",
    )
    add(
        "data_path_empty_run",
        lambda ws: ["run", ws.scenario(data={**BASE, "data": {"source": "text", "path": ws.file("empty.txt")}})],
        expect="has 0 bytes",
        check=_nothing_written,
    )
    add(
        "data_path_short",
        lambda ws: [
            "validate",
            ws.scenario(data={**BASE, "data": {"source": "text", "path": ws.file("short.txt", "x" * 15)}}),
        ],
        expect="each need model.seq_len + 2",
    )
    add(  # a folder of text files is a corpus (one document per file): an empty one is refused
        "data_path_folder",
        lambda ws: [
            "validate",
            ws.scenario(data={**BASE, "data": {"source": "text", "path": ws.folder("empty_corpus")}}),
        ],
        expect="holds no files",
    )
    add(
        "data_path_dev_zero",
        lambda ws: ["validate", ws.scenario(data={**BASE, "data": {"source": "text", "path": "/dev/zero"}})],
        expect="not a regular file",
    )
    add(
        "data_path_synthetic",
        lambda ws: ["validate", ws.scenario(data={**BASE, "data": {"path": "x.txt"}})],
        expect="only used with data.source: text",
    )
    add(
        "data_path_nul",
        lambda ws: ["validate", ws.scenario(data={**BASE, "data": {"source": "text", "path": "a\x00b"}})],
        expect="embedded null byte",
    )
    add(
        "data_path_too_long",
        lambda ws: ["validate", ws.scenario(data={**BASE, "data": {"source": "text", "path": "x" * 5000}})],
        expect="data.path: cannot read",
    )

    # -- sweep grids: validate checks them as sweep does ----------------------------------------
    for cmd in ("validate", "sweep"):
        add(
            f"{cmd}_grid_not_list",
            lambda ws, cmd=cmd: [cmd, ws.scenario(sweep={"grid": {"training.lr": 0.1}})],
            expect="sweep.grid.training.lr: expected a non-empty list",
            check=_nothing_written,
        )
        add(
            f"{cmd}_grid_bad_value",
            lambda ws, cmd=cmd: [cmd, ws.scenario(sweep={"grid": {"training.steps": [1, "abc"]}})],
            expect="training.steps: expected an integer",
            check=_nothing_written,
        )
        add(
            f"{cmd}_grid_unknown_key",
            lambda ws, cmd=cmd: [cmd, ws.scenario(sweep={"grid": {"training.setps": [1]}})],
            expect="unknown key 'setps'",
            check=_nothing_written,
        )
        add(
            f"{cmd}_grid_huge",
            lambda ws, cmd=cmd: [cmd, ws.scenario(sweep={"grid": {f"k{i}": list(range(10)) for i in range(20)}})],
            expect="points; at most 10,000",
            check=_nothing_written,
        )
        add(
            f"{cmd}_grid_over_budget",
            lambda ws, cmd=cmd: [
                cmd,
                ws.scenario(sweep={"grid": {"data.batch_size": [2, 65536], "pipeline.microbatches": [4096]}}),
                "--max-memory",
                "4",
            ],
            expect="drives the largest term",
            check=_nothing_written,
        )
    add("sweep_grid_empty", lambda ws: ["sweep", ws.scenario()], expect="sweep.grid: empty")
    add("grid_int_key", lambda ws: ["validate", ws.scenario("sweep: {grid: {1: [2]}}\n")], expect="keys are strings")
    add(
        "notes_not_string",
        val(sweep={"grid": {"seed": [1]}, "notes": {"1": [1, 2]}}),
        expect="sweep.notes.1: expected a string",
    )
    add(
        "reference_not_a_grid_point",
        val(sweep={"grid": {"seed": [1]}, "reference": {"1": [1, 2]}}),
        expect="sweep.reference.1: not a grid key; the grid varies seed",
    )
    add(
        "grid_date_value",
        lambda ws: ["validate", ws.scenario("sweep: {grid: {name: [2024-01-02]}}\n")],
        rc=0,
        expect="1 points",
    )

    # -- --set ------------------------------------------------------------------------------------
    def setv(*items):
        return lambda ws: ["validate", ws.scenario(), *[a for i in items for a in ("--set", i)]]

    add("set_no_equals", setv("training.steps"), expect="expected KEY=VALUE")
    add("set_bad_yaml", setv("training.lr=[1"), expect="is not valid YAML")
    add("set_unknown_key", setv("pipeline.stagse=2"), expect="did you mean 'stages'")
    add("set_deep_key", setv("a" + ".a" * 40 + "=1"), expect="at most 200 characters and 16 levels")
    add("set_index_missing", setv("adversary.attacks[5].b=1"), expect="is not a list index that exists")
    add("set_deep_value", setv("sweep.grid.x=" + "[" * 5000 + "]" * 5000), expect="nested deeper than 64")
    add("set_on_scalar", setv("training.steps.x=1"), expect="not a mapping")
    add("set_seed_huge", setv("seed=" + "9" * 400), expect="seed: must be <= 9223372036854775807")
    add("set_duplicate_in_value", setv("model={dim: 16, dim: 32}"), expect="duplicate key 'dim'")

    # -- flags and paths --------------------------------------------------------------------------
    for cmd in ("run", "validate"):
        add(
            f"{cmd}_out_existing_file",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--out", ws.file("f.txt", "x")],
            expect="an existing file, not a folder",
            check=_nothing_written,
        )
        add(
            f"{cmd}_out_dev_null",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--out", "/dev/null/x"],
            expect="lies under /dev",
            check=_nothing_written,
        )
        add(
            f"{cmd}_out_proc",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--out", "/proc/sentinel"],
            expect="lies under /proc",
            check=_nothing_written,
        )
        add(
            f"{cmd}_out_under_file",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--out", ws.file("g.txt") + "/sub"],
            expect="is a file, so no folder can be made",
            check=_nothing_written,
        )
        add(
            f"{cmd}_out_empty",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--out", ""],
            expect="give a folder name",
            check=_nothing_written,
        )
        add(
            f"{cmd}_out_long",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--out", "x" * 300],
            expect="longer than the filesystem allows",
            check=_nothing_written,
        )
        add(
            f"{cmd}_nproc_without_dist",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--nproc", "3"],
            expect="--nproc: only used with --backend dist",
            check=_nothing_written,
        )
        add(
            f"{cmd}_resume_missing",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--backend", "dist", "--resume", "/nonexistent"],
            expect="--resume /nonexistent: no such folder",
            check=_nothing_written,
        )
        add(
            f"{cmd}_resume_empty",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--backend", "dist", "--resume", str(ws.root)],
            expect="no complete checkpoint there",
            check=_nothing_written,
        )
        add(
            f"{cmd}_nproc_zero",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--backend", "dist", "--nproc", "0"],
            expect="--nproc 0",
            check=_nothing_written,
        )
        add(
            f"{cmd}_nproc_huge",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--backend", "dist", "--nproc", str(10**9)],
            expect="--nproc 1000000000",
            check=_nothing_written,
        )
        add(
            f"{cmd}_timeout_nan",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--backend", "dist", "--timeout", "nan"],
            expect="--timeout nan",
            check=_nothing_written,
        )
        add(
            f"{cmd}_checkpoint_negative",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--backend", "dist", "--checkpoint-every", "-1"],
            expect="--checkpoint-every -1",
            check=_nothing_written,
        )
        add(
            f"{cmd}_dist_verifiers_zero",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--backend", "dist", "--verifiers", "0"],
            expect="--verifiers 0: between 1 and",
            check=_nothing_written,
        )
        add(
            f"{cmd}_max_memory_nan",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--max-memory", "nan"],
            expect="--max-memory",
            check=_nothing_written,
        )
        add(
            f"{cmd}_max_memory_negative",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--max-memory", "-1"],
            expect="--max-memory",
            check=_nothing_written,
        )
        add(
            f"{cmd}_over_budget",
            lambda ws, cmd=cmd: [cmd, ws.scenario(data__batch_size=60000, pipeline__microbatches=4000)],
            expect="data.batch_size: 60000 drives the largest term",
            check=_nothing_written,
        )
        add(
            f"{cmd}_nproc_not_int",
            lambda ws, cmd=cmd: [cmd, ws.scenario(), "--nproc", "abc"],
            expect="invalid int value",
            check=_nothing_written,
        )
    add(
        "validate_force_over_budget",
        lambda ws: ["validate", ws.scenario(data__batch_size=60000, pipeline__microbatches=4000), "--force"],
        rc=0,
        expect="memory: ~",
    )
    add("validate_prints_estimate", lambda ws: ["validate", ws.scenario()], rc=0, expect="work: ")
    add(
        "markov_bomb_over_budget",
        lambda ws: ["validate", ws.scenario(data__vocab=1414, data__order=2), "--max-memory", "16"],
        expect="data.vocab",
    )
    add(
        "sweep_out_dev_null",
        lambda ws: ["sweep", ws.scenario(sweep={"grid": {"seed": [1]}}), "--out", "/dev/null/x"],
        expect="lies under /dev",
        check=_nothing_written,
    )
    add(
        "sweep_jobs_zero",
        lambda ws: ["sweep", ws.scenario(sweep={"grid": {"seed": [1]}}), "--jobs", "0"],
        expect="--jobs 0",
        check=_nothing_written,
    )
    add(
        "sweep_jobs_negative",
        lambda ws: ["sweep", ws.scenario(sweep={"grid": {"seed": [1]}}), "--jobs", "-3"],
        expect="--jobs -3",
        check=_nothing_written,
    )
    add("unknown_command", lambda ws: ["frobnicate"], expect="invalid choice")
    add("unknown_flag", lambda ws: ["validate", ws.scenario(), "--frob"], expect="unrecognized arguments")
    add("missing_argument", lambda ws: ["run"], expect="the following arguments are required")
    add("list_bad_kind", lambda ws: ["list", "atacks"], expect="did you mean 'attacks'")
    add("describe_unknown", lambda ws: ["describe", "meen"], expect="did you mean 'mean'")
    add(
        "name_dotdot_run",
        lambda ws: ["run", ws.scenario(name="../../x"), "--quiet"],
        rc=0,
        expect="results in runs/",
        check=_stays_under_runs,
    )
    add(
        "name_absolute_run",
        lambda ws: ["run", ws.scenario(name="/tmp/sentinel-abs-name"), "--quiet"],
        rc=0,
        expect="results in runs/tmp-sentinel-abs-name-",
        check=_stays_under_runs,
    )
    add(
        "diverging_run_strict_json",
        lambda ws: ["run", ws.scenario(training__lr=10.0, training__steps=3), "--quiet", "--out", "out"],
        rc=0,
        expect="results in out",
        check=_summary_is_strict,
    )

    # -- report on tampered result folders --------------------------------------------------------
    add("report_missing_dir", lambda ws: ["report", str(ws.root / "none")], expect="no such folder")
    add("report_not_result", lambda ws: ["report", str(ws.root)], expect="scenario.yaml: saved scenario not found")
    add(
        "report_summary_garbage",
        _report(lambda ws, d: (d / "summary.json").write_text("{nope")),
        expect="summary.json: not valid JSON",
    )
    add(
        "report_summary_list",
        _report(lambda ws, d: (d / "summary.json").write_text("[1, 2]")),
        expect="summary.json: expected an object",
    )
    add(
        "report_summary_nan",
        _report(lambda ws, d: (d / "summary.json").write_text('{"cost": {"wall_s": NaN}}')),
        rc=0,
        expect="rebuilt",
        check=_summary_is_strict,
    )
    add(
        "report_events_json_garbage",
        _report(lambda ws, d: (d / "events.json").write_text("\x00\x01")),
        expect="events.json: not valid JSON",
    )
    add(
        "report_events_json_types",
        _report(lambda ws, d: (d / "events.json").write_text('{"workers": 3, "attacks": [], "meta": {}}')),
        expect="events.json[workers]: expected a list of strings",
    )
    add(
        "report_meta_malicious",
        _report(
            lambda ws, d: (d / "events.json").write_text(
                json.dumps({**json.loads((d / "events.json").read_text()), "meta": {"malicious": 7}})
            )
        ),
        expect="events.json[meta.malicious]",
    )
    add(
        "report_npz_garbage",
        _report(lambda ws, d: (d / "events.npz").write_bytes(b"garbage" * 100)),
        expect="events.npz: not a readable numpy archive",
    )
    add(
        "report_npz_empty",
        _report(lambda ws, d: (d / "events.npz").write_bytes(b"")),
        expect="events.npz: not a readable numpy archive",
    )
    add(
        "report_npz_pickled",
        _report(
            lambda ws, d: (d / "events.npz").write_bytes(_npz({"messages.id": np.array([object()], dtype=object)}))
        ),
        expect="holds objects",
    )
    add(
        "report_npz_unequal",
        _report(lambda ws, d: _tamper_npz(ws, d, lambda a: a.update({"messages.step": a["messages.step"][:-1]}))),
        expect="columns of unequal length",
    )
    add(
        "report_npz_missing_table",
        _report(lambda ws, d: _tamper_npz(ws, d, lambda a: [a.pop(k) for k in list(a) if k.startswith("evals.")])),
        expect="events.npz[evals]: missing table",
    )
    add(
        "report_npz_sender_range",
        _report(
            lambda ws, d: _tamper_npz(ws, d, lambda a: a.update({"messages.sender": a["messages.sender"] + 10**6}))
        ),
        expect="events.npz[messages.sender]: values from",
    )
    add(
        "report_npz_2d",
        _report(lambda ws, d: _tamper_npz(ws, d, lambda a: a.update({"losses.loss": a["losses.loss"].reshape(-1, 1)}))),
        expect="expected a 1-d",
    )
    add(
        "report_npz_ban_rule_range",
        _report(lambda ws, d: _tamper_npz(ws, d, lambda a: a.update(_one_ban(by=99)))),
        expect="events.npz[bans.by]: values from",
    )
    add("report_npz_huge_header", _report(_huge_header), expect="declares")
    add(
        "report_npz_unknown_column",
        _report(lambda ws, d: _tamper_npz(ws, d, lambda a: a.update({"junk.x": np.zeros(3)}))),
        expect="events.npz[junk.x]: unknown column",
    )
    add(
        "report_npz_verdict_ids",
        _report(lambda ws, d: _tamper_npz(ws, d, lambda a: a.update({"verdicts.msg": a["verdicts.msg"] + 10**9}))),
        expect="verdicts for message ids that were never logged",
    )
    add(
        "report_scenario_python_tag",
        _report(lambda ws, d: (d / "scenario.yaml").write_text("name: !!python/object/apply:os.system ['true']\n")),
        expect="scenario.yaml: malformed YAML",
    )
    add(
        "report_scenario_missing",
        _report(lambda ws, d: (d / "scenario.yaml").unlink()),
        expect="scenario.yaml: saved scenario not found",
    )
    add(
        "report_scenario_bad_type",
        _report(
            lambda ws, d: (d / "scenario.yaml").write_text(
                yaml.safe_dump({**yaml.safe_load((d / "scenario.yaml").read_text()), "pipeline": {"stages": "abc"}})
            )
        ),
        expect="pipeline.stages: expected an integer",
    )
    add(
        "report_twin_corrupt",
        _report(lambda ws, d: (d / "twin_clean" / "events.npz").write_bytes(b"x")),
        expect="twin_clean/events.npz",
    )
    add(
        "report_third_party_detector",
        _report(
            lambda ws, d: (d / "scenario.yaml").write_text(
                yaml.safe_dump(
                    {**yaml.safe_load((d / "scenario.yaml").read_text()), "detector": {"name": "not_installed_plugin"}}
                )
            )
        ),
        rc=0,
        expect="rebuilt",
    )

    def good_and_bad(ws: Workspace) -> list[str]:
        good, bad = ws.result("good"), ws.result("bad")
        (bad / "events.npz").write_bytes(b"junk")
        return ["report", str(good), str(bad)]

    add("report_one_bad_one_good", good_and_bad, expect="bad: events.npz", check=_good_rebuilt_bad_named)
    add("report_out_folder", _report(lambda ws, d: None, "--out", "/tmp"), expect="a folder; give a file name")
    add("report_out_proc", _report(lambda ws, d: None, "--out", "/proc/x.md"), expect="lies under /proc")
    return c


CASES = _cases()
assert len({c.id for c in CASES}) == len(CASES), "duplicate case ids"


def make_report_base(root: Path) -> Path:
    """Train the REPORT_BASE scenario once (in-process) and return its result folder."""
    from sentinel import runner, scenario

    out = Path(root) / "report-base"
    runner.run(scenario.validate(REPORT_BASE), out, progress=False)
    return out


def check_outcome(case: Case, ws: Workspace, outcome) -> list[str]:
    """The rules every case is held to; returns the broken ones (empty: the case passed)."""
    broken = []
    if outcome.hung:
        broken.append("hung")
    if outcome.traceback:
        broken.append("traceback")
    if outcome.rc != case.rc:
        broken.append(f"exit {outcome.rc}, expected {case.rc}")
    text = outcome.out if case.rc == 0 else outcome.err
    if case.expect and case.expect not in text:
        broken.append(f"message lacks {case.expect!r}")
    if case.rc == 2 and not outcome.errors:
        broken.append("no 'error:' line")
    if not broken and case.check is not None:
        try:
            case.check(ws, outcome)
        except AssertionError as exc:
            broken.append(f"check failed: {exc}")
    return broken


os.environ.setdefault("OMP_NUM_THREADS", "1")
