"""The record every numerical check returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Result:
    """Outcome of one executable check of a theoretical result.

    Attributes:
        name: Registry name, also the stem of `proofs/<name>.py` and `proofs/<name>.md`.
        statement: The claim, in one line.
        bound: The theoretical value the check compares against (an upper bound, a lower bound or a
            tolerance, as `statement` says).
        measured: The value measured by simulation or optimisation.
        margin: Room left before the claim breaks, in the units of `bound`; positive when it holds.
        ok: True iff the main comparison and every sub-check passed.
        detail: Sub-checks and context, one short clause each.
    """

    name: str
    statement: str
    bound: float
    measured: float
    margin: float
    ok: bool
    detail: str = ""

    def line(self) -> str:
        """One printable line: verdict, name, bound vs measured, margin, detail."""
        verdict = "PASS" if self.ok else "FAIL"
        return (
            f"[{verdict}] {self.name:<16} bound={self.bound:.4g} measured={self.measured:.4g} "
            f"margin={self.margin:+.3g} | {self.statement} | {self.detail}"
        )
