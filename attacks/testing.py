"""A synthetic message stream for testing attacks without training a model (used by the conformance
suite; third-party attack authors can run the same checks on their own attacks).

`drive(layer, scenario, steps)` sends, for every step and microbatch, the messages the sim engine
would send -- activations forward over every boundary, the last stage's target corruption hook, the
gradients backward, then every replica's DP-sync contribution -- through the real transport halves
(`Sender`, `Relay`) with the identity codec. Payloads are seeded random tensors, so honest content differs per message. It
returns one `Sent` record per message with the honest and the delivered tensor.
"""

from __future__ import annotations

import dataclasses

import torch

from attacks.base import torch_generator
from sentinel.engine.workers import Router
from sentinel.transport import Message, Relay, Role, Sender, message_id
from sentinel.transport.codecs import Identity


@dataclasses.dataclass
class Sent:
    msg_id: int
    step: int
    mb_idx: int
    boundary: int
    role: Role
    sender: str
    honest: torch.Tensor
    delivered: torch.Tensor
    targets_corrupted: bool = False
    input_intact: bool = True

    @property
    def changed(self) -> bool:
        return self.targets_corrupted or not torch.equal(self.honest, self.delivered)


def _payload(seed: int, step: int, mb: int, boundary: int, role: Role, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch_generator(seed, 0x7E57, step, mb + 1, boundary, int(role))
    scale = 1.0 if role == Role.ACTIVATION else 1e-2
    return (torch.randn(shape, generator=gen) * scale + 0.1 * scale).float()


def drive(layer, scenario, workers, log, steps: int, shape: tuple[int, int, int] = (2, 4, 8), dp_dim: int = 16):
    """Send `steps` steps of synthetic traffic through `layer`; returns the list of `Sent` records."""
    codecs = {Role.ACTIVATION: Identity(), Role.GRADIENT: Identity()}
    half, relay = Sender(codecs, scenario.seed, adversary=layer), Relay(log, codecs, scenario.seed, shape)
    router = Router(scenario.pipeline.routing, scenario.seed, workers)
    S, M, out = scenario.pipeline.stages, scenario.pipeline.microbatches, []

    def send(step, mb, b, role, sender, receiver, corrupted=False):
        honest = _payload(scenario.seed, step, mb, b, role, shape)
        given = honest.clone()
        msg = Message(step, mb, b, role, sender, receiver, given, msg_id=message_id(step, mb, b, role, M, S))
        delivered = relay.carry(*half.encode(msg)).payload
        intact = torch.equal(given, honest)
        out.append(Sent(msg.msg_id, step, mb, b, role, sender, honest, delivered, corrupted, intact))

    for step in range(steps):
        plan = router.route(step, M)
        ids = [[workers.ids[plan[mb, s]] for s in range(S)] for mb in range(M)]
        for mb in range(M):
            for s in range(S - 1):
                send(step, mb, s, Role.ACTIVATION, ids[mb][s], ids[mb][s + 1])
            targets = torch.randint(0, 8, (shape[0], shape[1]), generator=torch_generator(step, mb))
            corrupted = not torch.equal(layer.corrupt_targets(step, mb, ids[mb][S - 1], targets.clone()), targets)
            for s in range(S - 1, 0, -1):
                send(step, mb, s - 1, Role.GRADIENT, ids[mb][s], ids[mb][s - 1], corrupted and s == S - 1)
        for i, wid in enumerate(workers.ids):
            honest = _payload(scenario.seed, step, -1, workers.stage[i], Role.DP_GRADIENT, (dp_dim,))
            given = honest.clone()
            delivered = layer.dp_contribution(step, workers.stage[i], wid, given)
            out.append(
                Sent(
                    -1,
                    step,
                    -1,
                    workers.stage[i],
                    Role.DP_GRADIENT,
                    wid,
                    honest,
                    delivered,
                    input_intact=torch.equal(given, honest),
                )
            )
    return out
