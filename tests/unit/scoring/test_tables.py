"""Tables a person reads: undefined values say why, and never look like 0."""

from __future__ import annotations

import json

from sentinel.scoring.report import combined_table, write_combined_csv
from sentinel.scoring.tables import fmt, group_tables, headline, reasons, why_undefined


def _summary(flagged: bool) -> dict:
    tp, fp = (3, 0) if flagged else (0, 0)
    msgs = {
        "tp": tp,
        "fp": fp,
        "fn": 3 - tp,
        "tn": 10,
        "precision": 1.0 if flagged else None,
        "recall": tp / 3,
        "f1": 1.0 if flagged else None,
        "fpr": 0.0,
        "per_attack": {
            "bias": {
                "tp": tp,
                "fp": fp,
                "fn": 3 - tp,
                "tn": 10,
                "precision": 1.0 if flagged else None,
                "recall": tp / 3,
                "f1": 1.0 if flagged else None,
                "fpr": 0.0,
            }
        },
    }
    workers = {
        "precision": None,
        "recall": 0.0,
        "f1": None,
        "banned": [],
        "false_bans": 0,
        "median_steps_to_ban": None,
        "max_steps_to_ban": None,
        "attacking": ["s1r0"],
        "per_attack": {
            "bias": {
                "attacking_workers": 1,
                "banned_workers": 0,
                "median_steps_to_ban": None,
                "max_steps_to_ban": None,
                "never_banned": ["s1r0"],
            }
        },
        "per_worker": [
            {
                "worker": "s1r0",
                "malicious": True,
                "attacks": ["bias"],
                "sent": 9,
                "tampered": 3,
                "first_tampered": 4,
                "flags": tp,
                "first_flag": 4 if flagged else None,
                "ban_step": None,
            }
        ],
    }
    return {
        "scenario": "x",
        "seed": 0,
        "training": {"final_val_loss": 2.0},
        "detection": {"messages": msgs, "workers": workers},
        "impact": {"clean_val_loss": None},
    }


def test_undefined_values_say_why_and_zero_stays_a_figure():
    s = _summary(flagged=False)
    h, why = headline(s), reasons(s)
    assert h["msg_recall"] == 0.0 and fmt(h["msg_recall"], ".3f") == "0.000"
    assert h["msg_precision"] is None and why["msg_precision"] == "n/a: nothing flagged"
    assert why["msg_f1"] == "n/a: nothing flagged" and why["steps_to_ban"] == "n/a: no attacker banned"
    assert why["clean_fpr"] == "n/a: no clean twin" and why["worker_f1"] == "n/a: no worker banned"
    assert why_undefined("f1", {"tp": 0, "fn": 0, "tn": 5}) == "n/a: no tampered message"
    assert why_undefined("fpr", {}) == "n/a: no verdicts (no detector)"
    text = "\n".join(group_tables(s))
    assert "| bias | n/a: nothing flagged | 0.000 | n/a: nothing flagged | 0.0000 | n/a: none banned |" in text
    assert "| s1r0 | yes | bias | 3 of 9 | 0 | 4 | never | never |" in text


def test_combined_table_and_csv_keep_undefined_apart_from_zero(tmp_path):
    import csv

    dirs = []
    for i, flagged in enumerate((True, False)):
        d = tmp_path / f"r{i}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps(_summary(flagged)))
        dirs.append(d)
    table = combined_table(dirs)
    assert "| 1.000 | 1.000 |" in table and "n/a: nothing flagged" in table
    write_combined_csv(dirs, tmp_path / "all.csv")
    rows = list(csv.DictReader(open(tmp_path / "all.csv")))
    assert [r["msg_precision"] for r in rows] == ["1.0", ""] and [r["msg_recall"] for r in rows] == ["1.0", "0.0"]
    assert rows[0]["run"] == str(dirs[0]) and rows[0]["seed"] == "0"
