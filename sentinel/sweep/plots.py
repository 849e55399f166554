"""Sweep figures: means over seeds with 95% interval error bars (none with one seed).

A grid with a numeric key: one figure per metric against it (one line per combination of the other
keys). A grid without one (e.g. one row per attack): grouped bars of detection and of loss.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sentinel.scoring.stats import Estimate


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _yerr(ests: list[Estimate]) -> np.ndarray | None:
    """Asymmetric error bars [mean - low, high - mean] (zero where the interval is undefined)."""
    if not any(e.low is not None for e in ests):
        return None
    low = [0.0 if e.low is None or e.mean is None else e.mean - e.low for e in ests]
    high = [0.0 if e.high is None or e.mean is None else e.high - e.mean for e in ests]
    return np.array([low, high])


def _mean(e: Estimate) -> float:
    return np.nan if e.mean is None else e.mean


def plot_sweep(out_dir: Path, points: list[dict], keys: list[str], seeds: int) -> list[str]:
    """Write sweep_<metric>.png (numeric grid key) or sweep_detection.png / sweep_loss.png; return the names."""
    if not points:
        return []
    numeric = [
        k
        for k in keys
        if all(isinstance(p["labels"][k], (int, float)) and not isinstance(p["labels"][k], bool) for p in points)
    ]
    note = f"mean over {seeds} seeds, 95% CI" if seeds > 1 else "one seed (no interval)"
    if not numeric:
        return plot_categorical(out_dir, points, keys, note)
    plt = _plt()
    x_key, others, names = numeric[0], [k for k in keys if k != numeric[0]], []
    for metric in ("msg_f1", "msg_fpr", "worker_f1", "final_val_loss"):
        if all(p["est"][metric].mean is None for p in points):
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        groups: dict[str, list[dict]] = {}
        for p in points:
            groups.setdefault(", ".join(f"{k}={p['labels'][k]}" for k in others) or metric, []).append(p)
        for name, ps in groups.items():
            ps = sorted((p for p in ps if p["est"][metric].mean is not None), key=lambda p: p["labels"][x_key])
            ests = [p["est"][metric] for p in ps]
            ax.errorbar(
                [p["labels"][x_key] for p in ps],
                [_mean(e) for e in ests],
                yerr=_yerr(ests),
                fmt="o-",
                capsize=3,
                label=name,
            )
        ax.set_xlabel(x_key)
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} vs {x_key} ({note})", fontsize=9)
        ax.grid(alpha=0.3)
        if len(groups) > 1:
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / f"sweep_{metric}.png", dpi=110)
        plt.close(fig)
        names.append(f"sweep_{metric}.png")
    return names


def plot_categorical(out_dir: Path, points: list[dict], keys: list[str], note: str) -> list[str]:
    """Grouped bars with error bars: detection rates, and final losses of the clean twin, defended, undefended."""
    plt = _plt()
    labels = [" ".join(str(p["labels"][k]) for k in keys) or "all seeds" for p in points]
    x = np.arange(len(points))
    panels = (
        (
            "sweep_detection.png",
            "detection",
            "F1 / rate",
            (("worker_f1", "worker F1"), ("msg_f1", "message F1"), ("clean_fpr", "clean-twin message FPR")),
        ),
        (
            "sweep_loss.png",
            "final validation loss",
            "cross-entropy (nats / token)",
            (("clean_val_loss", "clean twin"), ("final_val_loss", "defended"), ("undefended_val_loss", "undefended")),
        ),
        (  # paired by seed: the seeds' common spread (visible in sweep_loss.png) cancels
            "sweep_damage.png",
            "damage: final validation loss minus the clean twin's, paired by seed",
            "loss - clean twin's (nats / token)",
            (("damage_defended", "defended - clean"), ("damage_undefended", "undefended - clean")),
        ),
    )
    names = []
    for fname, title, ylabel, series in panels:
        series = [(m, lab) for m, lab in series if any(p["est"][m].mean is not None for p in points)]
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(points) + 2), 4.2))
        width = 0.8 / len(series)
        low = np.inf
        for i, (metric, lab) in enumerate(series):
            ests = [p["est"][metric] for p in points]
            vals = [_mean(e) for e in ests]
            low = min(low, np.nanmin([e.low if e.low is not None else _mean(e) for e in ests]))
            ax.bar(x + (i - (len(series) - 1) / 2) * width, vals, width, yerr=_yerr(ests), capsize=2, label=lab)
        if fname == "sweep_damage.png":  # damages span 0.001 to 1: linear near 0, logarithmic beyond 0.01
            ax.set_yscale("symlog", linthresh=0.01)
            ax.axhline(0.0, color="k", lw=0.6)
        if fname == "sweep_loss.png" and np.isfinite(low):
            ax.set_ylim(bottom=0.9 * low)  # losses differ by tenths: start the axis near them
        ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}{' per ' + ', '.join(keys) if keys else ''} ({note})", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)
        names.append(fname)
    return names
