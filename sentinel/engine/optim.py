"""Per-replica optimizers and the learning-rate schedule."""

from __future__ import annotations

import math

import torch

from sentinel.scenario import TrainingConfig


def make_optimizer(params, cfg: TrainingConfig) -> torch.optim.Optimizer:
    params = list(params)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=False)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, foreach=False)


def lr_at(step: int, cfg: TrainingConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to 10% (or constant)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
