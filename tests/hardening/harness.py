"""Run `sentinel` commands in isolated children: a memory cap, a time limit, captured output.

Two isolations:
- `fork` (default): children forked from a fork server that imported torch and the package once, so a
  case costs milliseconds instead of an interpreter start; each child calls `sentinel.cli.main(argv)`.
- `spawn`: a fresh `python -m sentinel.cli` per case (slower; exactly what a user runs).

Either way the child runs in its own process group under `RLIMIT_AS` (its current size plus `mem_cap`),
and one that outlives `timeout` is killed with its whole group and reported as hung.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

MEM_CAP = 4 << 30  # bytes a case may add to the process it starts from
TRACEBACK = "Traceback (most recent call last)"
PRELOAD = [
    "torch",
    "sentinel.cli",
    "sentinel.preflight",
    "sentinel.runner",
    "sentinel.scoring.folders",
    "attacks",
    "sentinel.detectors",
    "tests.hardening.harness",
]


@dataclasses.dataclass
class Outcome:
    argv: list[str]
    rc: int | None  # None: killed (hung)
    out: str
    err: str
    hung: bool
    wall_s: float

    @property
    def traceback(self) -> bool:
        return TRACEBACK in self.out or TRACEBACK in self.err

    @property
    def errors(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith(("error:", "sentinel: error:"))]

    def describe(self) -> str:
        return (
            f"argv={self.argv}\nrc={self.rc} hung={self.hung} wall={self.wall_s:.1f}s\n--- stdout\n"
            f"{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"
        )


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _cap_memory(mem_cap: int) -> None:
    limit = _vm_size() + mem_cap
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _child(argv: list[str], cwd: str, out_path: str, err_path: str, mem_cap: int) -> None:
    """Fork-server child: own process group, capped memory, stdout/stderr to files, then the CLI."""
    os.setpgrp()
    os.chdir(cwd)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    rc = 1
    try:
        _cap_memory(mem_cap)
        from sentinel.cli import main

        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001  what a user would see: the traceback
        traceback.print_exc()
        rc = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(rc if isinstance(rc, int) else 1)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Harness:
    """Runs CLI cases; reuse one instance (its fork server starts once)."""

    def __init__(self, isolation: str = "fork", mem_cap: int = MEM_CAP):
        self.isolation, self.mem_cap = isolation, mem_cap
        if isolation == "fork":
            self.ctx = mp.get_context("forkserver")
            self.ctx.set_forkserver_preload(PRELOAD)

    def run(self, argv: list[str], cwd: str | Path, timeout: float = 60.0) -> Outcome:
        with tempfile.TemporaryDirectory(prefix="sentinel-case-") as tmp:
            out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            t0 = time.monotonic()
            if self.isolation == "fork":
                rc, hung = self._fork(argv, str(cwd), out_path, err_path, timeout)
            else:
                rc, hung = self._spawn(argv, str(cwd), out_path, err_path, timeout)
            wall = time.monotonic() - t0
            read = lambda p: Path(p).read_text(errors="replace") if os.path.exists(p) else ""  # noqa: E731
            return Outcome(list(argv), rc, read(out_path), read(err_path), hung, wall)

    def _fork(self, argv, cwd, out_path, err_path, timeout) -> tuple[int | None, bool]:
        p = self.ctx.Process(target=_child, args=(list(argv), cwd, out_path, err_path, self.mem_cap))
        p.start()
        p.join(timeout)
        hung = p.is_alive()
        if hung:
            _kill_group(p.pid)
            p.join(10)
        else:
            _kill_group(p.pid)  # anything the case started and left behind
        rc = p.exitcode
        return (None if hung else (rc if rc is not None and rc >= 0 else 128 - rc)), hung

    def _spawn(self, argv, cwd, out_path, err_path, timeout) -> tuple[int | None, bool]:
        limit = self.mem_cap + (1 << 30)  # a fresh interpreter: torch's own mappings, then the cap

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        with open(out_path, "w") as out, open(err_path, "w") as err:
            p = subprocess.Popen(
                [sys.executable, "-m", "sentinel.cli", *argv],
                cwd=cwd,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                preexec_fn=cap,
                start_new_session=True,
            )
            try:
                rc = p.wait(timeout)
                _kill_group(p.pid)
                return rc if rc >= 0 else 128 - rc, False
            except subprocess.TimeoutExpired:
                _kill_group(p.pid)
                p.wait()
                return None, True
