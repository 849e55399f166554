"""Plots of a run (PNG via matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sentinel.eventlog import EventLog
from sentinel.scoring.metrics import checked_messages


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _train_curve(log: EventLog) -> tuple[np.ndarray, np.ndarray]:
    steps, losses = log.losses["step"], log.losses["loss"]
    if not len(steps):
        return np.array([]), np.array([])
    uniq = np.unique(steps)
    return uniq + 1, np.array([losses[steps == s].mean() for s in uniq])


def loss_curves(
    log: EventLog, path: Path, title: str, optimum: float | None = None, twins: dict[str, EventLog] | None = None
) -> None:
    """Validation (and training) loss of the run and its twins, attack onset and bans marked."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    x, y = _train_curve(log)
    ax.plot(x, y, lw=0.7, alpha=0.4, color="C0", label="training loss (this run)")
    ax.plot(log.evals["step"], log.evals["val_loss"], "o-", color="C0", label="validation loss (this run)")
    for i, (name, tlog) in enumerate((twins or {}).items(), start=1):
        ax.plot(
            tlog.evals["step"], tlog.evals["val_loss"], "s--", color=f"C{i}", label=f"validation loss ({name} twin)"
        )
    if len(log.ground_truth):
        onset = int(log.ground_truth["step"].min())
        ax.axvline(onset, color="red", lw=1, ls=":", label=f"attack onset (step {onset})")
    for j, step in enumerate(log.bans["step"]):
        ax.axvline(int(step) + 1, color="purple", lw=0.8, alpha=0.6, label="ban" if j == 0 else None)
    if optimum is not None:
        ax.axhline(optimum, ls="--", c="k", lw=0.8, label=f"optimum (entropy rate) {optimum:.3f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def detection_plots(log: EventLog, out_dir: Path, thresholds: dict[str, float] | None = None) -> list[str]:
    """Score timelines (tampered vs clean, with the rule's threshold and fences when logged) and the
    steps-to-ban histogram."""
    out: list[str] = []
    if not len(log.verdicts):
        return out
    plt = _plt()
    c = checked_messages(log)
    v = log.verdicts.as_arrays()
    stats = [k[len("score_") :] for k in v if k.startswith("score_")]
    if stats:
        fig, axes = plt.subplots(len(stats), 1, figsize=(7.5, 2.2 * len(stats)), sharex=True, squeeze=False)
        for ax, name in zip(axes[:, 0], stats):
            score = v[f"score_{name}"]
            for mask, color, label in (
                (~c["tampered"] & ~c["contaminated"], "C0", "clean"),
                (c["contaminated"], "C2", "contaminated downstream"),
                (c["tampered"], "C3", "tampered"),
            ):
                if mask.any():
                    ax.scatter(c["step"][mask], score[mask], s=3, alpha=0.5, color=color, label=label)
            if name in (thresholds or {}):
                ax.axhline(thresholds[name], color="r", lw=0.8, ls="--", label=f"flag above {thresholds[name]:g}")
                ax.legend(fontsize=6, loc="upper left")
            if f"fence_{name}" in v:
                order = np.argsort(c["step"], kind="stable")
                ax.plot(c["step"][order], v[f"fence_{name}"][order], lw=0.6, color="k", alpha=0.5, label="fence")
            ax.set_ylabel(name, fontsize=8)
            ax.set_yscale("symlog", linthresh=1e-3)
            ax.grid(alpha=0.3)
        axes[0, 0].legend(fontsize=7, markerscale=3)
        axes[-1, 0].set_xlabel("optimizer step")
        fig.suptitle("detector statistics per message")
        fig.tight_layout()
        fig.savefig(out_dir / "scores.png", dpi=110)
        plt.close(fig)
        out.append("scores.png")
    delays = []
    for w, step in zip(log.bans["worker"], log.bans["step"]):
        first = log.ground_truth["step"][log.ground_truth["worker"] == w]
        if len(first):
            delays.append(int(step) - int(first.min()))
    if delays:
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.hist(delays, bins=range(0, max(delays) + 2), color="C4")
        ax.set_xlabel("steps from first tampered message to ban")
        ax.set_ylabel("malicious workers")
        ax.set_title("detection delay")
        fig.tight_layout()
        fig.savefig(out_dir / "detection_delay.png", dpi=110)
        plt.close(fig)
        out.append("detection_delay.png")
    return out


def roc_plots(roc: dict, curves: dict, out_dir: Path) -> list[str]:
    """ROC and precision-recall curves per statistic (and the detector's rule), AUROC in the legend.

    Every curve says on which honest traffic its false-positive rate is measured: the per-statistic
    curves and the solid rule curve on this run's clean messages; when the clean twin ran, a dashed
    rule curve on the twin's honest messages, where the recommended threshold was set (its star lies
    on that curve, not on the solid one).
    """
    if not curves:
        return []
    plt = _plt()
    fig, (ax_roc, ax_pr) = plt.subplots(1, 2, figsize=(10, 4.4))
    stats = roc.get("statistics", {})
    rule = roc.get("rule") or {}
    order = sorted(curves.items(), key=lambda kv: (kv[0] != "rule", kv[0] != "rule_vs_clean_twin"))
    for i, (name, c) in enumerate(order):
        info = rule if name.startswith("rule") else stats.get(name, {})
        if name == "rule":
            label, style = f"rule ({rule['statistic']}), FPR on this run's clean messages", {"lw": 2.2, "color": "k"}
        elif name == "rule_vs_clean_twin":
            label, style = f"rule ({rule['statistic']}), FPR on the clean twin", {"lw": 1.8, "color": "r", "ls": "--"}
            info = {"auroc": rule.get("auroc_vs_clean_twin")}
        else:
            label, style = name, {"lw": 1.0, "color": f"C{i}"}
        fpr = [0.0, *[v if v is not None else 0.0 for v in c["fpr"]], 1.0]
        tpr = [0.0, *[v if v is not None else 0.0 for v in c["tpr"]], 1.0]
        auc = info.get("auroc")
        ax_roc.plot(fpr, tpr, label=f"{label} (AUROC {auc:.3f})" if auc is not None else label, **style)
        if name == "rule_vs_clean_twin":
            continue  # precision needs this run's own mix of tampered and clean messages
        rec = [r for r, p in zip(c["recall"], c["precision"]) if p is not None and r is not None]
        prec = [p for r, p in zip(c["recall"], c["precision"]) if p is not None and r is not None]
        ap = info.get("average_precision")
        ax_pr.plot(rec, prec, label=f"{label} (AP {ap:.3f})" if ap is not None else label, **style)
    rec = rule.get("recommended", {})
    if rec.get("fpr") is not None and rec.get("tpr") is not None:
        where = "clean twin" if rec.get("negatives_from") == "clean_twin" else "this run's clean messages"
        ax_roc.plot(
            [rec["fpr"]],
            [rec["tpr"]],
            "r*",
            ms=12,
            label=f"recommended {rule['threshold_key']} = {rec['threshold']:.3g} (FPR on the {where})",
        )
        ax_roc.axvline(rec["target_fpr"], color="r", ls=":", lw=0.8, label=f"target FPR {rec['target_fpr']:g}")
    ax_roc.plot([0, 1], [0, 1], ls="--", color="grey", lw=0.6)
    ax_roc.set_xscale("symlog", linthresh=1e-3)
    honest = "this run's clean messages" + (" (dashed: the clean twin's)" if "rule_vs_clean_twin" in curves else "")
    ax_roc.set_xlabel(f"false-positive rate on {honest}; log scale", fontsize=8)
    ax_roc.set_ylabel("true-positive rate (tampered messages flagged)")
    ax_roc.set_title(f"ROC ({roc.get('mode', '')} run)")
    ax_pr.set_xlabel("recall")
    ax_pr.set_ylabel("precision (this run's messages)")
    ax_pr.set_title("precision-recall")
    for ax in (ax_roc, ax_pr):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out_dir / "roc.png", dpi=110)
    plt.close(fig)
    return ["roc.png"]
