"""`python -m proofs [--seed N] [--only NAME ...]`: one line per result; exit 0 iff every check passes."""

from __future__ import annotations

import argparse
import sys
import time

from proofs import CHECKS, fence_fpr


def main(argv: list[str] | None = None) -> int:
    """Runs the checks and prints their verdicts.

    Returns:
        0 if all selected checks pass, 1 otherwise (2 for bad arguments, via argparse).
    """
    parser = argparse.ArgumentParser(prog="python -m proofs", description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="seed shared by every check (default 0)")
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), help="run only these checks")
    parser.add_argument("--fpr-table", action="store_true", help="print the FPR tables of fence_fpr.md and exit")
    args = parser.parse_args(argv)
    if args.fpr_table:
        for dist in fence_fpr.DISTS:
            table = fence_fpr.fpr_table(fence_fpr.TABLE_KS, fence_fpr.TABLE_WINDOWS, dist)
            print(f"\n{dist} (FPR in %, * = at most 1%)\n\n{fence_fpr.format_table(table)}")
        return 0
    failed = 0
    for name, check in CHECKS.items():
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        result = check(args.seed)
        failed += not result.ok
        print(f"{result.line()} ({time.perf_counter() - start:.1f}s)", flush=True)
    print(f"{'all checks passed' if not failed else f'{failed} check(s) FAILED'} (seed {args.seed})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
