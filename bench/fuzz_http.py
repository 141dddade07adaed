"""Fuzzing the HTTP API of a real collector while a good agent ships to it and a prober
times /healthz (tests/collector/httpfuzz.py says how).

    python3 -m bench.fuzz_http --seconds 60 --workers 4     # the run of bench/RESULTS.md
    python3 -m bench.fuzz_http --seconds 6 --workers 2      # about what CI runs

Prints the figures as JSON: requests by route and status, 5xx answers (must be none), the
/healthz latency calm and attacked (p50, p99, max), the agent's batches and acks, the
collector's peak RSS, tracebacks in its log, whether it answers after. Exit status 1 when a
5xx came back, the collector died or logged a traceback, an ack was missed, or /healthz's
p99 under attack was 100 ms or more.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.collector.httpfuzz import run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to attack (default 60)")
    ap.add_argument("--workers", type=int, default=4, help="attacker processes (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ff-httpfuzz-"))
    t0 = time.monotonic()
    try:
        figures = run(work, seconds=args.seconds, workers=args.workers, seed=args.seed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures["wall_s"] = round(time.monotonic() - t0, 1)
    figures["command"] = "python3 -m bench.fuzz_http " + " ".join(argv if argv is not None else sys.argv[1:])
    print(json.dumps(figures, indent=1))
    ok = (not figures["server_errors"] and figures["collector_alive"] and not figures["tracebacks_in_log"]
          and figures["agent"]["error"] is None and figures["healthz"]["p99_ms"] < 100)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
