"""Scenario validation: every bad input is a located ConfigError (exit 2), never a traceback."""

from __future__ import annotations

import copy
import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel import preflight, scenario
from sentinel.cli import main
from sentinel.errors import ConfigError
from tests.conftest import TINY


def _write(tmp_path, data, name="s.yaml"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def _with(path: str, value):
    data = copy.deepcopy(TINY)
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return data


BAD = [
    ("unknown_top_key", _with("modle", {}), "modle: unknown key 'modle' (did you mean 'model'?)"),
    ("unknown_nested_key", _with("training.setps", 3), "training.setps: unknown key 'setps' (did you mean 'steps'?)"),
    ("wrong_type", _with("training.steps", "many"), "training.steps: expected an integer, got 'many'"),
    ("negative_size", _with("model.layers", -2), "model.layers: must be >= 1, got -2"),
    ("zero_batch", _with("data.batch_size", 0), "data.batch_size: must be >= 1, got 0"),
    ("stages_gt_layers", _with("pipeline.stages", 9), "pipeline.stages: 9 stages but model.layers is 4"),
    ("heads_not_divisor", _with("model.heads", 3), "model.heads: model.dim (32) must be divisible by model.heads (3)"),
    (
        "bad_choice",
        _with("pipeline.schedule", "1f1f"),
        "pipeline.schedule: '1f1f' is not one of 'gpipe', '1f1b' (did you mean '1f1b'?)",
    ),
    (
        "unknown_plugin",
        _with("dp.aggregator", "meen"),
        "dp.aggregator.name: unknown aggregators 'meen' (did you mean 'mean'?)",
    ),
    ("bool_for_int", _with("seed", True), "seed: expected an integer, got True"),
    ("nan_lr", _with("training.lr", float("nan")), "training.lr: must be a finite number"),
    (
        "missing_data_file",
        _with("data.source", "text") | {"data": {"source": "text", "path": "/no/such.txt"}},
        "data.path: file not found: '/no/such.txt'",
    ),
    ("section_not_mapping", _with("pipeline", [1, 2]), "pipeline: expected a mapping, got [1, 2]"),
    ("root_not_mapping", "- just\n- a list\n", "<root>: a scenario must be a mapping"),
    ("malformed_yaml", "model: {layers: 4\npipeline: [", "malformed YAML"),
    ("negative_fraction", _with("adversary.fraction", 1.5), "adversary.fraction: must be <= 1, got 1.5"),
]


@pytest.mark.parametrize("case,data,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_scenario_exits_2_with_a_located_one_line_message(tmp_path, capsys, case, data, expected):
    path = _write(tmp_path, data)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"error: {path}:")
    assert expected in err[0]
    assert "Traceback" not in err[0]


def test_missing_scenario_file(capsys):
    assert main(["validate", "/no/such/scenario.yaml"]) == 2
    assert "scenario file not found" in capsys.readouterr().err


def test_all_problems_are_reported_together(tmp_path, capsys):
    data = _with("training.steps", -1)
    data["model"]["dim"] = "wide"
    assert main(["validate", str(_write(tmp_path, data))]) == 2
    err = capsys.readouterr().err
    assert "training.steps: must be >= 1" in err and "model.dim: expected an integer" in err


@pytest.mark.parametrize(
    "override,expected",
    [
        ("training.steps", "expected KEY=VALUE"),
        ("training.steps=abc", "training.steps: expected an integer"),
        ("pipeline.stagse=2", "unknown key 'stagse' (did you mean 'stages'?)"),
        ("training.steps.x=1", "training.steps is 12, not a mapping"),
        ("training.lr=[1", "is not valid YAML"),
    ],
)
def test_bad_overrides(tmp_path, capsys, override, expected):
    assert main(["validate", str(_write(tmp_path, TINY)), "--set", override]) == 2
    assert expected in capsys.readouterr().err


def test_overrides_apply_with_validation(tmp_path):
    sc = scenario.load(_write(tmp_path, TINY), ["pipeline.stages=2", "training.lr=1e-3", "data.order=2"])
    assert sc.pipeline.stages == 2 and sc.training.lr == 1e-3 and sc.data.order == 2


def test_scientific_notation_and_int_for_float(tmp_path):
    sc = scenario.load(_write(tmp_path, "training: {lr: 3e-3, weight_decay: 0}\n"))
    assert sc.training.lr == 3e-3 and sc.training.weight_decay == 0.0


def test_round_trip_to_dict():
    sc = scenario.validate(TINY)
    assert scenario.validate(sc.to_dict()) == sc


def test_only_safe_yaml_is_loaded(tmp_path, capsys):
    evil = "!!python/object/apply:os.system ['echo pwned']\n"
    assert main(["validate", str(_write(tmp_path, evil))]) == 2
    assert "malformed YAML" in capsys.readouterr().err


# -- property: random mutations never produce a traceback ------------------------------------------
LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _paths(node, prefix=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_mutations_never_raise_anything_but_config_error(data):
    doc = copy.deepcopy(TINY)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = list(_paths(doc))
        path = data.draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = data.draw(LEAF)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(min_size=1, max_size=6))] = data.draw(LEAF)
        if not isinstance(doc, dict):
            break
    try:
        sc = scenario.validate(doc)
    except ConfigError as exc:
        assert exc.problems and all(":" in p for p in exc.problems)
    else:
        assert sc.training.steps >= 1 and math.isfinite(sc.training.lr)


def test_warnings_where_sentinels_replicas_are_not_exchangeable():
    """Diverging replicas (sparse averaging, no sync) turn SENTINEL's peer score test off; validation says so. Not for
    synchronous DP, async stragglers (the score test compares them with stragglers), or an open-loop run."""
    from pathlib import Path

    f = Path(__file__).resolve().parents[2] / "scenarios" / "compression" / "honest_codecs.yaml"

    def notes(*overrides):
        return preflight.warnings_for(scenario.load(f, list(overrides)))

    assert notes() == []
    assert len(n := notes("dp.sync=sparse_avg")) == 1 and "dp.sync: sparse_avg" in n[0] and "open_loop" in n[0]
    assert len(notes("dp.sync=none")) == 1
    lag = ("transport.network.stragglers=0.25", "transport.async.max_staleness=4")
    assert notes(*lag) == []
    assert notes("dp.sync=sparse_avg", *lag, "detector.mode=open_loop") == []


def test_lemma1_warning_for_random_placement():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "scenarios"
    notes = preflight.warnings_for(scenario.load(root / "paper" / "scaling_gradient.yaml"))
    assert len(notes) == 1 and "Lemma 1" in notes[0] and "probability 0.400" in notes[0]
    assert preflight.warnings_for(scenario.load(root / "quickstart.yaml")) == []
