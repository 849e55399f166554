"""Detector cost as a ratio: wall time per step with a detector over without, same run otherwise.

The detector runs in `open_loop` mode so that it computes every verdict but changes nothing: both
runs train exactly the same trajectory on the quickstart scenario (no attack), and the ratio is the
price of verification alone. Timed in alternation in one process (sentinel.bench.alternate).
"""

from __future__ import annotations

from pathlib import Path

from sentinel import scenario as scenario_mod

QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


def detector_overhead(quick: bool) -> dict:
    """`detector_overhead` (SENTINEL) and `duplication_overhead`, each = s/step with / s/step without."""
    from sentinel.bench import alternate
    from sentinel.runner import build_engine

    def make(name: str):
        sc = scenario_mod.load(QUICKSTART, [f"detector.name={name}", "detector.mode=open_loop"])
        return lambda: build_engine(sc)

    names = ("none", "sentinel", "duplication")
    t = alternate({n: make(n) for n in names}, reps=2 if quick else 5, steps=4 if quick else 12)
    return {
        "detector_overhead": t["sentinel"] / t["none"],
        "duplication_overhead": t["duplication"] / t["none"],
        "detector_overhead_detail": {f"{n}_s_per_step": t[n] for n in names},
    }
