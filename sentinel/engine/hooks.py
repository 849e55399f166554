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

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the step program calls these hooks; they do not import it at run time
    from sentinel.engine.step import StepProgram, StepState


class StepHook:
    """No-op base: override the phases you need."""

    def attach(self, engine: StepProgram) -> None:
        pass

    def before_pipeline(self, engine: StepProgram, st: StepState) -> None:
        pass

    def before_update(self, engine: StepProgram, st: StepState) -> None:
        pass

    def after_update(self, engine: StepProgram, st: StepState) -> None:
        pass


def find_hook(engine, cls: type) -> StepHook | None:
    """The engine's hook of type `cls`, if installed."""
    return next((h for h in engine.hooks if isinstance(h, cls)), None)
