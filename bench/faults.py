"""Fault injection on the real daemons: what survives kill -9, cut links, half-open connections,
a full spool disk, wall-clock steps and rotation storms (tests/faults/harness.py says how).

    sudo python3 -m bench.faults                       # the long run of bench/RESULTS.md
    sudo python3 -m bench.faults --faults 12 --rate 100 --seed 1   # what CI runs (tests/faults)

Prints one line per fault (kind, how long, recovery time), then the figures: lines
written and stored, faults by kind with their recovery times (from the fault's end until
a line written after it is stored at the collector), lost and duplicated lines, how many
of them an explicit gap record accounts for, and the gap records by kind and reason.
``--json`` prints the figures as JSON instead. Needs root and a C compiler.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tree's tests and firstfault, run as a file or -m

from tests.faults.harness import Rig, cannot_run, plan, summary  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=120, help="faults to inject (default 120)")
    ap.add_argument("--seed", type=int, default=12, help="the schedule's seed (default 12)")
    ap.add_argument("--rate", type=float, default=250.0,
                    help="lines per second per rank log, 8 logs (default 250)")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (logs, database, daemon logs)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    why = cannot_run()
    if why:
        print(f"bench/faults.py: {why}", file=sys.stderr)
        return 2
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ff-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        with Rig(work, rate=args.rate) as rig:
            rig.run(plan(args.seed, args.faults), log=lambda s: print(s, file=sys.stderr, flush=True))
            figures = summary(rig, rig.count())
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(render(figures, args))
    return 0 if figures["lost_outside_gaps"] == 0 and figures["duplicated_outside_gaps"] == 0 else 1


def render(f: dict, args) -> str:
    out = [f"seed {args.seed}, {f['faults']} faults, 8 rank logs at {args.rate:g} lines/s each, "
           f"{f['seconds']} s of writing",
           f"lines written {f['lines_written']:,}, stored {f['lines_stored']:,}",
           f"lost {f['lost']:,} ({f['lost_in_gaps']:,} in explicit gaps, "
           f"{f['lost_outside_gaps']:,} outside); duplicated {f['duplicated']:,} "
           f"({f['duplicated_outside_gaps']:,} outside gaps)",
           f"gap records {f['gap_records'] or 'none'}; lines the spool's gaps declare lost "
           f"{f['gap_lines_declared']:,}",
           f"rotations {f['rotations']}; agent started {f['agent_starts']}x, collector "
           f"{f['collector_starts']}x; drained {f['drain_s']} s after the writers stopped",
           "", "| fault | n | recovered | median recovery s | max s |", "|---|---|---|---|---|"]
    for k, v in f["by_kind"].items():
        out.append(f"| {k} | {v['n']} | {v['recovered']} | {v['median_s']} | {v['max_s']} |")
    if f["examples"]:
        out += ["", "examples:"] + [f"  {e}" for e in f["examples"]]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
