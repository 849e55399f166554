"""Malformed adversary sections fail validation with located messages (never a traceback)."""

from __future__ import annotations

import copy

import pytest

from sentinel import cli, scenario
from sentinel.errors import ConfigError

BASE = {
    "model": {"layers": 4, "dim": 16, "heads": 2, "seq_len": 8},
    "pipeline": {"stages": 4, "replicas": 3},
    "training": {"steps": 20, "warmup_steps": 1},
    "adversary": {"fraction": 0.34, "attacks": [{"name": "scaling", "role": "activation"}]},
}


def _problems(**adversary) -> list[str]:
    data = copy.deepcopy(BASE)
    data["adversary"].update(adversary)
    with pytest.raises(ConfigError) as exc:
        scenario.validate(data)
    return exc.value.problems


def _one(problems: list[str], path: str, *words: str) -> None:
    hits = [p for p in problems if p.startswith(path + ":")]
    assert hits, f"no problem located at {path}: {problems}"
    assert all(w in hits[0] for w in words), hits[0]


def test_valid_base_passes():
    sc = scenario.validate(BASE)
    assert sc.adversary.attacks[0].name == "scaling"


def test_unknown_attack_with_did_you_mean():
    _one(
        _problems(attacks=[{"name": "scalng"}]),
        "adversary.attacks[0].name",
        "unknown attacks 'scalng'",
        "did you mean 'scaling'",
    )


def test_unknown_parameter_with_did_you_mean():
    _one(
        _problems(attacks=[{"name": "scaling", "alpah": 2}]),
        "adversary.attacks[0].alpah",
        "unknown key 'alpah'",
        "did you mean 'alpha'",
    )


def test_negative_probability():
    _one(_problems(attacks=[{"name": "bias", "prob": -0.1}]), "adversary.attacks[0].prob", ">= 0", "-0.1")


def test_parameter_out_of_range():
    _one(_problems(attacks=[{"name": "random_sign", "p": 1.5}]), "adversary.attacks[0].p", "<= 1")


def test_unsupported_role():
    _one(
        _problems(attacks=[{"name": "scaling"}, {"name": "replay_other", "role": "dp_gradient"}]),
        "adversary.attacks[1].role",
        "replay_other",
        "does not support role 'dp_gradient'",
        "activation, gradient",
    )


def test_fraction_above_one():
    _one(_problems(fraction=1.5), "adversary.fraction", "<= 1")


def test_dishonest_majority_is_an_error_unless_allowed():
    _one(_problems(fraction=0.5), "adversary.fraction", "no honest majority", "allow_dishonest_majority")
    data = copy.deepcopy(BASE)
    data["adversary"].update(fraction=0.5, allow_dishonest_majority=True)
    sc = scenario.validate(data)
    assert sc.adversary.allow_dishonest_majority


def test_fraction_that_rounds_to_no_attacker():
    _one(_problems(fraction=0.1), "adversary.fraction", "no worker is malicious")


def test_explicit_workers_must_exist_and_not_be_protected():
    problems = _problems(fraction=0.0, placement="explicit", workers=["s9r0", "s1r7", "x1", "s0r0", "s1r0", "s1r0"])
    _one(problems, "adversary.workers[0]", "'s9r0' does not exist", "stages 0..3")
    _one(problems, "adversary.workers[1]", "replicas 0..2")
    _one(problems, "adversary.workers[2]", "not a worker id")
    _one(problems, "adversary.workers[3]", "first stage", "protect")
    _one(problems, "adversary.workers[5]", "listed twice")


def test_explicit_honest_majority_per_stage():
    _one(
        _problems(fraction=0.0, placement="explicit", workers=["s1r0", "s1r1"]),
        "adversary.workers",
        "stage 1 has 2 malicious of 3",
    )


def test_fields_of_the_other_placement_are_rejected():
    _one(_problems(workers=["s1r0"]), "adversary.workers", "only used with placement: explicit")
    _one(_problems(placement="explicit", workers=["s1r0"]), "adversary.fraction", "only used with placement: random")


def test_attack_workers_must_be_malicious():
    _one(
        _problems(
            fraction=0.0, placement="explicit", workers=["s1r0"], attacks=[{"name": "bias", "workers": ["s2r0"]}]
        ),
        "adversary.attacks[0].workers[0]",
        "'s2r0' is not a malicious worker",
    )


def test_target_corruption_needs_the_last_stage_unprotected():
    _one(
        _problems(attacks=[{"name": "target_corruption", "role": "gradient"}]),
        "adversary.protect",
        "target_corruption",
        "remove 'last'",
    )
    data = copy.deepcopy(BASE)
    data["adversary"] = {
        "fraction": 0.34,
        "protect": ["first"],
        "attacks": [{"name": "target_corruption", "role": "gradient"}],
    }
    assert scenario.validate(data).adversary.protect == ("first",)


def test_schedule_that_never_acts():
    problems = _problems(
        attacks=[
            {"name": "bias", "start": 10, "stop": 5},
            {"name": "bias", "every": 2, "duty": 3},
            {"name": "bias", "start": 500},
        ]
    )
    _one(problems, "adversary.attacks[0].stop", "must be > start")
    _one(problems, "adversary.attacks[1].duty", "<= every")
    _one(problems, "adversary.attacks[2].start", "never acts")


def test_wrapped_attack_parameters_are_located():
    problems = _problems(
        attacks=[
            {"name": "intermittent", "attack": "scaling", "params": {"alpah": 2}},
            {"name": "sparse", "attack": "scalin"},
            {"name": "sparse", "attack": "replay_other", "role": "dp_gradient"},
        ]
    )
    _one(problems, "adversary.attacks[0].params.alpah", "did you mean 'alpha'")
    _one(problems, "adversary.attacks[1].attack", "did you mean 'scaling'")
    _one(problems, "adversary.attacks[2].role", "replay_other")


def test_dp_role_needs_dp_sync_and_pre_codec():
    problems = _problems(attacks=[{"name": "bias", "role": "dp_gradient", "placement": "post_codec"}])
    _one(problems, "adversary.attacks[0].placement", "no codec")


def test_cli_validate_reports_located_errors(tmp_path, capsys):
    import yaml

    data = copy.deepcopy(BASE)
    data["adversary"]["attacks"] = [{"name": "scaling"}, {"name": "replay_other", "role": "dp_gradient"}]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "adversary.attacks[1].role" in err and "Traceback" not in err
