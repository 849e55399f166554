"""`python -m sentinel.distributed.torchrun ARGS`: torchrun (`torch.distributed.run`) without its failure traceback.

When a rank fails, torchrun's agent raises `ChildFailedError` out of its `main`, which prints a ~40-line
Python traceback and a table of exit codes after the ranks have already said what went wrong (each rank
prints one `error: [rank N] ...` line, and `sentinel run` ends with one line per failed rank). This wrapper
runs the same `main` and turns that exception into exit status 1, and keeps the agent's own warnings
("Sending process ... closing signal SIGTERM") out of the output. Everything else is torchrun unchanged.
"""

from __future__ import annotations

import logging
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        torchrun_main(argv)
    except ChildFailedError:  # the ranks reported their errors themselves (exit.json, stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
