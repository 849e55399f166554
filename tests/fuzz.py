"""Standalone fuzzer: `python -m tests.fuzz --cases 1500 [--seed 0] [--isolation fork|spawn]`.

Draws cases from tests/hardening/fuzzing.py (mutations of the scenario library and CLI flags), runs each
through the CLI in an isolated child (memory cap, time limit) and prints the result table: cases, exit
codes, tracebacks, hangs, bad exits, accepted-bad cases, refused commands that wrote something. Failing
cases are written to `--failures FILE` (default fuzz-failures.txt) with their inputs to replay.
Exit status: 0 when every case kept the rules, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

from tests.hardening.fuzzing import judge, make_case
from tests.hardening.harness import Harness


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--isolation", choices=["fork", "spawn"], default="fork")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a command counts as hung")
    p.add_argument("--failures", default="fuzz-failures.txt")
    args = p.parse_args(argv)
    harness = Harness(args.isolation)
    rng = random.Random(args.seed)
    counts: collections.Counter = collections.Counter()
    codes: collections.Counter = collections.Counter()
    failures = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sentinel-fuzz-") as tmp:
        for i in range(args.cases):
            ws = Path(tmp) / f"case{i}"
            case = make_case(rng, ws)
            v = judge(case, ws, harness, args.timeout)
            for cmd, rc in v.commands:
                codes[(cmd, rc)] += 1
            counts["cases"] += 1
            counts["commands"] += len(v.commands)
            for flag in ("traceback", "hung", "bad_exit", "accepted_bad", "wrote_when_refused"):
                counts[flag] += int(getattr(v, flag))
            if not v.ok:
                failures.append((i, case, v))
            if (i + 1) % max(1, args.cases // 10) == 0:
                print(
                    f"[fuzz] {i + 1}/{args.cases} cases, {len(failures)} failing, {time.monotonic() - t0:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
    wall = time.monotonic() - t0
    print(f"\nfuzz: seed {args.seed}, isolation {args.isolation}, {wall:.0f} s\n")
    print("| cases | commands | tracebacks | hangs | bad exit codes | accepted bad | wrote when refused |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {counts['cases']} | {counts['commands']} | {counts['traceback']} | {counts['hung']} | "
        f"{counts['bad_exit']} | {counts['accepted_bad']} | {counts['wrote_when_refused']} |"
    )
    print("\n| command | exit code | count |\n|---|---|---|")
    for (cmd, rc), n in sorted(codes.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        print(f"| {cmd} | {'hung' if rc is None else rc} | {n} |")
    if failures:
        with open(args.failures, "w") as f:
            for i, case, v in failures:
                f.write(
                    f"### case {i} from {case.source}: {case.mutations}\nflags: {case.flags}\n"
                    f"--- scenario\n{case.body.decode(errors='replace')}\n--- outcome\n{v.detail}\n\n"
                )
        print(f"\n{len(failures)} failing cases written to {args.failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
