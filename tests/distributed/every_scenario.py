"""Every scenario of the library on both backends: `python -m tests.distributed.every_scenario [--steps N] [NAME...]`.

Each scenario runs for a few steps (no twins, no confirmation) in `sim` and on real processes (the default
process count: a verifier per boundary, a process per worker, capped by --max-procs), and the two EventLogs are
compared as the parity tests compare them. Prints one row per scenario and exits 1 if any differs or fails.
Too slow for the test suite (minutes per scenario on 2 cores); its table is in the #19 note.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from sentinel import scenario as scenario_mod
from sentinel.distributed.launch import launch
from sentinel.distributed.mapping import default_verifiers
from sentinel.distributed.runtime import Options
from sentinel.errors import SentinelError
from sentinel.eventlog import EventLog
from tests.distributed.helpers import REPO, assert_same_log, sim_reference


def _nproc(sc, cap: int) -> int:
    S, R = sc.pipeline.stages, sc.pipeline.replicas
    full = S * R + max(1, S - 1)
    if full <= cap:
        return full
    n = max(S + 1, min(cap, S * R + 1))
    return max(n, S + default_verifiers(S, n))


def check(path: Path, steps: int, cap: int) -> tuple[str, str, float]:
    """`steps` steps past the last attack's start (at most the scenario's own), both backends, compared."""
    base = scenario_mod.load(path, ["sweep.grid={}"])
    last = max([a.start for a in base.adversary.attacks], default=0)
    steps = min(base.training.steps, last + steps)
    over = [
        f"training.steps={steps}",
        f"training.eval_every={steps}",
        "scoring.twins=[]",
        "scoring.confirm=false",
        "sweep.grid={}",
    ]
    sc = scenario_mod.load(path, over)
    nproc = _nproc(sc, cap)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            launch(
                str(path),
                Path(tmp) / "dist",
                over,
                nproc=nproc,
                options=Options(timeout_s=300),
                quiet=True,
                timeout_s=1200,
                output=Path(tmp) / "dist.log",
            )
            sim = sim_reference(path, over, Path(tmp) / "sim")
            assert_same_log(EventLog.load(Path(tmp) / "dist"), sim)
            return (
                "equal",
                f"{nproc} processes, {len(sim.messages)} messages, {len(sim.ground_truth)} tampered, "
                f"{int(sim.verdicts['flagged'].sum()) if len(sim.verdicts) else 0} flagged",
                time.perf_counter() - t0,
            )
        except (SentinelError, AssertionError) as exc:
            return (
                "DIFFERS" if isinstance(exc, AssertionError) else "FAILED",
                str(exc).splitlines()[0][:160],
                time.perf_counter() - t0,
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.distributed.every_scenario", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="scenario files (default: every file under scenarios/)")
    p.add_argument("--steps", type=int, default=4, help="steps after the last attack starts (default 4)")
    p.add_argument("--max-procs", type=int, default=20, help="processes at most per run (default 20)")
    args = p.parse_args(argv)
    paths = [Path(n) for n in args.names] or sorted((REPO / "scenarios").rglob("*.yaml"))
    print("| scenario | result | detail | seconds |\n|---|---|---|---|", flush=True)
    bad = 0
    for path in paths:
        verdict, detail, secs = check(path, args.steps, args.max_procs)
        bad += verdict != "equal"
        print(
            f"| {path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path} | {verdict} | {detail} | {secs:.0f} |",
            flush=True,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
