"""Plots of a run (PNG, matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sentinel.eventlog import EventLog


def loss_curves(log: EventLog, path: Path, title: str, optimum: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps, losses = log.losses["step"], log.losses["loss"]
    if len(steps):
        uniq = np.unique(steps)
        mean = np.array([losses[steps == s].mean() for s in uniq])
        ax.plot(uniq + 1, mean, lw=0.8, alpha=0.6, label="training loss (mean over microbatches)")
    ax.plot(log.evals["step"], log.evals["val_loss"], "o-", label="validation loss")
    if optimum is not None:
        ax.axhline(optimum, ls="--", c="k", lw=0.8, label=f"optimum (entropy rate) {optimum:.3f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
