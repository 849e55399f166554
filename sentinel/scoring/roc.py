"""Threshold evaluation from one run: ROC and precision-recall curves, AUROC, and a recommended threshold.

Positives are tampered messages, negatives clean ones; contaminated-downstream messages (honest
senders carrying upstream corruption) are left out, as in the message metrics, and so are messages the
verifier paused (later messages of a microbatch already flagged upstream: never judged, and in closed
loop dropped with their microbatch whatever they carry). The message metrics count a paused tampered
message as missed; the curves here describe the messages the detector judged. Everything here reads
ground truth, so it lives in the scorer.

Two views of a run's verdicts:

- **per statistic**: every continuous score the detector logged (`score_<name>` columns, markers such
  as `paused` or `integrity` excluded), over the messages where it is finite. Its AUROC says how well
  that statistic alone separates tampered from clean traffic, at any threshold; `auroc_within_streams`
  compares only messages of the same stream (boundary and direction), as a per-stream fence does.
- **the rule** (`rule`): the detector's own decision as a function of its threshold. A detector that
  declares `threshold_rule(config)` (SENTINEL: flag <=> `exceedance` > `k`) gets its logged statistic
  turned into a decision score: +inf for a message flagged whatever the threshold (NaN / Inf payloads,
  replays), -inf for one it did not judge (warm-up, paused downstream of a
  flag, honest-majority drift), the statistic otherwise; at the configured threshold this reproduces
  the run's flags exactly. The recommended threshold is the smallest that keeps the clean-message FPR
  at or below `scoring.target_fpr`.

Open loop versus closed loop: in `open_loop` mode nothing is dropped or banned, so one run sees every
message an attacker sends and the curve is the detector's, message by message. A closed-loop run at
the recommended threshold differs: bans remove attackers (and their later messages), dropped
microbatches change the training trajectory, and so the statistics themselves. The runner therefore
confirms the recommendation with a closed-loop run and reports its FPR beside the target. A detector
whose state depends on its threshold (flagged messages teach it nothing) is exact only where that
dependence vanishes: SENTINEL learns only below its inner fence `k_learn`, so its curve is exact for
every k >= k_learn; elsewhere (`exact_from: null`) the curve is exact at the configured threshold only.
"""

from __future__ import annotations

import numpy as np

from sentinel.eventlog import EventLog
from sentinel.scoring.metrics import checked_messages
from sentinel.transport.verdict import Marker

MARKERS = frozenset(m.value for m in Marker)  # flags, not statistics
ALWAYS = ("integrity", "replay")  # flagged whatever the threshold (no statistic: the payload is unusable)
NEVER = ("paused", "shift")  # not judged: never flagged whatever the threshold (k >= the exactness bound)
CURVE_POINTS = 200  # points kept per saved curve


