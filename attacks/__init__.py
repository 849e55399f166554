"""Adversaries: one small module per attack family, registered in `sentinel.registry.ATTACKS`."""

from sentinel.registry import ATTACKS

__all__ = ["ATTACKS"]


def build_adversary(scenario, engine):
    """The adversary layer for this scenario, or None when it configures no attack."""
    if not scenario.adversary.attacks:
        return None
    from attacks.layer import AdversaryLayer

    return AdversaryLayer(scenario, engine.workers, engine.log)
