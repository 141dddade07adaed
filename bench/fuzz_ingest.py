"""Fuzzing the ingest port of a real collector while a real agent ships to it
(tests/faults/ingestfuzz.py says how).

    python3 -m bench.fuzz_ingest --frames 1000000      # the long run of bench/RESULTS.md
    python3 -m bench.fuzz_ingest --frames 30000 --read-timeout 3   # about what CI runs

Prints the figures as JSON: frames and connections sent, what the fuzzers got back,
the collector's errors by code, its peak RSS (VmHWM), whether it stayed alive, the
idle and slowloris connections it closed, and the good agent's lines written, stored,
lost and duplicated. Exit status 1 when the collector died or a good line was lost or
duplicated.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tree's tests and firstfault, run as a file or -m

from tests.faults.ingestfuzz import run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1_000_000, help="mutated frames to send (default 1,000,000)")
    ap.add_argument("--workers", type=int, default=2, help="fuzzer processes (default 2)")
    ap.add_argument("--idle", type=int, default=1000, help="idle connections (default 1000)")
    ap.add_argument("--slowloris", type=int, default=50, help="slowloris connections at a time (default 50)")
    ap.add_argument("--rate", type=float, default=200.0, help="the good agent's lines per second (default 200)")
    ap.add_argument("--read-timeout", type=float, default=10.0, help="the collector's read timeout, s (default 10)")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (database, agent state)")
    args = ap.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ff-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        figures = run(work, frames=args.frames, workers=args.workers, idle=args.idle,
                      slowloris=args.slowloris, rate=args.rate, read_timeout_s=args.read_timeout)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    figures["wall_s"] = round(time.monotonic() - t0, 1)
    figures["command"] = "python3 -m bench.fuzz_ingest " + " ".join(argv if argv is not None else sys.argv[1:])
    print(json.dumps(figures, indent=1))
    ok = (figures["collector_alive"] and figures["good_lines_lost"] == 0
          and figures["good_lines_duplicated"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
