"""The adversary layer: the transport's Interceptor that runs a scenario's attacks at their senders.

    Transport.send:  pre_codec(msg)  -> codec.encode -> post_codec(msg, wire, ctx) -> ...
    DP sync:         dp_contribution(step, stage, worker, vec)
    last stage loss: corrupt_targets(step, mb, worker, targets)        (target_corruption only)

It decides from `msg.sender` whether it controls a message (the malicious set is fixed at
construction from the scenario seed; replacement workers added later are honest) and never reaches
into engine internals. For each message of a malicious sender, the attack specs are offered in
`adversary.attacks` order; an attack acts when the worker runs it, the role matches, its schedule is
active, its seeded `prob` draw fires and it wants to; the first attack that acts wins (at most one
attack per message, pre-codec before post-codec). Every matching attack observes the honest tensor.

Ground truth: a message is *tampered* when an attack acted on it, i.e. returned a tensor other than
its input object -- including no-op parameters such as alpha = 1, which act but change nothing (that
is why a no-op run is bit-identical to a run without adversary while still logging its messages).
For each tampered message the layer calls `log.log_tamper(msg, attack, norm_ratio)` with
norm_ratio = ||tampered - honest|| / ||honest|| (0 when both are zero, inf when only the honest one
is; over the wire tensors for post-codec; NaN for target_corruption, whose perturbation is in the
labels). DP-sync contributions are logged with msg id -1 and mb -1.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from attacks.assignment import assign_malicious
from attacks.base import Attack, AttackContext, seeded_int
from attacks.schedule import Schedule
from attacks.wire import wire_fields
from sentinel.data import vocab_size as data_vocab
from sentinel.errors import RunError
from sentinel.registry import ATTACKS
from sentinel.transport.message import Message, Role, Wire

_ROLES = {
    "activation": (Role.ACTIVATION,),
    "gradient": (Role.GRADIENT,),
    "both": (Role.ACTIVATION, Role.GRADIENT),
    "dp_gradient": (Role.DP_GRADIENT,),
}


@dataclasses.dataclass(frozen=True)
class _Entry:
    index: int
    name: str
    attack: Attack
    schedule: Schedule
    workers: frozenset[str]
    roles: frozenset[Role]
    placement: str
    seed: int
    on_targets: bool


def norm_ratio(new: list[torch.Tensor], old: list[torch.Tensor]) -> float:
    """||new - old|| / ||old|| over several tensors (0-safe)."""
    num = math.sqrt(sum(float((n.double() - o.double()).pow(2).sum()) for n, o in zip(new, old)))
    den = math.sqrt(sum(float(o.double().pow(2).sum()) for o in old))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


class AdversaryLayer:
    """Runs the scenario's attacks; see the module docstring.

    Attributes:
        malicious: sorted ids of the malicious workers (the scorer's true malicious set).
        entries: one per attack spec, in scenario order.
    """

    def __init__(self, scenario, workers, log):
        adv, p = scenario.adversary, scenario.pipeline
        self.log = log
        self.num_stages = p.stages
        self.malicious = assign_malicious(adv, p.stages, p.replicas, scenario.seed)
        unknown = set(self.malicious) - set(workers.ids)
        if unknown:
            raise RunError(f"malicious workers {sorted(unknown)} are not in the mesh")
        self._mal = frozenset(self.malicious)
        t = scenario.transport  # codec name per role: which wire fields post-codec attacks touch
        self.codec_names = {
            role: (getattr(t, f"{role.label}_codec", None) or t.codec).name for role in (Role.ACTIVATION, Role.GRADIENT)
        }
        self.vocab = data_vocab(scenario)  # target corruption draws labels the tokenizer can produce
        self.entries = [self._entry(i, spec, scenario.seed) for i, spec in enumerate(adv.attacks)]
        self._pending_targets: dict[tuple[int, int, str], str] = {}
        self._pre_acted: Message | None = None  # the message pre_codec tampered last (post_codec skips it)
        self.view = None

    def _entry(self, i: int, spec, seed: int) -> _Entry:
        attack = ATTACKS.get(spec.name)(spec.config)
        return _Entry(
            index=i,
            name=spec.name,
            attack=attack,
            schedule=Schedule.from_spec(spec),
            workers=frozenset(spec.workers or self.malicious) & self._mal,
            roles=frozenset(_ROLES[spec.role]),
            placement=spec.placement,
            seed=seeded_int(seed, 0xA77, i),
            on_targets=callable(getattr(attack, "corrupt", None)),
        )

    def attach_detector_view(self, view) -> None:
        """Give white-box attacks a read-only DetectorView (attacks/detector_view.py)."""
        self.view = view
        for e in self.entries:
            e.attack.attach_view(view)

    # -- the three transport hooks -------------------------------------------------------------------
    def pre_codec(self, msg: Message) -> Message:
        if msg.sender not in self._mal:
            return msg
        key = (msg.step, msg.mb_idx, msg.sender)
        name = self._pending_targets.pop(key, None) if msg.role == Role.GRADIENT else None
        if name is not None:  # the gradient of a loss on corrupted targets
            self.log.log_tamper(msg, name, math.nan)
            self._pre_acted = msg
            return msg
        out, name = self._offer(msg, {"": msg.payload}, "pre_codec")
        if name is not None:
            self.log.log_tamper(msg, name, norm_ratio([out[""]], [msg.payload]))
            msg = msg.replace(payload=out[""])
            self._pre_acted = msg
        return msg

    def post_codec(self, msg: Message, wire: Wire, ctx) -> Wire:
        if msg.sender not in self._mal or msg is self._pre_acted:
            return wire
        fields = wire_fields(self.codec_names[msg.role], wire)
        if not fields:
            return wire
        honest = {f: wire.tensors[f] for f in fields}
        out, name = self._offer(msg, honest, "post_codec")
        if name is None:
            return wire
        self.log.log_tamper(msg, name, norm_ratio([out[f] for f in fields], [honest[f] for f in fields]))
        return Wire(tensors={**wire.tensors, **out}, meta=dict(wire.meta))

    def dp_contribution(self, step: int, stage_idx: int, worker: str, vec: torch.Tensor) -> torch.Tensor:
        if worker not in self._mal:
            return vec
        msg = Message(step, -1, stage_idx, Role.DP_GRADIENT, worker, "", vec)
        out, name = self._offer(msg, {"": vec}, "dp")
        if name is None:
            return vec
        self.log.log_tamper(msg, name, norm_ratio([out[""]], [vec]))
        return out[""]

    def corrupt_targets(self, step: int, mb: int, worker: str, targets: torch.Tensor) -> torch.Tensor:
        """Targets for the last stage's loss (the engine calls this; only target_corruption acts)."""
        if worker not in self._mal:
            return targets
        self._pending_targets = {k: v for k, v in self._pending_targets.items() if k[0] >= step}
        msg = Message(step, mb, self.num_stages - 2, Role.GRADIENT, worker, "", targets)  # the gradient to come
        for e in self.entries:
            if not e.on_targets or worker not in e.workers or not e.schedule.active(step):
                continue
            ctx = self._ctx(e, msg, "")
            if e.schedule.fires(ctx) and e.attack.wants(ctx):
                self._pending_targets[(step, mb, worker)] = e.name
                return e.attack.corrupt(targets, ctx, self.vocab)
        return targets

    # -- internals ---------------------------------------------------------------------------------
    def _ctx(self, e: _Entry, msg: Message, field: str) -> AttackContext:
        return AttackContext(
            step=msg.step,
            mb_idx=msg.mb_idx,
            boundary=msg.boundary,
            role=msg.role,
            worker=msg.sender,
            receiver=msg.receiver,
            seed=e.seed,
            since=msg.step - e.schedule.start,
            colluders=e.workers,
            field=field,
            num_stages=self.num_stages,
        )

    def _matches(self, e: _Entry, msg: Message, placement: str) -> bool:
        if e.on_targets or msg.role not in e.roles or msg.sender not in e.workers:
            return False
        return placement == "dp" or e.placement == placement

    def _decide(self, e: _Entry, msg: Message, ctxs: dict[str, AttackContext]) -> bool:
        if not e.schedule.active(msg.step):
            return False
        msg_ctx = self._ctx(e, msg, "")  # one prob draw per message, whatever the wire fields
        if not (any(e.attack.forced(c) for c in ctxs.values()) or e.schedule.fires(msg_ctx)):
            return False
        return all(e.attack.wants(c) for c in ctxs.values())

    def _offer(self, msg: Message, tensors: dict[str, torch.Tensor], placement: str):
        """Offer the tensors to every matching attack; the first that acts wins. -> (tensors, name | None)."""
        out, acted = tensors, None
        for e in self.entries:
            if not self._matches(e, msg, placement):
                continue
            ctxs = {f: self._ctx(e, msg, f) for f in tensors}
            if acted is None and self._decide(e, msg, ctxs):
                new = {f: e.attack.apply(x, ctxs[f]) for f, x in tensors.items()}
                if any(new[f] is not tensors[f] for f in tensors):
                    self._check_output(e, msg, tensors, new)
                    out, acted = new, e.name
            for f, x in tensors.items():
                e.attack.observe(x, ctxs[f])
        return out, acted

    @staticmethod
    def _check_output(e: _Entry, msg: Message, old: dict, new: dict) -> None:
        for f, x in old.items():
            y = new[f]
            if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype:
                got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
                raise RunError(
                    f"attack {e.name!r} (adversary.attacks[{e.index}]) returned {got} for a "
                    f"{tuple(x.shape)} {x.dtype} {msg.role.label} tensor; attacks must keep shape and dtype"
                )
