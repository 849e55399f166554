"""Step hooks: optional extensions of the engine's step that leave the step itself untouched.

    attach(engine)                  once, when the engine is built
    before_pipeline(engine, st)     after routing, before the schedule runs (asynchrony: stale weights in)
    before_update(engine, st)       after DP sync, before the optimizer step (asynchrony: current weights back)
    after_update(engine, st)        after the optimizer step (subspace projection, sparse averaging,
                                    staleness snapshots, the network clock -- in that order)

`st` is the step's state (`st.step`, `st.batch`, `st.plan` (M, S) worker indices, `st.losses`,
`st.action_s` measured seconds per action). With no hook installed the engine runs exactly as
without this module: identity codecs, no asynchrony and the default network change no number
(the network clock only reads what the engine did). A backend that reuses the engine's pieces calls
the same four methods at the same points.
"""

from __future__ import annotations


class StepHook:
    """No-op base: override the phases you need."""

    def attach(self, engine) -> None:
        pass

    def before_pipeline(self, engine, st) -> None:
        pass

    def before_update(self, engine, st) -> None:
        pass

    def after_update(self, engine, st) -> None:
        pass


def build_hooks(scenario, engine) -> list[StepHook]:
    """The hooks this scenario needs, attached, in the order their `after_update` must run."""
    from sentinel.engine.asynchrony import Asynchrony
    from sentinel.engine.sparse_avg import SparseAveraging
    from sentinel.model import model_hooks
    from sentinel.transport.clock import NetworkClock

    hooks: list[StepHook] = model_hooks(scenario)  # tied embeddings: gradients summed right after DP sync
    for codec in {id(c): c for c in engine.transport.codecs.values()}.values():
        if isinstance(codec, StepHook):
            hooks.append(codec)
    if scenario.dp.sync == "sparse_avg":
        hooks.append(SparseAveraging(scenario.dp.sparse_avg))
    if scenario.transport.async_.max_staleness > 0:
        hooks.append(Asynchrony(scenario.transport.async_, scenario))
    if scenario.transport.network.enabled:
        hooks.append(NetworkClock(scenario))
    for h in hooks:
        h.attach(engine)
    return hooks


def find_hook(engine, cls: type) -> StepHook | None:
    """The engine's hook of type `cls`, if installed."""
    return next((h for h in getattr(engine, "hooks", ()) if isinstance(h, cls)), None)
