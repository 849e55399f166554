"""Adversaries: one small module per attack family, registered in `sentinel.registry.ATTACKS`.

    base.py           Attack interface, AttackContext (seeded generators), helpers
    basic.py          the paper's value attacks: constant, random, scaling, random_sign, bias, invisible_noise
    replay.py         delay, replay_other (per-worker bounded buffers)
    byzantine.py      alie, ipm (Byzantine-ML attacks adapted to PP)
    targets.py        target_corruption (a malicious last stage's loss)
    adaptive.py       fence_evasion, slow_drift, warmup_poisoning
    gating.py         intermittent, sparse (wrap any other attack)
    collusion.py      same_direction, undo_pair
    tokens.py         token_permute, batch_permute, sequence_swap, microbatch_exchange, few_tokens, token_copy, token_fade (token-level:
                      the multiset of token vectors kept, or a few tokens changed)
    assignment.py     who is malicious (seeded); schedule.py  when an attack acts
    layer.py          AdversaryLayer: the transport Interceptor; validation.py  scenario cross-checks
    detector_view.py  the read-only DetectorView a white-box attack may use; wire.py  post-codec fields
    post_codec.py     wire-format attacks: topk_index, mask_seed, quant_scale, subspace_coeff

Write your own: subclass `Attack`, give it a frozen `Config`, implement `apply`, decorate with
`@register_attack("name")` (see attacks/README_SECTION.md).
"""

from attacks import (  # noqa: F401  (registers)
    adaptive,
    basic,
    byzantine,
    collusion,
    gating,
    post_codec,
    replay,
    targets,
    tokens,
    validation,  # noqa: F401  (registers the adversary section's scenario checks)
)
from attacks.base import Attack, AttackContext
from attacks.detector_view import DetectorView, ReferenceView
from attacks.layer import AdversaryLayer
from sentinel.registry import ATTACKS

register_attack = ATTACKS.register

__all__ = ["ATTACKS", "Attack", "AttackContext", "DetectorView", "ReferenceView", "build_adversary", "register_attack"]


def build_adversary(scenario, engine):
    """The adversary layer for this scenario, or None when it configures no attack."""
    if not scenario.adversary.attacks:
        return None
    return AdversaryLayer(scenario, engine.workers, engine.log)
