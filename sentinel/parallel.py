"""Processes and threads: how many intra-op threads a run uses, and the process pool sweeps and twins share.

Thread policy. torch's default is one intra-op thread per core in every process; with `--jobs 2` on 2
cores that is 4 busy threads on 2 cores, and a scenario that takes 75 s single-threaded took 536-665 s
under load with the default. Each run process therefore uses

    max(1, cores // jobs)   intra-op threads,

unless the user chose: `--threads N` wins, then `OMP_NUM_THREADS`. `cores` counts the cores this
process may run on (`os.sched_getaffinity`), not the machine's.

Pool. `TaskPool(fn, tasks, jobs, progress, threads)` runs `fn(task, sink)` for every task, inline
when `jobs == 1`, else in a `ProcessPoolExecutor` of `jobs` processes whose steps reach the parent's
one `Progress` through a managed queue. It yields `(task, result, error)` as tasks finish and never
stops at a failed task: the caller keeps every finished result and reports the failures. Sweeps,
`sentinel run --seeds` and a run's twins (`sentinel run --jobs`) all go through it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from sentinel.errors import ConfigError
from sentinel.progress import QueueProgress, drain


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def thread_count(jobs: int = 1, requested: int | None = None) -> tuple[int, str]:
    """Intra-op threads per run process and why: `--threads`, else OMP_NUM_THREADS, else cores // jobs."""
    if requested is not None:
        if requested < 1:
            raise ConfigError(f"--threads: {requested} threads; must be >= 1 (e.g. --threads 1)")
        return requested, "--threads"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env), "OMP_NUM_THREADS"
    cores = cpu_count()
    return max(1, cores // max(1, jobs)), f"{cores} cores // {max(1, jobs)} jobs"


def check_jobs(jobs: int | None, flag: str = "--jobs") -> None:
    if jobs is not None and jobs < 1:
        raise ConfigError(f"{flag}: {jobs} processes; must be >= 1 (e.g. {flag} 2)")


def set_threads(threads: int) -> None:
    """Pin torch's intra-op threads in this process (the OpenMP pool follows)."""
    import torch

    torch.set_num_threads(threads)


def _worker_init(threads: int) -> None:
    set_threads(threads)


def _call(fn: Callable[[Any, Any], Any], task: Any, queue: Any) -> Any:
    sink = QueueProgress(queue)
    try:
        return fn(task, sink)
    finally:
        sink.flush()


class TaskPool:
    """`fn(task, sink)` for every task: inline when `jobs <= 1`, else in `jobs` processes.

    The processes are forked and every task submitted when the pool is entered, in the calling thread,
    so the caller may then train in this process while the pool works (`runner.run` trains the main run
    beside its twins) without forking a process in the middle of torch's work. Steps reach the one
    `progress` through a managed queue. `fn` must be a module-level function (it is pickled).
    """

    def __init__(
        self,
        fn: Callable[[Any, Any], Any],
        tasks: Sequence[Any],
        jobs: int,
        progress: Any,
        threads: int,
        inline: bool | None = None,
    ):
        self.fn, self.tasks, self.jobs, self.progress, self.threads = fn, list(tasks), jobs, progress, threads
        # inline: in this process, one task after the other (default for one job); False: in processes even
        # for one job (a run's twins beside the run itself)
        self.inline = (jobs <= 1 or len(self.tasks) <= 1) if inline is None else inline
        self._exit = contextlib.ExitStack()
        self.futures: dict = {}

    def __enter__(self) -> TaskPool:
        if self.inline:
            return self
        import multiprocessing

        manager = self._exit.enter_context(multiprocessing.Manager())
        queue, stop = manager.Queue(), threading.Event()
        thread = drain(queue, self.progress, stop)
        self._exit.callback(lambda: (stop.set(), thread.join(timeout=5)))
        pool = ProcessPoolExecutor(
            max_workers=min(self.jobs, len(self.tasks)), initializer=_worker_init, initargs=(self.threads,)
        )
        self._exit.callback(pool.shutdown, wait=True)
        self.pool = pool
        self.futures = {pool.submit(_call, self.fn, task, queue): task for task in self.tasks}
        return self

    def results(self) -> Iterator[tuple[Any, Any, BaseException | None]]:
        """(task, result, None) or (task, None, error) per task, in completion order; never stops at a failure."""
        if self.inline:
            set_threads(self.threads)
            for task in self.tasks:
                try:
                    yield task, self.fn(task, self.progress), None
                except Exception as exc:  # noqa: BLE001 - reported by the caller with its task
                    yield task, None, exc
            return
        for fut in as_completed(self.futures):
            try:
                yield self.futures[fut], fut.result(), None
            except Exception as exc:  # noqa: BLE001 - includes a worker process that died
                yield self.futures[fut], None, exc

    def __exit__(self, kind, exc, tb) -> None:
        if kind is not None and self.futures:  # Ctrl-C or an error here: do not start what is still queued
            self.pool.shutdown(wait=False, cancel_futures=True)
        self._exit.close()


def pool_map(
    fn: Callable[[Any, Any], Any], tasks: Sequence[Any], jobs: int, progress: Any, threads: int
) -> Iterator[tuple[Any, Any, BaseException | None]]:
    """`TaskPool(...).results()` as one generator."""
    with TaskPool(fn, tasks, jobs, progress, threads) as pool:
        yield from pool.results()
