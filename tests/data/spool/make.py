"""Write format1/: a spool as the agent's code of main at 0a3032a (before the spool became the
package firstfault/agent/spool/) wrote it, and expected.json: what that code read back.

Run with the old code first on the path, from a checkout of that commit:
    PYTHONPATH=/path/to/checkout python3 tests/data/spool/make.py
It writes rows and columns (runs, bytes messages), overflows once (a gap record), acks part,
and closes cleanly. tests/agent/spool/test_old_spool.py opens it with today's code.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from firstfault.agent.columns import Columns, Runs  # the old module paths, on purpose
from firstfault.agent.spool import Spool

HERE = Path(__file__).resolve().parent
T0 = 1796206319790113000


def row(i: int) -> tuple:
    return ("ranklog", "rank.line", f"[Rank {i % 4}] step={i} loss={2.5 - i / 1000:.3f}",
            T0 + i * 10**6 - 8_113_000, T0 + i * 10**6, None, None, "12345", i % 4, i % 4,
            24211 + i % 4, 6, {"offset_bytes": i * 150})


def main() -> None:
    out = HERE / "format1"
    shutil.rmtree(out, ignore_errors=True)
    with Spool(out, node="gpu-07", max_bytes=24 << 10, segment_bytes=4096, fsync="always") as sp:
        for i in range(0, 240, 12):
            sp.append([row(j) for j in range(i, i + 12)])
        n = 40
        cols = [Runs([["ranklog", n]]), Runs([["rank.line", n]]),
                [f"line {k} of rank3.log".encode() for k in range(n)], [None] * n,
                [T0 + 10**9 + k for k in range(n)], Runs([[None, n]]), Runs([[None, n]]),
                Runs([["12345", n]]), Runs([[3, n]]), Runs([[3, n]]), Runs([[24214, n]]),
                Runs([[6, n]]), Runs([[{"path": "/logs/rank3.log"}, n]])]
        sp.append_columns(Columns(n, cols))
        sp.append([("kmsg", "kernel.oom_kill", "Memory cgroup out of memory: Killed process 24215",
                    None, T0 + 2 * 10**9, "0f3c6d1e-0000-4000-8000-000000000000", 5 * 10**12,
                    None, None, None, 24215, 3, {"pid": 24215})])
        last = sp.stats().last_seq
        acked = 150  # the overflow gaps (seqs after 240) stay unacked
        sp.ack(acked)
        records, after = [], acked
        while recs := sp.read_after(after, max_records=100):
            records += [dataclasses.asdict(r) for r in recs]
            after = recs[-1].seq
        stream = sp.stream
    (HERE / "expected.json").write_text(json.dumps(
        {"node": "gpu-07", "stream": stream, "acked_seq": acked, "last_seq": last,
         "records_after_ack": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
