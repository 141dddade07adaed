"""Benchmark: what redaction (firstfault/common/redact.py) costs the agent per line.

The agent's sink calls ``Redactor.rows`` on every batch it spools (a poll's lines of one
source, here 1,000 rows of wire columns as ranklog makes them). Measured on one core, CPU
time per line, medians of REPEATS interleaved runs, for four mixes of ~150-byte
DeepSpeed-style lines:

  plain     no line holds a literal of any pattern (most of a training log)
  tokens    every line holds "tokens" (throughput prints: tokens_per_sec=...): each is
            searched by the keyword pattern, none is redacted
  secrets   one line in 100 holds a secret (an HF token in a launch command)
  regex     the same plain lines searched by every pattern's regex, no prefilter: what a
            redactor without it would cost (searching only)
  joined    Redactor.messages on ranklog's columns: the plain lines as bytes, joined again
  chunks    the same with each 1,000 lines' chunk as read (``chunks=``: what ranklog hands
            the sink since issue 24); ``chunks / joined`` per round is printed

    python3 -m bench.redact [--lines 200000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter

from firstfault.common.redact import Redactor

HF = "hf_" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1Bc4De7F"


def line(i: int, mix: str) -> str:
    base = (f"[2026-12-02 10:11:{i % 60:02d},782] [INFO] [logging.py:123:log_dist] [Rank {i % 8}] "
            f"step={i}, skipped=0, lr=[0.0001], loss={1 / (i + 1):.5f}")
    if mix == "tokens":
        return base + f", tokens_per_sec={81234 + i % 1000}"
    if mix == "secrets" and i % 100 == 0:
        return base + f" cmd = python train.py --hf_token {HF}"
    return base


def rows(lines: list[str]) -> list[tuple]:
    fields = {"path": "/scratch/job/rank0.log"}
    return [("ranklog", "rank.line", ln, None, 1796206319790113000, None, None, "12345", 0, 0,
             None, 6, fields) for ln in lines]


def per_line_us(fn, batches: list[list], n: int) -> float:
    t0 = time.process_time()
    for b in batches:
        fn(b)
    return (time.process_time() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    os.sched_setaffinity(0, {0})
    r = Redactor()
    mixes = {m: [rows([line(i, m) for i in range(s, s + 1000)]) for s in range(0, args.lines, 1000)]
             for m in ("plain", "tokens", "secrets")}
    def every(b: list) -> None:  # a redactor without the prefilter: every regex over every line
        for x in b:
            for p in r.patterns:
                p.regex.search(x[2])
    raw = [[x[2].encode() for x in b] for b in mixes["plain"]]
    chunked = [(m, [(0, len(m), b"\n".join(m))]) for m in raw]
    runs = {k: [] for k in ("plain", "tokens", "secrets", "regex", "joined", "chunks")}
    for _ in range(args.repeats):
        for m, batches in mixes.items():
            runs[m].append(per_line_us(lambda b: r.rows(b, Counter()), batches, args.lines))
        runs["regex"].append(per_line_us(every, mixes["plain"][:20], 20_000))
        runs["joined"].append(per_line_us(lambda m: r.messages(m, Counter()), raw, args.lines))
        runs["chunks"].append(per_line_us(lambda mc: r.messages(mc[0], Counter(), chunks=mc[1]),
                                          chunked, args.lines))
    ratios = [c / j for c, j in zip(runs["chunks"], runs["joined"])]
    out = {"date": time.strftime("%Y-%m-%d"), "lines": args.lines, "repeats": args.repeats,
           "us_per_line": {k: round(statistics.median(v), 3) for k, v in runs.items()},
           "chunks_to_joined": {"median": round(statistics.median(ratios), 2),
                                "min": round(min(ratios), 2), "max": round(max(ratios), 2)}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
