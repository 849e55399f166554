"""Progress of a long command with an ETA: a tqdm bar on a terminal, plain lines otherwise.

Off a terminal (a log file, CI, `nohup`), a line goes to stderr whenever another 10% of the work is
done and at least every 30 s while work is under way (a heartbeat thread covers long silent stretches,
such as one slow step), so a reader always knows how far along a run is and when it should end:

    [paper_table1] 37% 1332/3600 steps, 2m11s elapsed, ETA 3m43s (scaling/gradient seed 2: step 40/60)

The ETA is the remaining work at the average rate so far. One `Progress` can count the work of many
jobs (a run and its twins, a sweep's points x seeds); jobs in other processes report through a queue
(`QueueProgress`) that the parent drains into it (`drain`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

LINE_EVERY_S = 30.0
LINE_EVERY_FRACTION = 0.1


def duration(seconds: float) -> str:
    """`1h02m`, `3m07s` or `12s`."""
    s = int(round(max(0.0, seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """Counts done units of `total`; prints a bar (terminal) or lines (every 10% and every 30 s) with an ETA.

    Thread-safe: `update` may be called from a queue-draining thread while the heartbeat prints.
    """

    def __init__(
        self,
        total: int,
        label: str,
        unit: str = "steps",
        enabled: bool = True,
        stream: TextIO | None = None,
        tty: bool | None = None,
        every_s: float = LINE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        heartbeat: bool = True,
    ):
        self.total, self.label, self.unit = max(0, int(total)), label, unit
        self.enabled, self.stream = enabled, stream or sys.stderr
        self.every_s, self.clock = every_s, clock
        self.done, self.note, self.shown = 0, "", -1  # shown: `done` at the last printed line
        self.t0 = self.last_line = clock()
        self.next_mark = LINE_EVERY_FRACTION
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.bar = None
        tty = self.stream.isatty() if tty is None else tty
        if enabled and tty:
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total,
                desc=label,
                unit=unit.rstrip("s") or "it",
                leave=False,
                file=self.stream,
                dynamic_ncols=True,
            )
        self._beat = None
        if enabled and heartbeat:
            self._beat = threading.Thread(target=self._heartbeat, daemon=True, name=f"progress-{label}")
            self._beat.start()

    # -- counting ----------------------------------------------------------------------------------
    def update(self, n: int = 1, note: str | None = None) -> None:
        """`n` more units done (`note`: what is running now, shown beside the count)."""
        with self._lock:
            self.done = min(self.total, self.done + n) if self.total else self.done + n
            if note is not None:
                self.note = note
            if self.bar is not None:
                self.bar.update(n)
                if note is not None:
                    self.bar.set_postfix_str(note, refresh=False)
            elif self.enabled and (self.fraction >= self.next_mark or self.clock() - self.last_line >= self.every_s):
                self._line()

    def add_total(self, n: int) -> None:
        """More work than first planned (or less, with n < 0)."""
        with self._lock:
            self.total = max(self.done, self.total + n)
            if self.bar is not None:
                self.bar.total = self.total
                self.bar.refresh()

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0

    def eta_s(self) -> float | None:
        """Remaining work at the average rate so far (None before the first unit)."""
        elapsed = self.clock() - self.t0
        if not self.done or elapsed <= 0:
            return None
        return (self.total - self.done) * elapsed / self.done

    def text(self) -> str:
        eta = self.eta_s()
        return (
            f"[{self.label}] {self.fraction:.0%} {self.done}/{self.total} {self.unit}, "
            f"{duration(self.clock() - self.t0)} elapsed, ETA {duration(eta) if eta is not None else '?'}"
            + (f" ({self.note})" if self.note else "")
        )

    def _line(self) -> None:
        print(self.text(), file=self.stream, flush=True)
        self.last_line, self.shown = self.clock(), self.done
        while self.next_mark <= self.fraction:
            self.next_mark += LINE_EVERY_FRACTION

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(1.0, self.every_s / 4)):
            with self._lock:
                if self.bar is not None:
                    self.bar.refresh()
                elif self.clock() - self.last_line >= self.every_s:
                    self._line()

    def close(self, final: bool = True) -> None:
        """Stop the heartbeat; print the final line (off a terminal) if anything was done."""
        self._stop.set()
        with self._lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
            elif self.enabled and final and self.done and self.shown != self.done:
                self._line()

    # -- jobs ----------------------------------------------------------------------------------------
    def job(self, label: str, steps: int) -> JobProgress:
        """An `on_step(step, loss, val)` callback for one training of `steps` steps counted here."""
        return JobProgress(self, label, steps)


class JobProgress:
    """The engine's `on_step(step, loss, val)` for one training, counted in a shared progress.

    `owned`: the training created that progress for itself, so closing the job closes it."""

    def __init__(self, sink: Any, label: str, steps: int, owned: bool = False):
        self.sink, self.label, self.steps, self.owned = sink, label, steps, owned
        self.last_val: float | None = None

    def __call__(self, step: int, loss: float, val: float | None) -> None:
        if val is not None:
            self.last_val = val
        val_txt = f", val {self.last_val:.3f}" if self.last_val is not None else ""
        self.sink.update(1, f"{self.label}: step {step}/{self.steps}, loss {loss:.3f}{val_txt}")

    def close(self) -> None:
        if self.owned:
            self.sink.close()


class QueueProgress:
    """`Progress`'s counting side in another process: batches updates into a queue the parent drains."""

    def __init__(self, queue: Any, flush_s: float = 0.5):
        self.queue, self.flush_s = queue, flush_s
        self.pending, self.note, self.last = 0, None, time.monotonic()

    def update(self, n: int = 1, note: str | None = None) -> None:
        self.pending += n
        self.note = note if note is not None else self.note
        if time.monotonic() - self.last >= self.flush_s:
            self.flush()

    def add_total(self, n: int) -> None:
        self.flush()
        self.queue.put(("total", n, None))

    def flush(self) -> None:
        if self.pending:
            self.queue.put(("done", self.pending, self.note))
            self.pending = 0
        self.last = time.monotonic()

    def job(self, label: str, steps: int) -> JobProgress:
        return JobProgress(self, label, steps)


def drain(queue: Any, progress: Progress, stop: threading.Event) -> threading.Thread:
    """A thread that moves `QueueProgress` messages into `progress` until `stop` is set and the queue is empty."""

    def loop() -> None:
        import queue as queue_mod

        while True:
            try:
                kind, n, note = queue.get(timeout=0.2)
            except queue_mod.Empty:
                if stop.is_set():
                    return
                continue
            except Exception:  # noqa: BLE001 - the queue's owner went away (manager, Ray actor): nothing more comes
                return
            if kind == "done":
                progress.update(n, note)
            else:
                progress.add_total(n)

    thread = threading.Thread(target=loop, daemon=True, name="progress-drain")
    thread.start()
    return thread


def training_progress(total: int, label: str, progress) -> JobProgress:
    """The `on_step(step, loss, val)` callback of one training (also used by the dist backend's trainer).

    `progress`: a shared progress (`sentinel.progress.Progress` or `QueueProgress`: this training's steps
    count there), or a flag for a progress of its own (False: silent; None or True: a bar on a terminal,
    lines with an ETA otherwise).
    """
    if hasattr(progress, "job"):
        return progress.job(label, total)
    return JobProgress(Progress(total, label, enabled=progress is not False), label, total, owned=True)
