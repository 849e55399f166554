"""`torchrun ... -m sentinel.distributed SCENARIO --out DIR [options]`: one rank of a dist run.

Every rank runs this with the same arguments; rank 0 becomes the relay and writes the result folder,
the others host workers. `sentinel run SCENARIO --backend dist --nproc N` launches it locally.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from pathlib import Path

from sentinel import runner, scenario
from sentinel.distributed.driver import trainer, worker_loop, write_exit
from sentinel.distributed.faults import parse_faults
from sentinel.distributed.mapping import RankMap
from sentinel.distributed.runtime import Options, Runtime, check_supported
from sentinel.errors import ConfigError, SentinelError


class Terminated(BaseException):
    """SIGTERM (torchrun ending the other ranks after a failure): unwind so partial logs get saved."""


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sentinel.distributed", description=__doc__.splitlines()[0])
    p.add_argument("scenario")
    p.add_argument("--out", required=True, help="result folder (on rank 0's host; every rank must see the same path)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds one message may take before its sender counts as stalled (default 60)",
    )
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="checkpoint every N steps")
    p.add_argument("--resume", metavar="DIR", help="resume from a checkpoint (a run folder or a checkpoint folder)")
    p.add_argument("--fault", action="append", default=[], metavar="KIND:WORKER:STEP", help="inject a fault")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument(
        "--verifiers",
        type=int,
        default=None,
        metavar="V",
        help="verifier processes (default: one per stage boundary, as --nproc allows)",
    )
    p.add_argument("--quiet", action="store_true")
    return p


def options_from(args: argparse.Namespace) -> Options:
    if args.timeout <= 0 or args.checkpoint_every < 0:
        raise ConfigError("--timeout must be > 0 and --checkpoint-every >= 0")
    parse_faults(args.fault)
    return Options(
        timeout_s=args.timeout,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        faults=tuple(args.fault),
        device=args.device,
        backend=args.backend,
        verifiers=args.verifiers,
    )


def _rank0(args: argparse.Namespace, rt: Runtime, top: Path) -> None:

    try:
        sc = scenario.load(args.scenario, args.set)
        check_supported(sc)
        if not args.quiet:
            for rank, what in rt_map(sc, rt):
                print(f"[dist] rank {rank}: {what}", flush=True)
        summary = runner.run(sc, top, progress=False if args.quiet else None, backend="dist", trainer=trainer(rt, top))
        t = summary["training"]
        if os.environ.get("SENTINEL_DIST_LAUNCHED") != "1":  # `sentinel run` prints this line itself
            print(
                f"{sc.name}: val loss {t['initial_val_loss']:.4f} -> {t['final_val_loss']:.4f} "
                f"in {summary['cost']['wall_s']:.1f} s; results in {top}",
                flush=True,
            )
    finally:
        if not rt.in_job:  # between jobs the workers wait for an announcement: tell them there is no more
            rt.announce(None)


def rt_map(sc, rt: Runtime) -> list[tuple[int, str]]:

    return RankMap(sc.pipeline.stages, sc.pipeline.replicas, rt.world, rt.options.verifiers).table()


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    top = Path(args.out)
    try:
        options = options_from(args)
    except ConfigError as exc:
        print("\n".join(f"error: {p}" for p in exc.problems), file=sys.stderr)
        return 2

    def on_term(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, on_term)
    rank = int(os.environ.get("RANK", "0"))  # torchrun's; the process group confirms it below
    (top / "ranks" / f"rank{rank}").mkdir(parents=True, exist_ok=True)
    (top / "ranks" / f"rank{rank}" / "pid").write_text(str(os.getpid()))
    code, status, message, rt = 0, "ok", "", None
    try:
        rt = Runtime(options)
        if rt.rank == 0:
            _rank0(args, rt, top)
        else:
            worker_loop(rt, top)
    except ConfigError as exc:
        code, status, message = 2, "error", "; ".join(exc.problems)
    except Terminated:
        code, status, message = 143, "terminated", "ended by SIGTERM (torchrun or the launcher ending the run)"
    except SentinelError as exc:
        code, status, message = 1, "error", str(exc)
    except BaseException as exc:  # report, never hang: a traceback on stderr, a status on disk
        code, status, message = 1, "error", f"{exc.__class__.__name__}: {exc}"
        traceback.print_exc()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write_exit(top, rank, status, message)
    if code:
        print(f"error: [rank {rank}] {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)  # skip process-group teardown: peers may be gone
    rt.comm.flush()
    rt.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the work is done and reported: skip interpreter teardown, where a daemon thread can abort


if __name__ == "__main__":
    sys.exit(main())
