"""Property: `validate` accepts exactly what `run` and `sweep` accept.

Hypothesis generates tiny scenarios around the edges of the schema (sizes, ranges, divisibility, data
files, attacks, detector settings, sweep grids, output folders, memory budgets), then runs `validate`,
`run` (really training: one or two steps of a tiny model) and, for a scenario with a grid, `sweep`, each
in an isolated child. All must agree: exit 0 together, or exit 2 together, never 1, no traceback.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.hardening.catalogue import BASE
from tests.hardening.harness import Harness

HARNESS: Harness | None = None


@pytest.fixture(scope="module", autouse=True)
def harness():
    global HARNESS
    HARNESS = Harness()
    yield HARNESS
    HARNESS = None


@st.composite
def cases(draw):
    def pick(good, bad):  # mostly good values, so a fair share of scenarios is valid and really runs
        # ~5% bad per key; hypothesis favours the ends of a range, so the bad slice sits in its middle
        return draw(st.sampled_from(bad)) if 40 <= draw(st.integers(0, 99)) < 45 else draw(st.sampled_from(good))

    d = copy.deepcopy(BASE)
    d["model"] = {
        "layers": pick([2, 3], [0, 1]),
        "dim": pick([8, 16], [12, -4]),
        "heads": pick([2], [3, 0]),
        "seq_len": pick([4, 8], [1]),
    }
    d["pipeline"] = {
        "stages": pick([1, 2], [3, 2000]),
        "replicas": pick([1, 3], [0, 5000]),
        "microbatches": pick([1, 2], [0, 10**12]),
        "schedule": pick(["gpipe", "1f1b"], ["2f2b"]),
    }
    d["training"] = {
        "steps": pick([1, 2], [0]),
        "lr": pick([1e-3, 3e-3], [0.0, 11.0, float("nan")]),
        "optimizer": pick(["adamw", "sgd"], ["adam"]),
        "warmup_steps": 0,
        "eval_every": 1,
    }
    d["seed"] = pick([0, 7, 2**63 - 1], [2**63, -1])
    data = pick(["synthetic", "text"], ["text_short", "text_empty", "text_missing", "text_folder"])
    d["data"] = {"source": "synthetic", "vocab": pick([16], [1]), "batch_size": pick([1, 2], [0]), "val_batches": 1}
    if data != "synthetic":
        d["data"] = {"source": "text", "batch_size": 2, "val_batches": 1, "path": data}
    attack = pick(["none", "bias"], ["bias_bad_param", "unknown"])
    if attack != "none":
        name = {"unknown": "bais"}.get(attack, "bias")
        spec = {"name": name, "role": "gradient", "start": 1} | ({"b": "big"} if attack == "bias_bad_param" else {})
        d["adversary"] = {"fraction": 0.34, "protect": [], "attacks": [spec]}
    d["detector"] = pick([{"name": "none"}, {"name": "sentinel", "warmup_steps": 1}], [{"name": "sentinel", "k": -1}])
    grid = pick([None, None, None, {"training.lr": [1e-3, 2e-3]}], [{"training.lr": [1e-3, "x"]}, {"seed": 5}])
    if grid is not None:
        d["sweep"] = {"grid": grid}
    out = pick(["out"], ["file.txt", "/dev/null/x"])
    budget = pick([None], ["0.0001"])
    return d, out, budget


def _materialise(d: dict, ws: Path) -> Path:
    """Text sources point at files of the drawn kind; returns the scenario file."""
    text = ws / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    (ws / "short.txt").write_text("tiny")
    (ws / "empty.txt").write_text("")
    (ws / "file.txt").write_text("x")
    files = {
        "text": text,
        "text_short": ws / "short.txt",
        "text_empty": ws / "empty.txt",
        "text_missing": ws / "missing.txt",
        "text_folder": ws,
    }
    if "path" in d["data"]:
        d["data"]["path"] = str(files[d["data"]["path"]])
    path = ws / "s.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases())
def test_validate_accepts_exactly_what_run_and_sweep_accept(case):
    d, out, budget = case
    with tempfile.TemporaryDirectory(prefix="sentinel-equiv-") as tmp:
        ws = Path(tmp)
        path = _materialise(d, ws)
        extra = ["--max-memory", budget] if budget else []
        target = out if out.startswith("/") else str(ws / out)
        results = {}
        for cmd in ["validate", "run"] + (["sweep"] if "sweep" in d else []):
            folder = target if cmd != "sweep" or out != "out" else str(ws / "sweep-out")
            flags = ["--out", folder, *extra] + {"run": ["--quiet"], "sweep": ["--jobs", "1"]}.get(cmd, [])
            o = HARNESS.run([cmd, str(path), *flags], cwd=ws, timeout=300)
            assert not o.traceback and not o.hung, o.describe()
            results[cmd] = o
        codes = {cmd: o.rc for cmd, o in results.items()}
        event(f"validate exit {codes['validate']}" + (" (with a grid)" if "sweep" in codes else ""))
        assert codes["validate"] in (0, 2), results["validate"].describe()
        assert set(codes.values()) == {codes["validate"]}, f"{codes}\n" + "\n".join(
            o.describe() for o in results.values()
        )
