"""The `sentinel` command line.

Exit codes: 0 ok, 2 bad input (scenario, flags), 1 a run that failed for another reason.
Bad input never produces a traceback: errors are printed one per line, located.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from sentinel.errors import ConfigError, SentinelError
from sentinel.registry import REGISTRIES, did_you_mean, one_line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default exits 2 with usage; keep it, one line
        self.print_usage(sys.stderr)
        print(f"sentinel: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _default_out(name: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{name}-{stamp}"
    out, i = base, 1
    while out.exists():
        out, i = Path(f"{base}-{i}"), i + 1
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from sentinel import runner, scenario

    sc = scenario.load(args.scenario, args.set)
    out = Path(args.out) if args.out else _default_out(sc.name)
    if args.backend == "dist":
        from sentinel.dist.launch import launch, options_from_cli

        summary = launch(args.scenario, out, args.set, nproc=args.nproc, options=options_from_cli(args),
                         quiet=args.quiet)
    else:
        dist_only = [f for f in ("nproc", "checkpoint_every", "resume", "device") if getattr(args, f, None)]
        if dist_only:
            raise ConfigError(f"--{dist_only[0].replace('_', '-')}: only used with --backend dist")
        summary = runner.run(sc, out, progress=None if not args.quiet else False, backend=args.backend)
    t = summary["training"]
    print(
        f"{sc.name}: val loss {t['initial_val_loss']:.4f} -> {t['final_val_loss']:.4f} "
        f"in {summary['cost']['wall_s']:.1f} s; results in {out}"
    )
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from sentinel import scenario

    sc = scenario.load(args.scenario, args.set)
    for note in scenario.warnings_for(sc):
        print(f"warning: {note}", file=sys.stderr)
    print(f"{args.scenario}: ok ({sc.name}: {sc.num_workers} workers, {sc.training.steps} steps)")
    from sentinel.model import summary_line

    print(summary_line(sc))
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


def cmd_describe(args: argparse.Namespace) -> int:
    name = args.name
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
                print(f"  {p['name']}: {p['type']} = {p['default']!r}" + (f"  # {p['help']}" if p["help"] else ""))
        else:
            print("parameters: none")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from sentinel import sweep

    out = Path(args.out) if args.out else _default_out(Path(args.scenario).stem + "-sweep")
    rows = sweep.run_sweep(args.scenario, out, args.set, jobs=args.jobs)
    print((out / "sweep.md").read_text(), end="")
    print(f"{len(rows)} grid points; table and plots in {out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from sentinel.scoring import report

    for d in args.dirs:
        report.rebuild(Path(d))
        print(f"rebuilt {d}/summary.json and {d}/report.md")
    if len(args.dirs) > 1:
        table = report.combined_table([Path(d) for d in args.dirs])
        print(table, end="")
        if args.out:
            Path(args.out).write_text(table)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from sentinel import bench

    print(json.dumps(bench.run_all(quick=args.quick), indent=2))
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sentinel", description="Testbed for the security of decentralized pipeline-parallel training.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run a scenario (plus its twins) and write a result folder")
    r.add_argument("scenario")
    r.add_argument("--out", help="result folder (default: runs/NAME-TIMESTAMP)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key")
    r.add_argument("--backend", choices=["sim", "dist"], default="sim")
    r.add_argument("--nproc", type=int, default=None, help="processes for --backend dist (default: workers + 1)")
    r.add_argument("--timeout", type=float, default=60.0, help="dist: seconds before a silent rank counts as stalled")
    r.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="dist: checkpoint every N steps")
    r.add_argument("--resume", metavar="DIR", help="dist: resume from the checkpoints of a previous run folder")
    r.add_argument("--device", choices=["cpu", "cuda", "auto"], default=None, help="dist: compute device (cpu)")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    r.set_defaults(fn=cmd_run)
    v = sub.add_parser("validate", help="check a scenario file; exit 2 with located errors")
    v.add_argument("scenario")
    v.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    v.set_defaults(fn=cmd_validate)
    ls = sub.add_parser("list", help="registered plugins")
    ls.add_argument("kind", nargs="?")
    ls.set_defaults(fn=cmd_list)
    d = sub.add_parser("describe", help="a plugin's parameters and docs (NAME or KIND/NAME)")
    d.add_argument("name")
    d.set_defaults(fn=cmd_describe)
    sw = sub.add_parser("sweep", help="run the scenario's sweep.grid (resumable); one table and plots")
    sw.add_argument("scenario")
    sw.add_argument("--out", help="sweep folder (default: runs/NAME-sweep-TIMESTAMP); rerun it to resume")
    sw.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sw.add_argument("--jobs", type=int, default=None, help="parallel processes, one thread each (default: one per core)")
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
    except KeyboardInterrupt:
        print("interrupted; partial results (if any) were saved", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
