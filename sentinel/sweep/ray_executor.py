"""`sentinel sweep --executor ray [--address ADDR]`: the sweep's (point, seed) runs as Ray tasks.

A cluster: `ray start --head` on one host, `ray start --address HEAD:6379` on the others, every host with
this package installed; then `sentinel sweep SCENARIO --executor ray --address HEAD:6379` on the head
(the driver). Without `--address` a local Ray instance is started (or the one `RAY_ADDRESS` names).

Each task runs one (point, seed) in a temporary folder on whichever host Ray picks and returns the
folder as a tar archive; the driver unpacks it into the same `points/<point>/seed-<s>/` folder a local
sweep writes (summary.json arrives with the rest, so the resume rule is the same: a run with
summary.json is finished). Twins are shared through a cache on each host (identical twins trained on
two hosts are trained twice; the numbers are the same). Progress: tasks report their steps through a
Ray queue. A task that fails brings its folder back too (failure.txt); a host or the cluster failing
mid-sweep fails the runs it held, the finished runs are kept, and the sweep exits 1.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import socket
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

from sentinel.errors import ConfigError, RunError
from sentinel.parallel import cpu_count, set_threads
from sentinel.progress import JobProgress, QueueProgress, drain
from sentinel.sweep.execute import execute_run
from sentinel.sweep.plan import RunTask

INSTALL = 'pip install -e ".[ray]"  (or: pip install ray)'
CONNECT_TIMEOUT_S = 5.0


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--executor ray: the ray package is not installed; install it with {INSTALL}") from None
    return ray


def check_address(address: str) -> None:
    """Exit 2 quickly for an address nothing listens on (ray.init would retry for a long time)."""
    if address in ("auto", "local"):
        return
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"--address {address}: expected HOST:PORT (e.g. --address 10.0.0.1:6379, the address "
            "`ray start --head` prints), ray://HOST:PORT or auto"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--address {address}: cannot reach a Ray cluster there ({exc.strerror or exc}); start "
            "one with `ray start --head` and pass the address it prints, or leave --address out "
            "for a local Ray"
        ) from None


def connect(address: str | None, num_cpus: int | None = None) -> tuple[Any, bool]:
    """ray.init on the cluster at `address` (None: a local instance); (ray, whether this call initialised it).
    ConfigError (exit 2) if it fails."""
    ray = _import_ray()
    if address is not None:
        check_address(address)
    if ray.is_initialized():
        return ray, False
    kwargs: dict[str, Any] = {
        "address": address,
        "log_to_driver": False,
        "include_dashboard": False,
        "logging_level": "ERROR",
    }
    if address is None:
        kwargs["num_cpus"] = num_cpus
    try:
        ray.init(**{k: v for k, v in kwargs.items() if v is not None or k == "address"})
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        raise ConfigError(f"--address {address}: cannot connect to Ray ({exc})") from None
    return ray, True


def _pack(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buf.getvalue()


def _unpack(data: bytes, dest: Path) -> None:
    """Unpack a run folder next to `dest`, then move it into place (summary.json appears with the rest)."""
    tmp = dest.parent / f".{dest.name}.incoming"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp, filter="data")  # no absolute paths, links out or devices
        else:  # Python < 3.10.12 / 3.11.4: check the names ourselves
            for m in tar.getmembers():
                if m.name.startswith("/") or ".." in Path(m.name).parts or not (m.isfile() or m.isdir()):
                    raise ValueError(f"unsafe member in a run archive: {m.name}")
            tar.extractall(tmp)  # noqa: S202 - members checked above
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def ray_run(task: RunTask, threads: int, cache_tag: str, queue: Any) -> tuple[bytes, str | None]:
    """Body of a Ray task: run into a temporary folder, return (the folder as tar.gz, error text or None)."""

    set_threads(threads)
    cache = Path(tempfile.gettempdir()) / "sentinel-ray-twins" / cache_tag  # shared by this host's tasks
    with tempfile.TemporaryDirectory(prefix="sentinel-ray-") as tmp:
        out = Path(tmp) / "run"
        local = RunTask(task.scenario, str(out), task.point, task.seed, str(cache), task.label)
        sink = QueueProgress(queue) if queue is not None else None
        error = None
        try:
            execute_run(local, sink if sink is not None else _Null())
        except Exception as exc:  # noqa: BLE001 - sent back with the folder; the driver reports it
            error = f"{type(exc).__name__}: {exc}"
        finally:
            if sink is not None:
                try:
                    sink.flush()
                except Exception:  # noqa: BLE001 - progress is best effort
                    pass
        out.mkdir(parents=True, exist_ok=True)
        return _pack(out), error


class _Null:
    def update(self, n: int = 1, note: str | None = None) -> None:
        pass

    def add_total(self, n: int) -> None:
        pass

    def job(self, label: str, steps: int):

        return JobProgress(self, label, steps)


def run_ray(
    todo: list[RunTask], address: str | None, threads: int, progress: Any
) -> list[tuple[RunTask, BaseException]]:
    """Every task as a Ray task; unpack each finished folder as it arrives. Returns the failures."""

    ray, started = connect(address, num_cpus=cpu_count())
    from ray.util.queue import Queue

    queue = Queue()
    stop = threading.Event()
    drainer = drain(queue, progress, stop)
    remote = ray.remote(ray_run).options(num_cpus=threads, max_retries=0)
    tag = hashlib.sha256(str(Path(todo[0].twin_cache or "").resolve()).encode()).hexdigest()[:12]
    pending = {remote.remote(t, threads, tag, queue): t for t in todo}
    failures: list[tuple[RunTask, BaseException]] = []
    try:
        while pending:
            try:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            except Exception as exc:  # noqa: BLE001 - the cluster itself went away
                failures += [(t, RunError(f"the Ray cluster failed: {exc}")) for t in pending.values()]
                break
            for ref in ready:
                task = pending.pop(ref)
                try:
                    data, error = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a worker or host died (WorkerCrashedError, NodeDiedError)
                    failures.append((task, RunError(f"Ray task lost: {type(exc).__name__}: {exc}")))
                    continue
                _unpack(data, Path(task.out))
                if error is not None:
                    failures.append((task, RunError(error)))
    finally:
        stop.set()
        drainer.join(timeout=5)
        if started:
            ray.shutdown()
    return failures
