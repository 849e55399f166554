"""Detector evaluation on scenario files: the attacked run and its clean twin, both defended.

For each scenario: the scenario as written but with the chosen detector (closed loop), and the same
scenario with no attack (the clean twin, same detector) for the false-positive rate and false bans an
honest run suffers. Metrics come from the scorer (`sentinel.scoring.metrics`), the only code that
reads ground truth.

    python -m sentinel.detectors.evaluation scenarios/paper/*.yaml [--set detector.k=4] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from sentinel import scenario as scenario_mod
from sentinel import strictjson
from sentinel.errors import ConfigError


def _train(sc):
    from sentinel.runner import build_engine, malicious_workers

    engine = build_engine(sc)
    t0 = time.perf_counter()
    engine.run()
    return engine, malicious_workers(engine), time.perf_counter() - t0


def evaluate(sc) -> dict:
    """One table row: message / worker metrics of the attacked run, FPR and false bans of the clean twin."""
    from sentinel.scoring.metrics import message_metrics, worker_metrics

    engine, malicious, wall = _train(sc)
    msg, wrk = message_metrics(engine.log), worker_metrics(engine.log, malicious)
    clean_sc = dataclasses.replace(sc, adversary=dataclasses.replace(sc.adversary, attacks=()))
    clean, _, _ = _train(clean_sc)
    cmsg, cwrk = message_metrics(clean.log), worker_metrics(clean.log, [])
    return {
        "scenario": sc.name, "malicious": malicious,
        "msg_precision": msg["precision"], "msg_recall": msg["recall"], "msg_f1": msg["f1"], "msg_fpr": msg["fpr"],
        "worker_precision": wrk["precision"], "worker_recall": wrk["recall"], "worker_f1": wrk["f1"],
        "median_steps_to_ban": wrk["median_steps_to_ban"], "false_bans": wrk["false_bans"],
        "banned": wrk["banned"], "clean_fpr": cmsg["fpr"], "clean_false_bans": cwrk["false_bans"],
        "detector_s": engine.transport.verifier_s, "wall_s": wall,
    }


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


COLUMNS = ("scenario", "msg_precision", "msg_recall", "msg_f1", "worker_precision", "worker_recall", "worker_f1",
           "median_steps_to_ban", "false_bans", "clean_fpr", "clean_false_bans")


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenarios", nargs="+")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--detector", default="sentinel")
    p.add_argument("--json", help="also write the rows as JSON here")
    args = p.parse_args(argv)
    rows = []
    for path in args.scenarios:
        try:
            sc = scenario_mod.load(path, [f"detector.name={args.detector}", "scoring.twins=[]", *args.set])
        except ConfigError as exc:  # one bad combination of file and overrides must not sink the table
            print(f"{path}: skipped: {exc}", file=sys.stderr)
            continue
        rows.append(evaluate(sc))
        print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            f.write(strictjson.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
