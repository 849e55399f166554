"""The `sentinel` command line.

Exit codes: 0 ok, 2 bad input (scenario, flags), 1 a run that failed for another reason.
Bad input never produces a traceback: errors are printed one per line, located.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sentinel import strictjson
from sentinel.errors import ConfigError, SentinelError
from sentinel.registry import REGISTRIES, did_you_mean, one_line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default exits 2 with usage; keep it, one line
        self.print_usage(sys.stderr)
        print(f"sentinel: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def cmd_run(args: argparse.Namespace) -> int:
    from sentinel import preflight, runner

    plan = preflight.check(preflight.Request.from_args(args, "run"))  # exit 2 before anything is written
    sc, out = plan.scenario, plan.out
    if args.backend == "dist":
        from sentinel.distributed.launch import launch, options_from_cli

        summary = launch(args.scenario, out, args.set, nproc=args.nproc, options=options_from_cli(args),
                         quiet=args.quiet)
    else:
        summary = runner.run(sc, out, progress=None if not args.quiet else False, backend=args.backend,
                             checkpoint_every=args.checkpoint_every, resume=args.resume)
    t = summary["training"]
    print(
        f"{sc.name}: val loss {t['initial_val_loss']:.4f} -> {t['final_val_loss']:.4f} "
        f"in {summary['cost']['wall_s']:.1f} s; results in {out}"
    )
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from sentinel import preflight, scenario

    plan = preflight.check(preflight.Request.from_args(args, "validate"))  # what `run` (and `sweep`) check
    sc = plan.scenario
    for note in scenario.warnings_for(sc):
        print(f"warning: {note}", file=sys.stderr)
    points = f"; sweep.grid: {len(plan.points)} points, each valid" if plan.points else ""
    print(f"{args.scenario}: ok ({sc.name}: {sc.num_workers} workers, {sc.training.steps} steps{points})")
    for line in plan.estimate.lines():
        print(f"  {line}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    kinds = [args.kind] if args.kind else list(REGISTRIES)
    for kind in kinds:
        if kind not in REGISTRIES:
            raise ConfigError(
                f"unknown plugin kind {kind!r}{did_you_mean(kind, list(REGISTRIES))}; valid: {', '.join(REGISTRIES)}"
            )
        reg = REGISTRIES[kind]
        print(f"{kind}:")
        for name in reg.names():
            print(f"  {name:<22} {one_line(reg.get(name))}")
    return 0


def _describe_scenario(prefix: str) -> int:
    """`sentinel describe scenario[.SECTION]`: every scenario key with its type, default and range."""
    from sentinel.config import schema_rows
    from sentinel.scenario import Scenario

    rows = [r for r in schema_rows(Scenario) if r[0].startswith(prefix)]
    if not rows:
        raise ConfigError(f"scenario.{prefix.rstrip('.')}: no such key; see `sentinel describe scenario`")
    for key, tp, default, rng, help_ in rows:
        print(f"{key}: {tp} = {default}" + (f"  [{rng}]" if rng else "") + (f"  # {help_}" if help_ else ""))
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    name = args.name
    if name == "scenario" or name.startswith("scenario."):
        return _describe_scenario(name[len("scenario."):])
    kind = None
    if "/" in name:
        kind, name = name.split("/", 1)
    hits = [k for k, reg in REGISTRIES.items() if (kind is None or k == kind) and name in reg]
    if not hits:
        every = sorted({n for reg in REGISTRIES.values() for n in reg.names()})
        raise ConfigError(f"no plugin named {name!r}{did_you_mean(name, every)}; see `sentinel list`")
    for k in hits:
        info = REGISTRIES[k].describe(name)
        print(f"{k}/{name}\n")
        print(info["doc"] + "\n")
        if info["params"]:
            print("parameters:")
            for p in info["params"]:
                print(f"  {p['name']}: {p['type']} = {p['default']!r}" + (f"  [{p['range']}]" if p.get("range") else "")
                      + (f"  # {p['help']}" if p["help"] else ""))
        else:
            print("parameters: none")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from sentinel import preflight, sweep

    if args.jobs is not None and not 1 <= args.jobs <= 256:
        raise ConfigError(f"--jobs {args.jobs}: parallel processes, 1 to 256")
    out = preflight.check(preflight.Request.from_args(args, "sweep")).out  # every point, before any runs
    rows = sweep.run_sweep(args.scenario, out, args.set, jobs=args.jobs)
    print((out / "sweep.md").read_text(), end="")
    print(f"{len(rows)} grid points; table and plots in {out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from sentinel import preflight
    from sentinel.scoring import report

    if args.out:
        preflight.check_out_file(args.out, "--out")
    good, bad = [], 0
    for d in args.dirs:  # a bad folder is named and skipped; the others are still rebuilt
        try:
            report.rebuild(Path(d))
        except ConfigError as exc:
            bad += 1
            for line in exc.problems:
                print(f"error: {line}", file=sys.stderr)
            continue
        good.append(Path(d))
        print(f"rebuilt {d}/summary.json and {d}/report.md")
    if len(good) > 1:
        table = report.combined_table(good)
        print(table, end="")
        if args.out:
            Path(args.out).write_text(table)
    if bad:
        print(f"error: {bad} of {len(args.dirs)} folders could not be read (above); the others were rebuilt",
              file=sys.stderr)
    return 2 if bad else 0


def cmd_bench(args: argparse.Namespace) -> int:
    from sentinel import bench

    print(strictjson.dumps(bench.run_all(quick=args.quick), indent=2))
    return 0


def _budget_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-memory", type=float, default=None, metavar="GIB",
                   help="memory budget in GiB (default: this machine's available memory)")
    p.add_argument("--force", action="store_true", help="run even if the memory estimate exceeds the budget")


def _run_flags(r: argparse.ArgumentParser) -> None:
    """The flags of `run`, shared by `validate` (which checks them without running)."""
    r.add_argument("scenario")
    r.add_argument("--out", help="result folder (default: runs/NAME-TIMESTAMP)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key")
    r.add_argument("--backend", choices=["sim", "dist"], default="sim")
    r.add_argument("--nproc", type=int, default=None,
                   help="processes for --backend dist (default: one per worker plus one verifier per boundary)")
    r.add_argument("--verifiers", type=int, default=None, metavar="V",
                   help="dist: verifier processes (default: one per stage boundary, as --nproc allows)")
    r.add_argument("--timeout", type=float, default=60.0, help="dist: seconds before a silent rank counts as stalled")
    r.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="checkpoint every N steps")
    r.add_argument("--resume", metavar="DIR", help="resume from the newest checkpoint of a previous run folder")
    r.add_argument("--device", choices=["cpu", "cuda", "auto"], default=None, help="dist: compute device (cpu)")
    _budget_flags(r)


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sentinel", description="Testbed for the security of decentralized pipeline-parallel training.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run a scenario (plus its twins) and write a result folder")
    _run_flags(r)
    r.add_argument("--quiet", action="store_true", help="no progress output")
    r.set_defaults(fn=cmd_run)
    v = sub.add_parser("validate", help="check a scenario (and run's flags) as `run` and `sweep` would; exit 2 "
                       "with located errors; print the cost estimate")
    _run_flags(v)
    v.set_defaults(fn=cmd_validate)
    ls = sub.add_parser("list", help="registered plugins")
    ls.add_argument("kind", nargs="?")
    ls.set_defaults(fn=cmd_list)
    d = sub.add_parser("describe", help="a plugin's parameters and docs (NAME or KIND/NAME); `scenario` lists "
                       "every scenario key with its default and range")
    d.add_argument("name")
    d.set_defaults(fn=cmd_describe)
    sw = sub.add_parser("sweep", help="run the scenario's sweep.grid (resumable); one table and plots")
    sw.add_argument("scenario")
    sw.add_argument("--out", help="sweep folder (default: runs/NAME-sweep-TIMESTAMP); rerun it to resume")
    sw.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sw.add_argument("--jobs", type=int, default=None, help="parallel processes, one thread each (default: one per core)")
    _budget_flags(sw)
    sw.set_defaults(fn=cmd_sweep)
    rp = sub.add_parser("report", help="rebuild summary and report of saved result folders; combine several")
    rp.add_argument("dirs", nargs="+")
    rp.add_argument("--out", help="write the combined table (markdown) here")
    rp.set_defaults(fn=cmd_report)
    b = sub.add_parser("bench", help="performance benchmarks, printed as JSON ratios")
    b.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    b.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    except SentinelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # stdout closed early (`sentinel describe scenario | head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # the disk or the system failed us mid-command (full disk, lost mount): not bad input
        print(f"error: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; partial results (if any) were saved", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
