"""Sweeps: a grid runs to one table, and a killed sweep resumes without recomputing finished points."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time

import yaml

from tests.conftest import TINY


def _scenario(tmp_path):
    data = dict(TINY, training=dict(TINY["training"], steps=6, eval_every=3))
    data["sweep"] = {"grid": {"training.lr": [0.001, 0.002, 0.004]}}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _sweep(path, out):
    return [sys.executable, "-m", "sentinel.cli", "sweep", str(path), "--out", str(out), "--jobs", "1"]


def test_sweep_resumes_after_being_killed(tmp_path):
    path, out = _scenario(tmp_path), tmp_path / "sweep"
    proc = subprocess.Popen(_sweep(path, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline and not list(out.glob("points/*/seed-*/summary.json")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    finished = list(out.glob("points/*/seed-*/summary.json"))
    assert 1 <= len(finished) < 3, "the sweep should have been killed mid-grid"
    stamps = {f: f.stat().st_mtime_ns for f in finished}
    done = subprocess.run(_sweep(path, out), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{len(finished)}/3 runs already finished; resuming" in done.stderr
    assert all(f.stat().st_mtime_ns == t for f, t in stamps.items())  # not recomputed
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert sorted(float(r["training.lr"]) for r in rows) == [0.001, 0.002, 0.004]
    assert all(float(r["final_val_loss"]) > 0 for r in rows)
    assert (out / "sweep.md").is_file() and (out / "sweep_final_val_loss.png").is_file()


def test_bad_grid_is_rejected_before_anything_runs(tmp_path, capsys):
    from sentinel.cli import main

    data = dict(TINY, sweep={"grid": {"training.lr": [0.001, -1.0]}})
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    assert main(["sweep", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "training.lr: must be > 0, got -1.0" in capsys.readouterr().err
    assert not (tmp_path / "o" / "points").exists()


def test_a_sweep_over_attacks_shares_one_clean_twin_and_prints_the_notes(tmp_path):
    from sentinel.sweep import run_sweep

    data = dict(TINY, training=dict(TINY["training"], steps=6, eval_every=3))
    data["pipeline"] = dict(TINY["pipeline"], replicas=3)
    data["detector"] = {"name": "sentinel", "warmup_steps": 2, "min_history": 4}
    data["scoring"] = {"twins": ["clean", "undefended"]}
    data["adversary"] = {
        "fraction": 0.34,
        "protect": ["first", "last"],
        "attacks": [{"name": "constant", "role": "activation", "start": 3}],
    }
    data["sweep"] = {
        "grid": {
            "adversary.attacks": [
                [{"name": "constant", "role": "activation", "start": 3}],
                [{"name": "scaling", "role": "gradient", "start": 3, "alpha": -1.0}],
            ]
        },
        "notes": {"constant/activation": "F1 100%"},
    }
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    rows = run_sweep(p, tmp_path / "out", jobs=1)
    assert [r["adversary.attacks"] for r in rows] == ["constant/activation", "scaling/gradient"]
    summary = list(csv.DictReader(open(tmp_path / "out" / "sweep_summary.csv")))
    assert [r["notes"] for r in summary] == ["F1 100%", ""]
    assert len(list((tmp_path / "out" / "twins").glob("clean-*/events.npz"))) == 1  # trained once, shared
    assert len(list((tmp_path / "out" / "twins").glob("undefended-*/events.npz"))) == 2
    assert rows[0]["clean_val_loss"] == rows[1]["clean_val_loss"] and rows[0]["clean_fpr"] is not None
    assert rows[0]["undefended_val_loss"] != rows[1]["undefended_val_loss"]
    assert " notes |" in [line for line in (tmp_path / "out" / "sweep.md").read_text().splitlines() if "|" in line][0]
    assert (tmp_path / "out" / "sweep_detection.png").is_file() and (tmp_path / "out" / "sweep_loss.png").is_file()
    report = (tmp_path / "out" / "report.md").read_text()
    assert "![sweep_loss](sweep_loss.png)" in report and "constant/activation" in report and "```yaml" in report


def test_row_labels_keep_the_parameters_that_vary_in_the_grid():
    from sentinel.sweep import row_labels

    points = [{"transport.codec": {"name": "random_mask", "keep": q}, "detector.k": 4} for q in (0.1, 0.05)]
    points.append({"transport.codec": {"name": "int8"}, "detector.k": 4})
    assert [r["transport.codec"] for r in row_labels(points)] == [
        "random_mask(keep=0.1)",
        "random_mask(keep=0.05)",
        "int8",
    ]
    assert [r["detector.k"] for r in row_labels(points)] == [4, 4, 4]
    attacks = [{"adversary.attacks": [{"name": "scaling", "role": "gradient", "alpha": a}]} for a in (-1.0, -2.0)]
    attacks.append({"adversary.attacks": [{"name": "bias", "role": "gradient", "b": 1.0}]})
    attacks.append({"adversary.attacks": []})
    assert [r["adversary.attacks"] for r in row_labels(attacks)] == [
        "scaling/gradient(alpha=-1.0)",
        "scaling/gradient(alpha=-2.0)",
        "bias/gradient",
        "none",
    ]


def test_points_that_differ_past_the_folder_name_limit_get_their_own_folders(tmp_path):
    """Folder names are cut at SLUG_MAX characters: two `pipeline` sections that differ only in `stages` (sorted last),
    after a long `data` section, once shared a folder, and the second point resumed the first one's runs (its table rows were
    copies). A long name ends with a hash of the whole point; a short one is unchanged (resume finds old sweeps)."""
    from sentinel.sweep.plan import SLUG_MAX, point_dir, slug

    data = {"source": "text", "path": "/tmp/some/long/corpus/path/corpus_copyright.txt", "tokenizer": "bpe"}
    model = {"layers": 12, "dim": 96, "heads": 4, "seq_len": 64}
    points = [
        {"data": data, "model": model, "pipeline": {"stages": s, "replicas": 3, "microbatches": 4, "schedule": "1f1b"}}
        for s in (4, 6)
    ]
    names = [slug(p) for p in points]
    assert names[0] != names[1] and all(len(n) <= SLUG_MAX for n in names)
    assert names[0][:100] == names[1][:100]  # the same readable prefix
    assert slug(points[0]) == names[0]  # stable: a resumed sweep finds its folder again
    assert point_dir(tmp_path, points[0]) != point_dir(tmp_path, points[1])
    assert slug({"detector.k": 4}) == "detector.k=4"
