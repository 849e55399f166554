"""Scenario and flag fuzzing: mutations of the scenario library, judged by the CLI's rules.

A case takes a library scenario, applies 1-3 mutations (drop, rename, wrong type, huge or non-finite
number, negative number, duplicated line, deep nesting, byte damage) and draws CLI flags (`--set` on
existing keys with good and bad values, `--out`, `--backend dist` with `--nproc` / `--resume` /
`--timeout`, `--max-memory`, `--force`). It runs `sentinel validate`; when validate refuses, the same
arguments go to `sentinel run` (and to `sentinel sweep` for a scenario with a grid), which must refuse
too (exit 2) without writing anything. Every command must exit 0 or 2, print no traceback, not hang
and stay under the memory cap. A mutation that is bad by construction (an unknown key, a non-number
where a number goes, a 400-digit number, NaN, a duplicated key, 5,000 levels of nesting) must not be
accepted: that is counted as `accepted_bad`.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = sorted(p for p in (ROOT / "scenarios").rglob("*.yaml"))
FREE = ("sweep.reference", "description", "name")  # subtrees where any string is valid


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


def _dotted(path: tuple) -> str:
    text = ""
    for p in path:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text


def _free(path: tuple) -> bool:
    return any(_dotted(path).startswith(f) for f in FREE)


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def _set(node: Any, path: tuple, value: Any) -> None:
    _get(node, path[:-1])[path[-1]] = value


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclasses.dataclass
class FuzzCase:
    source: str  # library file it came from
    body: bytes  # the mutated scenario file
    flags: list[str]
    mutations: list[str]
    certainly_bad: bool
    has_grid: bool


def _forget_under(bad: list[tuple], path: tuple) -> None:
    """A mutation at `path` replaced or removed whatever bad mutations lay under it."""
    bad[:] = [b for b in bad if b[: len(path)] != path]


def _mutate_data(rng: random.Random, data: dict, log: list[str], bad: list[tuple]) -> None:
    """One structural mutation of the parsed scenario; appends its path to `bad` if it is bad by construction."""
    paths = _paths(data)
    if not paths:
        return
    path = rng.choice(paths)
    value = _get(data, path)
    kind = rng.choice(["drop", "rename", "wrong_type", "huge", "nonfinite", "negative", "float_max"])
    if kind == "drop":
        parent = _get(data, path[:-1])
        parent.pop(path[-1])
        _forget_under(bad, path if isinstance(path[-1], str) else path[:-1])  # list indices shift
        log.append(f"drop {_dotted(path)}")
        return
    if kind == "rename" and isinstance(path[-1], str):
        parent = _get(data, path[:-1])
        parent[path[-1] + "x"] = parent.pop(path[-1])
        _forget_under(bad, path)
        log.append(f"rename {_dotted(path)}")
        if not _free(path) and not _dotted(path).startswith("sweep.grid."):  # grid keys: checked per point
            bad.append(path[:-1] + (path[-1] + "x",))
        return
    _forget_under(bad, path)
    if not _is_number(value):
        replacement = rng.choice([123, -1, 2.5, "zz", [1], {"a": 1}, None, True])
        _set(data, path, replacement)
        log.append(f"wrong_type {_dotted(path)}={replacement!r}")
        return
    certain = not _free(path)
    if kind == "wrong_type":
        _set(data, path, "zz-not-a-number")
    elif kind == "huge":
        _set(data, path, rng.choice([10**400, -(10**400), 2**64, 2**63]))
        certain &= abs(_get(data, path)) > 10**300  # overflows any float; above every integer bound
    elif kind == "nonfinite":
        _set(data, path, rng.choice([float("nan"), float("inf"), float("-inf")]))
    elif kind == "negative":
        _set(data, path, -abs(value) - rng.choice([0, 1, 10**6]))
        certain = False
    else:
        _set(data, path, rng.choice([1e308, -1e308, 1e-308]))
        certain = False
    log.append(f"{kind} {_dotted(path)}")
    if certain:
        bad.append(path)


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=10**6)


def _mutate_text(rng: random.Random, text: str, log: list[str]) -> tuple[bytes, bool]:
    kind = rng.choice(["duplicate_line", "deep", "bytes", "truncate"])
    lines = text.splitlines(keepends=True)
    keyed = [i for i, line in enumerate(lines) if line.lstrip()[:1].isalpha() and ":" in line]
    if kind == "duplicate_line" and keyed:
        i = rng.choice(keyed)
        indent = len(lines[i]) - len(lines[i].lstrip())
        j = i + 1  # the copy lands right after the entry's own block, so it joins the same mapping
        while j < len(lines) and (len(lines[j]) - len(lines[j].lstrip()) > indent or not lines[j].strip()):
            j += 1
        log.append(f"duplicate_line {lines[i].strip()[:40]!r}")
        return "".join(lines[:j] + lines[i:j] + lines[j:]).encode(), True
    if kind == "deep":
        n = rng.choice([100, 5000])
        log.append(f"deep {n}")
        return (text + "zz_deep: " + "[" * n + "]" * n + "\n").encode(), True
    raw = bytearray(text.encode())
    if kind == "truncate" and raw:
        cut = rng.randrange(len(raw))
        log.append(f"truncate at {cut}")
        return bytes(raw[:cut]), False
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(len(raw) + 1)
        op = rng.choice(["flip", "insert", "delete"])
        if op == "flip" and pos < len(raw):
            raw[pos] ^= 1 << rng.randrange(8)
        elif op == "insert":
            raw[pos:pos] = bytes([rng.randrange(256)])
        elif pos < len(raw):
            del raw[pos]
    log.append("bytes")
    return bytes(raw), False


SET_VALUES = [
    "1",
    "0",
    "-1",
    "abc",
    "1e999",
    ".nan",
    "[1",
    "{a: 1}",
    "99999999999999999999999",
    "null",
    "true",
    "1.5",
    "[]",
    "'s'",
]
PATHS = ["/dev/null/x", "/proc/fuzz", "", "{ws}/file.txt", "{ws}/out", "{ws}/file.txt/sub", "x" * 300]


def _flags(rng: random.Random, data: dict, ws: Path, log: list[str]) -> tuple[list[str], bool]:
    flags, bad = [], False
    for _ in range(rng.choice([0, 0, 1, 2])):
        paths = [p for p in _paths(data) if all(isinstance(x, str) or isinstance(x, int) for x in p)]
        key = (
            _dotted(rng.choice(paths))
            if paths and rng.random() < 0.8
            else rng.choice(["training.setps", "zz", "a.b.c", "x[0]"])
        )
        value = rng.choice(SET_VALUES)
        flags += ["--set", f"{key}={value}"]
        log.append(f"--set {key}={value}")
    if rng.random() < 0.3:
        out = rng.choice(PATHS).format(ws=ws)
        flags += ["--out", out]
        bad |= out in ("/dev/null/x", "/proc/fuzz", "", f"{ws}/file.txt", f"{ws}/file.txt/sub", "x" * 300)
        log.append(f"--out {out[:40]}")
    if rng.random() < 0.15:
        flags += ["--backend", "dist"]
        if rng.random() < 0.5:
            n = rng.choice(["0", "-2", "3", "5", "100000", "abc"])
            flags += ["--nproc", n]
        if rng.random() < 0.3:
            flags += ["--resume", rng.choice(["/nonexistent", str(ws)])]
            bad = True
        if rng.random() < 0.3:
            t = rng.choice(["nan", "-1", "1e999", "5"])
            flags += ["--timeout", t]
            bad |= t != "5"
        log.append("dist flags")
    if rng.random() < 0.1:
        m = rng.choice(["nan", "0", "-1", "0.0001", "1e9"])
        flags += ["--max-memory", m]
        bad |= m in ("nan", "0", "-1")
        log.append(f"--max-memory {m}")
    if rng.random() < 0.1:
        flags.append("--force")
    return flags, bad


def make_case(rng: random.Random, ws: Path) -> FuzzCase:
    """One fuzz case from the library, drawn with `rng` (a seeded random.Random or hypothesis' `randoms()`)."""
    source = rng.choice(LIBRARY)
    data = yaml.safe_load(source.read_text()) or {}
    data = copy.deepcopy(data)
    log: list[str] = []
    bad_paths: list[tuple] = []
    mild = rng.random() < 0.3  # one mutation, no damage to the text, no flags: many of these are accepted
    for _ in range(1 if mild else rng.randint(1, 3)):
        _mutate_data(rng, data, log, bad_paths)
    body = _dump(data).encode()
    bad = bool(bad_paths)
    if not mild and rng.random() < 0.35:
        body, text_bad = _mutate_text(rng, body.decode(), log)
        # truncation and byte damage may remove (or garble) what made it bad: only their own verdict counts
        bad = text_bad or (bad and log[-1].startswith(("duplicate_line", "deep")))
    flags, flags_bad = ([], False) if mild else _flags(rng, data, ws, log)
    grid = isinstance(data.get("sweep"), dict) and bool(data["sweep"].get("grid"))
    return FuzzCase(str(source.relative_to(ROOT)), body, flags, log, bad or flags_bad, grid)


@dataclasses.dataclass
class Verdict:
    commands: list[tuple[str, int | None]]  # (command, exit code) in the order run
    traceback: bool = False
    hung: bool = False
    bad_exit: bool = False  # an exit code other than 0 / 2 (or a run accepted what validate refused)
    accepted_bad: bool = False
    wrote_when_refused: bool = False
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not (self.traceback or self.hung or self.bad_exit or self.accepted_bad or self.wrote_when_refused)


def judge(case: FuzzCase, ws: Path, harness, timeout: float = 60.0) -> Verdict:
    """Run the case (validate, then run / sweep on refusal) and apply the rules of the module docstring."""
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "file.txt").write_text("x")
    scenario = ws / "fuzz.yaml"
    scenario.write_bytes(case.body)
    v = Verdict([])
    first = harness.run(["validate", str(scenario), *case.flags], cwd=ws, timeout=timeout)
    outcomes = [("validate", first)]
    if first.rc == 2:  # refused: run (same flags) must refuse too, and write nothing
        outcomes.append(("run", harness.run(["run", str(scenario), *case.flags], cwd=ws, timeout=timeout)))
        if case.has_grid:  # sweep has no dist flags: it must refuse whatever validate refuses with its flags
            flags = _sweep_flags(case.flags)
            again = harness.run(["validate", str(scenario), *flags], cwd=ws, timeout=timeout)
            outcomes.append(("validate (sweep flags)", again))
            if again.rc == 2:
                outcomes.append(("sweep", harness.run(["sweep", str(scenario), *flags], cwd=ws, timeout=timeout)))
        v.wrote_when_refused = (ws / "runs").exists() or (ws / "out").exists()
    for cmd, o in outcomes:
        v.commands.append((cmd, o.rc))
        v.traceback |= o.traceback
        v.hung |= o.hung
        refused_before = cmd in ("run", "sweep")  # validate refused exactly these arguments
        if not o.hung and (o.rc not in (0, 2) or (refused_before and o.rc != 2)):
            v.bad_exit = True
        if o.traceback or o.hung or v.bad_exit:
            v.detail = v.detail or f"[{cmd}] " + o.describe()
    v.accepted_bad = first.rc == 0 and case.certainly_bad
    if v.accepted_bad:
        v.detail = "[validate accepted a bad case] " + first.describe()
    return v


def _sweep_flags(flags: list[str]) -> list[str]:
    """`sweep` takes --out, --set, --max-memory and --force of the drawn flags (it has no dist flags)."""
    out, i = [], 0
    while i < len(flags):
        f = flags[i]
        if f in ("--set", "--out", "--max-memory"):
            out += flags[i : i + 2]
            i += 2
        elif f == "--force":
            out.append(f)
            i += 1
        else:
            i += 2 if f in ("--backend", "--nproc", "--resume", "--timeout") else 1
    return out