def _ranked(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels, dense ranks of the scores, and the distinct scores (ascending).

    scikit-learn rejects infinite scores, and the decision scores use +-inf (flagged whatever the
    threshold / never judged). Every quantity here depends on the order of the scores only, so they are
    replaced by their dense ranks (equal scores keep equal ranks: ties stay ties) and thresholds are
    mapped back through the distinct values.
    """
    scores = np.concatenate([pos, neg]).astype(float)
    values, ranks = np.unique(scores, return_inverse=True)
    labels = np.concatenate([np.ones(len(pos), dtype=int), np.zeros(len(neg), dtype=int)])
    return labels, ranks.astype(float), values


def auroc(pos: np.ndarray, neg: np.ndarray) -> float | None:
    """P(score of a random positive > that of a random negative), ties counted 1/2 (Mann-Whitney U).

    `sklearn.metrics.roc_auc_score` on the dense ranks: the trapezoid under the full ROC curve, where a
    tie between positives and negatives is a diagonal segment (area 1/2 per tied pair).
    """
    if not len(pos) or not len(neg):
        return None
    labels, ranks, _ = _ranked(pos, neg)
    from sklearn.metrics import roc_auc_score  # here: only the rank that writes the report needs sklearn

    return float(roc_auc_score(labels, ranks))


def auroc_within(scores: np.ndarray, positive: np.ndarray, negative: np.ndarray, stream: np.ndarray) -> float | None:
    """P(a random tampered message scores above a random clean message *of the same stream*), ties 1/2: the pairs of
    every stream (a boundary and direction) that has both, pooled (each stream's Mann-Whitney U over the sum of its
    pairs). The pooled AUROC also compares messages across streams, whose statistics live on different scales: an
    attacked stream whose honest messages sit high anyway makes a statistic look separating where, within the stream,
    it is not (bias on activations under top-k 1%: `l1` 0.90 pooled, ~0.5 within the attacked streams)."""
    won = pairs = 0.0
    for key in np.unique(stream[positive | negative]):
        here = stream == key
        pos, neg = scores[positive & here], scores[negative & here]
        a = auroc(pos, neg)
        if a is not None:
            won += a * len(pos) * len(neg)
            pairs += len(pos) * len(neg)
    return float(won / pairs) if pairs else None


def curves(pos: np.ndarray, neg: np.ndarray) -> dict[str, np.ndarray]:
    """Operating points "flag <=> score >= t" for every distinct score t, highest first.

    `sklearn.metrics.roc_curve(drop_intermediate=False)` on the dense ranks (its leading "flag
    nothing" point is dropped). Returns thresholds, fpr, tpr, precision (NaN where nothing is flagged)
    and recall (= tpr).
    """
    if not len(pos) or not len(neg):  # one class: scikit-learn's rates are undefined; count directly
        values = np.unique(np.concatenate([pos, neg]))[::-1]
        tp = len(pos) - np.searchsorted(np.sort(pos), values, side="left")
        fp = len(neg) - np.searchsorted(np.sort(neg), values, side="left")
        tpr = tp / len(pos) if len(pos) else np.zeros(len(values))
        fpr = fp / len(neg) if len(neg) else np.zeros(len(values))
        precision = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1), np.nan)
        return {"thresholds": values, "fpr": fpr, "tpr": tpr, "precision": precision, "recall": tpr}
    labels, ranks, values = _ranked(pos, neg)
    from sklearn.metrics import roc_curve

    fpr, tpr, thr = roc_curve(labels, ranks, drop_intermediate=False)
    fpr, tpr, thr = fpr[1:], tpr[1:], thr[1:]  # the first point is "flag nothing" (threshold +inf)
    tp, fp = tpr * len(pos), fpr * len(neg)
    precision = tp / (tp + fp)  # >= 1 message flagged at every distinct score
    return {"thresholds": values[thr.astype(int)], "fpr": fpr, "tpr": tpr, "precision": precision, "recall": tpr}


def average_precision(pos: np.ndarray, neg: np.ndarray) -> float | None:
    """Area under the precision-recall step curve: sum over thresholds of (R_i - R_{i-1}) * P_i.

    `sklearn.metrics.average_precision_score` on the dense ranks (tied scores form one operating point).
    """
    if not len(pos):
        return None
    labels, ranks, _ = _ranked(pos, neg)
    from sklearn.metrics import average_precision_score

    return float(average_precision_score(labels, ranks))


def recommend(pos: np.ndarray, neg: np.ndarray, target_fpr: float, lowest: float | None = None) -> dict:
    """The smallest threshold k with FPR(flag <=> score > k) <= target_fpr, and its FPR and TPR.

    With m = floor(target_fpr * negatives), k is the (m + 1)-th largest negative score: at most m
    negatives lie strictly above it. `lowest` clamps k from below (where the curve stops being exact).
    None when no threshold meets the target (more than m negatives are flagged whatever it is).
    """
    out: dict = {"target_fpr": target_fpr, "threshold": None, "fpr": None, "tpr": None, "note": None}
    if not len(neg):
        out["note"] = "no clean messages: the false-positive rate is undefined"
        return out
    m = int(np.floor(target_fpr * len(neg)))
    desc = np.sort(neg)[::-1]
    k = float(desc[m]) if m < len(desc) else -np.inf
    if k == np.inf:
        out["note"] = f"more than {m} clean messages are flagged whatever the threshold (integrity / replay flags)"
        return out
    if lowest is not None and k < lowest:
        k = float(lowest)
        out["note"] = f"clamped to {lowest:g}, below which the open-loop run does not predict the verdicts"
    elif not np.isfinite(k):
        k = float(np.max(neg[np.isfinite(neg)])) if np.isfinite(neg).any() else 0.0
    out.update(threshold=k, fpr=float((neg > k).mean()), tpr=float((pos > k).mean()) if len(pos) else None)
    return out


def _downsample(c: dict[str, np.ndarray]) -> dict[str, list]:
    n = len(c["thresholds"])
    idx = np.unique(np.linspace(0, n - 1, min(n, CURVE_POINTS)).round().astype(int)) if n else np.array([], int)

    def plain(a):
        return [None if not np.isfinite(v) else float(v) for v in a[idx]]

    return {k: plain(v) for k, v in c.items()}


def rule_scores(c: dict[str, np.ndarray], v: dict[str, np.ndarray], rule: dict) -> np.ndarray:
    """The decision score of every checked message under the detector's threshold rule (see module doc)."""
    n = len(c["flagged"])
    stat = v.get(f"score_{rule['statistic']}", np.full(n, np.nan)).astype(float)
    flagged = c["flagged"]
    out = stat.copy()

    def marker(name):
        col = v.get(f"score_{name}")
        return np.zeros(n, dtype=bool) if col is None else np.nan_to_num(col.astype(float)) > 0

    never = c["step"] < int(rule.get("warmup_steps") or 0)
    for name in NEVER:
        never |= marker(name)
    always = np.zeros(n, dtype=bool)
    for name in ALWAYS:
        always |= marker(name)
    value = rule["value"]
    # consistency with the run: a flag the statistic does not explain was flagged whatever the threshold,
    # a message above the threshold that was not flagged was not judged (e.g. too little history yet)
    always |= flagged & ~(out > value)
    never |= ~flagged & ~(out <= value)
    out = np.where(never & ~always, -np.inf, out)
    return np.where(always, np.inf, out)


def _paused(v: dict[str, np.ndarray]) -> np.ndarray:
    col = v.get("score_paused")
    return np.zeros(len(v["flagged"]), dtype=bool) if col is None else np.nan_to_num(col.astype(float)) > 0


def roc_report(log: EventLog, rule: dict | None, target_fpr: float, mode: str, clean: EventLog | None = None) -> dict:
    """`detection.roc`: per statistic {auroc, average_precision, positives, negatives} and the rule's
    curve summary with the recommended threshold. Curves (downsampled) go under `curves` (kept out of
    summary.json by the caller).

    With a clean twin that ran the same detector (`clean`), the recommended threshold is set on the
    twin's honest traffic (`negatives_from: clean_twin`): in an attacked open-loop run nothing stops
    the attack, so a damaging one drags the whole model, and with it the honest senders' statistics,
    far from anything a defended run sees. The in-run curve and AUROC are reported either way.
    """
    if not len(log.verdicts):
        return {}
    c = checked_messages(log)
    v = log.verdicts.as_arrays()
    paused = _paused(v)
    keep = ~c["contaminated"] & ~paused
    pos_mask, neg_mask = keep & c["tampered"], keep & ~c["tampered"]
    stream = c["boundary"].astype(np.int64) * 4 + c["role"].astype(np.int64)  # one key per (boundary, direction)
    out: dict = {
        "mode": mode,
        "paused": {
            "tampered": int((paused & c["tampered"]).sum()),
            "clean": int((paused & ~c["tampered"] & ~c["contaminated"]).sum()),
        },
        "statistics": {},
        "curves": {},
    }
    for col in v:
        if not col.startswith("score_") or col[len("score_") :] in MARKERS:
            continue
        name, s = col[len("score_") :], v[col].astype(float)
        ok = ~np.isnan(s)
        pos, neg = s[pos_mask & ok], s[neg_mask & ok]
        out["statistics"][name] = {
            "auroc": auroc(pos, neg),
            "auroc_within_streams": auroc_within(s, pos_mask & ok, neg_mask & ok, stream),
            "average_precision": average_precision(pos, neg),
            "positives": int(len(pos)),
            "negatives": int(len(neg)),
        }
        if len(pos) and len(neg):
            out["curves"][name] = _downsample(curves(pos, neg))
    if rule is not None:
        s = rule_scores(c, v, rule)
        pos, neg = s[pos_mask], s[neg_mask]
        twin = None
        if clean is not None and len(clean.verdicts):
            cc = checked_messages(clean)
            cv = clean.verdicts.as_arrays()
            twin = rule_scores(cc, cv, rule)[~cc["tampered"] & ~cc["contaminated"] & ~_paused(cv)]
        rec = recommend(pos, neg if twin is None else twin, target_fpr, rule.get("exact_from"))
        rec["negatives_from"] = "this run" if twin is None else "clean_twin"
        out["rule"] = {
            "statistic": rule["statistic"],
            "threshold_key": rule["key"],
            "configured": rule["value"],
            "exact_from": rule.get("exact_from"),
            "auroc": auroc(pos, neg),
            "auroc_within_streams": auroc_within(s, pos_mask, neg_mask, stream),
            "average_precision": average_precision(pos, neg),
            "positives": int(len(pos)),
            "negatives": int(len(neg)),
            "recommended": rec,
        }
        if twin is not None:
            out["rule"]["auroc_vs_clean_twin"] = auroc(pos, twin)
            rec["fpr_this_run"] = (
                float((neg > rec["threshold"]).mean()) if rec["threshold"] is not None and len(neg) else None
            )
        if len(pos) and len(neg):
            out["curves"]["rule"] = _downsample(curves(pos, neg))
        if twin is not None and len(pos) and len(twin):  # the curve the recommendation lies on
            out["curves"]["rule_vs_clean_twin"] = _downsample(curves(pos, twin))
    return out
