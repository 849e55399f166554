"""What a person reads: headline metrics of a run with the reason an undefined one is undefined, and the
per-attack, per-role, per-boundary and per-worker tables of report.md, sweep.md and `sentinel report`.

An undefined value (precision with nothing flagged, steps to ban with nobody banned) is `null` in JSON
and `n/a: <why>` in every table, never 0 and never blank: 0 is a figure (a detector that flagged only
clean messages has precision 0), "nothing flagged" is the absence of one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def _get(d: Any, path: tuple[str, ...]) -> Any:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def why_undefined(metric: str, counts: dict | None) -> str:
    """The reason a confusion-derived ratio is null, from its counts (tp, fp, fn, tn)."""
    c = counts or {}
    tp, fp, fn, tn = (c.get(k, 0) or 0 for k in ("tp", "fp", "fn", "tn"))
    if tp + fp + fn + tn == 0:
        return "n/a: no verdicts (no detector)"
    if metric == "precision":
        return "n/a: nothing flagged"
    if metric == "recall":
        return "n/a: no tampered message"
    if metric == "fpr":
        return "n/a: no clean message"
    if metric == "f1":  # null when precision or recall is
        return why_undefined("recall" if tp + fn == 0 else "precision", c)
    return "n/a"


def _msg(metric: str) -> Callable[[dict], str]:
    return lambda s: why_undefined(metric, _get(s, ("detection", "messages")))


def _worker(metric: str) -> Callable[[dict], str]:
    def reason(s: dict) -> str:
        w = _get(s, ("detection", "workers")) or {}
        if metric == "recall" or (metric == "f1" and w.get("recall") is None):
            return "n/a: no malicious worker"
        if metric in ("precision", "f1"):
            return "n/a: no worker banned"
        return "n/a"

    return reason


def _ban(s: dict) -> str:
    w = _get(s, ("detection", "workers")) or {}
    return "n/a: no attacker banned" if w.get("attacking") else "n/a: no worker attacked"


def _twin(kind: str) -> Callable[[dict], str]:
    return lambda s: f"n/a: no {kind} twin"


def _recovered(s: dict) -> str:
    imp = s.get("impact") or {}
    if imp.get("clean_val_loss") is None or imp.get("undefended_val_loss") is None:
        return "n/a: needs the clean and undefended twins"
    return "n/a: no damage (undefended <= clean)"


def _damage(kind: str) -> Callable[[dict], float | None]:
    def value(s: dict) -> float | None:
        imp = s.get("impact") or {}
        a, clean = imp.get(f"{kind}_val_loss"), imp.get("clean_val_loss")
        return None if a is None or clean is None else a - clean

    return value


@dataclasses.dataclass(frozen=True)
class Metric:
    """A headline column: where it lives in summary.json, how it reads, and why it may be undefined."""

    name: str
    get: Callable[[dict], Any]
    label: str
    fmt: str = ".4g"
    bounds: tuple[float, float] | None = None  # the metric's range: intervals are clipped to it
    reason: Callable[[dict], str] = lambda s: "n/a"


def _path(*keys: str) -> Callable[[dict], Any]:
    return lambda s: _get(s, keys)


RATE = (0.0, 1.0)
HEADLINE: list[Metric] = [
    Metric("final_val_loss", _path("training", "final_val_loss"), "final val loss", ".4f"),
    Metric(
        "msg_precision", _path("detection", "messages", "precision"), "msg precision", ".3f", RATE, _msg("precision")
    ),
    Metric("msg_recall", _path("detection", "messages", "recall"), "msg recall", ".3f", RATE, _msg("recall")),
    Metric("msg_f1", _path("detection", "messages", "f1"), "msg F1", ".3f", RATE, _msg("f1")),
    Metric("msg_fpr", _path("detection", "messages", "fpr"), "msg FPR", ".4f", RATE, _msg("fpr")),
    Metric(
        "worker_precision",
        _path("detection", "workers", "precision"),
        "worker precision",
        ".3f",
        RATE,
        _worker("precision"),
    ),
    Metric("worker_recall", _path("detection", "workers", "recall"), "worker recall", ".3f", RATE, _worker("recall")),
    Metric("worker_f1", _path("detection", "workers", "f1"), "worker F1", ".3f", RATE, _worker("f1")),
    Metric("false_bans", _path("detection", "workers", "false_bans"), "false bans", ".3g", (0.0, float("inf"))),
    Metric(
        "steps_to_ban",
        _path("detection", "workers", "median_steps_to_ban"),
        "median steps to ban",
        ".3g",
        (0.0, float("inf")),
        _ban,
    ),
    Metric(
        "max_steps_to_ban",
        _path("detection", "workers", "max_steps_to_ban"),
        "max steps to ban",
        ".3g",
        (0.0, float("inf")),
        _ban,
    ),
    Metric("clean_val_loss", _path("impact", "clean_val_loss"), "clean val loss", ".4f", None, _twin("clean")),
    Metric(
        "undefended_val_loss",
        _path("impact", "undefended_val_loss"),
        "undefended val loss",
        ".4g",
        None,
        _twin("undefended"),
    ),
    Metric("damage_defended", _damage("defended"), "defended - clean", "+.4f", None, _twin("clean")),
    Metric(
        "damage_undefended",
        _damage("undefended"),
        "undefended - clean",
        "+.4f",
        None,
        lambda s: "n/a: needs the clean and undefended twins",
    ),
    Metric("recovered", _path("impact", "recovered_fraction"), "recovered", ".1%", None, _recovered),
    Metric("clean_fpr", _path("detection", "clean_twin", "fpr"), "clean-twin FPR", ".4f", RATE, _twin("clean")),
    Metric(
        "clean_false_bans",
        _path("detection", "clean_twin", "false_bans"),
        "clean-twin false bans",
        ".3g",
        (0.0, float("inf")),
        _twin("clean"),
    ),
    Metric("bytes_sent", _path("transport", "bytes_sent"), "bytes sent", ",.0f"),
    Metric(
        "sim_tokens_per_s",
        _path("transport", "sim_tokens_per_s"),
        "sim tokens/s",
        ",.0f",
        None,
        lambda s: "n/a: network model off",
    ),
]
BY_NAME = {m.name: m for m in HEADLINE}


def headline(summary: dict) -> dict[str, Any]:
    """{metric name: value or None} for every HEADLINE metric of one run."""
    return {m.name: m.get(summary) for m in HEADLINE}


def reasons(summary: dict) -> dict[str, str]:
    """{metric name: why it is undefined} for the HEADLINE metrics that are None in this run."""
    return {m.name: m.reason(summary) for m in HEADLINE if m.get(summary) is None}


def fmt(value: Any, spec: str = ".4g", reason: str = "n/a") -> str:
    """A table cell: the value, or the reason it is undefined."""
    if value is None:
        return reason
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    return format(value, spec)


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def _confusion_cells(c: dict) -> list[str]:
    return [
        fmt(c.get("precision"), ".3f", why_undefined("precision", c)),
        fmt(c.get("recall"), ".3f", why_undefined("recall", c)),
        fmt(c.get("f1"), ".3f", why_undefined("f1", c)),
        fmt(c.get("fpr"), ".4f", why_undefined("fpr", c)),
    ]


def _ban_cells(b: dict | None) -> list[str]:
    if not b or not b.get("attacking_workers"):
        return ["n/a: no worker attacked"] * 2 + ["0 of 0"]
    why = "n/a: none banned"
    return [
        fmt(b.get("median_steps_to_ban"), ".3g", why),
        fmt(b.get("max_steps_to_ban"), ".3g", why),
        f"{b['banned_workers']} of {b['attacking_workers']}",
    ]


GROUP_HEADER = ["precision", "recall", "F1", "FPR", "median steps to ban", "max steps to ban", "attackers banned"]


def group_tables(summary: dict) -> list[str]:
    """report.md: per attack, and per role / per boundary when there are several, plus the per-worker rows."""
    d = summary.get("detection") or {}
    m, w = d.get("messages") or {}, d.get("workers") or {}
    lines: list[str] = []
    for title, key, min_rows in (("attack", "per_attack", 1), ("role", "per_role", 2), ("boundary", "per_boundary", 2)):
        groups = m.get(key) or {}
        bans = w.get(key) or {}
        if len(groups) < min_rows:
            continue
        rows = [
            [str(name), *_confusion_cells(c), *_ban_cells(bans.get(name, bans.get(str(name))))]
            for name, c in groups.items()
        ]
        lines += [f"### Per {title}", "", *md_table([title, *GROUP_HEADER], rows), ""]
    if m.get("per_attack"):
        lines += [
            "Per attack: that attack's tampered messages against every clean message (its FPR is the "
            "run's clean FPR). Per role / boundary: messages of that role / crossing that boundary; "
            "steps to ban count from a worker's first tampered message in the group.",
            "",
        ]
    lines += worker_table(w.get("per_worker") or [])
    return lines


def worker_table(rows: list[dict], only_notable: bool = True) -> list[str]:
    """Per-worker rows: malicious or not, first flag, ban step, flags (honest workers never flagged summarised)."""
    if not rows:
        return []
    shown = [r for r in rows if not only_notable or r["malicious"] or r["flags"] or r["ban_step"] is not None]
    quiet = len(rows) - len(shown)
    body = [
        [
            r["worker"],
            "yes" if r["malicious"] else "no",
            ", ".join(r["attacks"]) or "-",
            f"{r['tampered']} of {r['sent']}",
            str(r["flags"]),
            fmt(r["first_tampered"], "d", "-"),
            fmt(r["first_flag"], "d", "never"),
            fmt(r["ban_step"], "d", "never"),
            r.get("ban_by") or "-",
        ]
        for r in shown
    ]
    header = [
        "worker",
        "malicious",
        "attacks",
        "tampered / sent",
        "flags",
        "first tampered step",
        "first flag",
        "ban step",
        "banned by",
    ]
    out = ["### Per worker", "", *md_table(header, body), ""]
    if quiet:
        out += [f"{quiet} other honest workers were never flagged or banned.", ""]
    return out


def group_rows(s: dict) -> list[dict]:
    """Per attack / role / boundary rows of one run (the message confusion beside the steps to ban)."""
    d = s.get("detection") or {}
    m, w = d.get("messages") or {}, d.get("workers") or {}
    rows = []
    for kind in ("attack", "role", "boundary"):
        bans = w.get(f"per_{kind}") or {}
        for name, c in (m.get(f"per_{kind}") or {}).items():
            b = bans.get(name, bans.get(str(name))) or {}
            rows.append(
                {
                    "group": kind,
                    "name": str(name),
                    **{k: c.get(k) for k in ("precision", "recall", "f1", "fpr")},
                    "median_steps_to_ban": b.get("median_steps_to_ban"),
                    "max_steps_to_ban": b.get("max_steps_to_ban"),
                    "tampered": (c.get("tp") or 0) + (c.get("fn") or 0),
                    "banned_workers": b.get("banned_workers", 0),
                    "attacking_workers": b.get("attacking_workers", 0),
                    **{k: c.get(k, 0) for k in ("tp", "fp", "fn", "tn")},
                }
            )
    return rows


def group_cells(g: dict) -> list[str]:
    """Table cells of one `group_rows` row: the name, precision ... FPR, steps to ban, attackers banned."""
    return [
        g["name"],
        *_confusion_cells(g),
        *_ban_cells(
            {k: g[k] for k in ("median_steps_to_ban", "max_steps_to_ban", "banned_workers", "attacking_workers")}
        ),
    ]
