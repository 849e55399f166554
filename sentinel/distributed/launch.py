"""`sentinel run SCENARIO --backend dist --nproc N`: a local torchrun launch, watched until it ends.

The scenario is validated here first (bad input exits 2 before any process starts). torchrun runs in
its own session, so a timeout or Ctrl-C ends every rank (`killpg`): no process is left behind. When the
run fails, each rank's `OUT/ranks/rank{r}/exit.json` (or its absence: a rank that was killed or
crashed says nothing) names the rank that failed first, and the ranks' partial EventLogs are merged
into the failed job's result folder next to `failure.txt`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from sentinel import scenario as scenario_mod
from sentinel.distributed.faults import parse_faults
from sentinel.distributed.mapping import RankMap, check_world, default_nproc
from sentinel.distributed.merge import merge
from sentinel.distributed.runtime import Options, check_supported
from sentinel.errors import ConfigError, RunError
from sentinel.eventlog import EventLog
from sentinel.preflight import check_resume


def options_from_cli(args) -> Options:
    """Options from `sentinel run` flags (validated like `python -m sentinel.distributed`'s)."""

    if args.timeout <= 0 or args.checkpoint_every < 0:
        raise ConfigError("--timeout must be > 0 and --checkpoint-every >= 0")
    return Options(
        timeout_s=args.timeout,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        device=args.device or "cpu",
        verifiers=args.verifiers,
    )


def torchrun_command(
    scenario_path: str, out: Path, overrides: list[str], nproc: int, options: Options, quiet: bool
) -> list[str]:
    # torchrun (`torch.distributed.run`) minus the traceback it prints after a rank failed
    cmd = [
        sys.executable,
        "-m",
        "sentinel.distributed.torchrun",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--monitor-interval=1",
        "-m",
        "sentinel.distributed",
        str(scenario_path),
        "--out",
        str(out),
        "--timeout",
        str(options.timeout_s),
        "--device",
        options.device,
        "--backend",
        options.backend,
    ]
    for item in overrides:
        cmd += ["--set", item]
    for fault in options.faults:
        cmd += ["--fault", fault]
    if options.checkpoint_every:
        cmd += ["--checkpoint-every", str(options.checkpoint_every)]
    if options.resume:
        cmd += ["--resume", str(options.resume)]
    if options.verifiers is not None:
        cmd += ["--verifiers", str(options.verifiers)]
    return cmd + (["--quiet"] if quiet else [])


def launch(
    scenario_path: str,
    out: Path,
    overrides: list[str] | tuple[str, ...] = (),
    nproc: int | None = None,
    options: Options | None = None,
    quiet: bool = False,
    timeout_s: float | None = None,
    output: Path | None = None,
) -> dict:
    """Run the scenario on `nproc` local processes; returns summary.json's content or raises RunError.

    Args:
        timeout_s: wall-clock limit for the whole launch (None: only the per-message timeouts apply).
        output: file that receives the ranks' stdout and stderr (default: this process's).
    """
    options = options or Options()
    overrides = list(overrides)
    sc = scenario_mod.load(scenario_path, overrides)  # ConfigError (exit 2) before anything starts
    check_supported(sc)
    parse_faults(options.faults)
    nproc = nproc or default_nproc(sc, options.verifiers)
    check_world(sc.pipeline.stages, sc.pipeline.replicas, nproc, options.verifiers)
    rank_map = RankMap(sc.pipeline.stages, sc.pipeline.replicas, nproc, options.verifiers)
    if options.resume is not None:
        check_resume(options.resume, nproc)  # before torchrun starts: no process, no stray folder
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("ranks/rank*/exit.json"):
        stale.unlink()
    cmd = torchrun_command(scenario_path, out, overrides, nproc, options, quiet)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "SENTINEL_DIST_LAUNCHED": "1"}
    sink = open(output, "w") if output else None  # noqa: SIM115  (closed below)
    try:
        proc = subprocess.Popen(
            cmd, env=env, stdout=sink, stderr=subprocess.STDOUT if sink else None, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except BaseException:  # timeout or Ctrl-C: end every rank (they save their partial logs on SIGTERM)
            _stop(proc)
            raise
    except subprocess.TimeoutExpired:
        message = f"the dist run did not finish within {timeout_s:g} s; every rank was ended"
        _salvage(out, rank_map, message)
        raise RunError(message) from None
    finally:
        if sink is not None:
            sink.close()
    if (out / "summary.json").is_file() and (code == 0 or _all_ranks_ok(out, rank_map.world_size)):
        if code != 0:  # every rank finished its work and said so; only the teardown after it failed
            print(
                f"warning: torchrun exited with code {code} after every rank reported success (a failure in "
                f"process teardown); the results in {out} are complete",
                file=sys.stderr,
                flush=True,
            )
        return json.loads((out / "summary.json").read_text())
    message = diagnose(out, rank_map)
    _salvage(out, rank_map, message)
    raise RunError(message)


def _all_ranks_ok(out: Path, world: int) -> bool:
    """Did every rank write its exit file with status ok (its work done, its results handed over)?"""
    for rank in range(world):
        f = out / "ranks" / f"rank{rank}" / "exit.json"
        try:
            if json.loads(f.read_text())["status"] != "ok":
                return False
        except (OSError, ValueError, KeyError, TypeError):
            return False
    return True


def _stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the launch's whole process group, then SIGKILL what is left after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # ranks torchrun left behind, if any
        except ProcessLookupError:
            pass
        return


def diagnose(out: Path, rank_map: RankMap) -> str:
    """Which rank failed and how, from the ranks' exit files (absent: killed or crashed without a word)."""
    silent, errors = [], []
    for rank in range(rank_map.world_size):
        f = out / "ranks" / f"rank{rank}" / "exit.json"
        if not f.is_file():
            silent.append(rank_map.describe(rank))
            continue
        info = json.loads(f.read_text())
        if info["status"] in ("error", "terminated"):  # terminated: torchrun ended it after a peer failed first
            errors.append(f"{rank_map.describe(rank)}: {info['message']}")
    lines = [f"{who} died without reporting (killed or crashed)" for who in silent] + errors
    if not lines:
        lines = ["the dist run failed; every rank was ended by the launcher (see the output above)"]
    return f"dist run failed ({len(lines)} rank{'s' if len(lines) > 1 else ''}):\n" + "\n".join(
        f"  {line}" for line in lines
    )  # one line per failed rank


def _salvage(out: Path, rank_map: RankMap, message: str) -> None:
    """Merge the partial EventLogs the ranks saved into each failed job's folder; write failure.txt."""
    for job in {p.parents[2] for p in out.glob("**/ranks/rank*/events.npz")}:
        parts = {int(p.parent.name[4:]): EventLog.load(p.parent) for p in job.glob("ranks/rank*/events.npz")}
        if 0 in parts:
            kinds = {r: "verifier" if rank_map.is_verifier(r) else "worker" for r in parts}
            log = merge(parts.pop(0), [(kinds[r], parts[r]) for r in sorted(parts)])
            log.save(job)
            log.write_events_csv(job / "events.csv")
    failure = out / "failure.txt"
    previous = failure.read_text() if failure.is_file() else ""
    failure.write_text(message + "\n\n" + previous)
