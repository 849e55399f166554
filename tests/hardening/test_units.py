"""Unit checks of the hardening pieces: strict JSON, the budget's model formula and driving key, folder
names, and the documented ranges (schema and README agree; every numeric key is bounded on both sides)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from sentinel import budget, preflight, scenario, strictjson
from sentinel.config import schema_rows
from sentinel.errors import ConfigError
from sentinel.model import build_stages, num_params
from sentinel.scenario import Scenario
from tests.hardening.catalogue import BASE

README = Path(__file__).resolve().parents[2] / "README.md"


def test_strict_json_writes_null_for_non_finite_numbers():
    text = strictjson.dumps({"a": math.nan, "b": [np.float32("inf"), np.int64(3)], "c": np.array([1.0, -math.inf])})
    assert text == '{"a": null, "b": [null, 3], "c": [1.0, null]}'
    with pytest.raises(ValueError):
        strictjson.loads('{"x": NaN}')


@pytest.mark.parametrize(
    "changes",
    [[], ["model.vocab=100", "pipeline.stages=3", "model.layers=5"], ["model.ffn_hidden=40", "pipeline.stages=1"]],
)
def test_model_formula_counts_the_built_model(changes):
    sc = scenario.validate(BASE, changes)
    dims = budget.model_dims(sc)
    stages = build_stages(sc.model, dims.vocab, sc.pipeline.stages, 0)
    assert list(dims.params_per_stage) == [num_params([s]) for s in stages]


def test_estimate_names_the_key_that_drives_it():
    sc = scenario.validate(BASE, ["data.batch_size=4096", "pipeline.microbatches=64", "model.dim=256"])
    est = budget.estimate(sc)
    assert est.total > budget.estimate(scenario.validate(BASE)).total
    with pytest.raises(ConfigError, match=r"data\.batch_size: 4096 drives the largest term .*activations"):
        budget.check(sc, est, budget.GIB, "a test budget")
    budget.check(sc, est, None, "no budget")  # unknown budget: no check


@pytest.mark.parametrize(
    "name,expected",
    [
        ("../../x", "x"),
        ("/tmp/abs", "tmp-abs"),
        ("a b/c", "a-b-c"),
        ("...", "unnamed"),
        ("ok_name-1.2", "ok_name-1.2"),
        ("é" * 5, "unnamed"),
    ],
)
def test_scenario_names_become_one_safe_folder_name(name, expected):
    assert preflight.safe_name(name) == expected


def _numeric_rows():
    return [r for r in schema_rows(Scenario) if re.search(r"\b(int|float)\b", r[1])]


def test_every_numeric_scenario_key_is_bounded_on_both_sides():
    for key, _, _, rng, _ in _numeric_rows():
        assert re.fullmatch(r"\S+ <=? x <=? \S+", rng), f"{key}: range {rng!r}"


def test_readme_lists_every_numeric_range():
    text = README.read_text()
    for key, _, default, rng, _ in _numeric_rows():
        assert f"| `{key}` | {rng} | {default} |" in text, f"README range table is missing or stale for {key}"


def test_a_plugin_can_declare_its_memory(monkeypatch):
    from sentinel.registry import DETECTORS

    cls = DETECTORS.get("sentinel")
    monkeypatch.setattr(cls, "memory_bytes", classmethod(lambda c, cfg, sc: cfg.window * 2**20), raising=False)
    sc = scenario.validate(BASE, ["detector.name=sentinel", "detector.window=5000"])
    est = budget.estimate(sc)
    assert {t.name: t.bytes for t in est.terms}["plug-ins"] == 5000 * 2**20
    with pytest.raises(ConfigError, match="plug-ins"):
        budget.check(sc, est, 4 * budget.GIB, "a test budget")
