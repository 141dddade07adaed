"""Benchmark: what the agent's spool (firstfault/agent/spool/) costs per record.

Appends ~150-byte DeepSpeed-style rank lines (as Draft-shaped slotted objects,
what the sources hand over) in batches, under each fsync policy, then reads them
back as the shipper does (columns, and Records), and reopens the spool (the
recovery scan). Every scenario runs in a fresh child process so that its peak
RSS is its own; CPU is the child's process time (the flusher thread included).

    python3 bench/spool.py [--records 200000] [--dir /var/tmp] [--repeat 3]

Prints one line per scenario and a markdown table (medians of --repeat runs).
The inputs are built before the clock starts and frozen (gc.freeze()), as a
daemon that holds only a few batches at a time would see them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


from firstfault.agent.sources.base import Draft  # noqa: E402  (after the sys.path line)


def lines(n: int, seed: int = 7) -> list[tuple]:
    """``n`` (message, occurred_ns, rank) of rank lines as DeepSpeed 0.19 prints them."""
    rnd, t0, out = random.Random(seed), 1796206319782000000, []
    for i in range(n):
        step, rank = i // 8, i % 8
        ts = t0 + i * 1_250_000
        stamp = (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts // 10**9))
                 + f",{ts // 10**6 % 1000:03d}")
        k = i % 3
        if k == 0:
            msg = (f"[{stamp}] [INFO] [logging.py:107:log_dist] [Rank {rank}] step={step}, "
                   f"skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]")
        elif k == 1:
            msg = (f"[{stamp}] [INFO] [timer.py:264:stop] epoch=0/micro_step={step}/global_step="
                   f"{step}, RunningAvgSamplesPerSec={180 + rnd.random():.6f}")
        else:
            msg = (f"step {step} loss {2.5 / (1 + step / 500) + rnd.random() * 0.05:.4f} lr "
                   f"0.0001 tokens/s {48000 + rnd.randrange(4000)} rank {rank} grad_norm "
                   f"{rnd.random():.4f}")
        out.append((msg, ts, rank))
    return out


PATHS = [f"/var/log/train/12345/rank{r}.log" for r in range(8)]


def drafts(src: list[tuple], i: int, n: int) -> list[Draft]:
    """Drafts for lines i .. i+n, built now, as a source hands them over."""
    return [Draft(source="ranklog", kind="rank.line", message=msg, occurred_ns=ts,
                  observed_ns=ts + 8_113_000, job="12345", rank=rank, local_rank=rank,
                  pid=24211 + rank, fields={"path": PATHS[rank], "offset_bytes": j * 150})
            for j, (msg, ts, rank) in enumerate(src[i:i + n], i)]


def _usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_maxrss


def one(args: dict) -> dict:
    """Run one scenario in this process; the figures as a dict.

    Only the append calls are timed (CPU of the whole process, so the flusher
    thread counts): the drafts of each batch are built just before it, untimed.
    """
    from firstfault.agent.spool import COLUMNS, Spool

    n, batch, fsync = args["records"], args["batch"], args["fsync"]
    src = lines(n)
    path = tempfile.mkdtemp(prefix="spoolbench-", dir=args["dir"])
    gc.freeze()  # the generated input is not the spool's garbage
    try:
        sp = Spool(path, node="gpu-07", max_bytes=4 << 30, fsync=fsync,
                   fsync_interval_ms=100, validate=args["validate"])
        wall = cpu = 0.0
        for i in range(0, n, batch):
            recs = drafts(src, i, batch)
            if args["tuples"]:
                recs = [tuple(getattr(d, c) for c in COLUMNS) for d in recs]
            c0, t0 = time.process_time(), time.perf_counter()
            sp.append(recs)
            wall += time.perf_counter() - t0
            cpu += time.process_time() - c0
        if fsync == "interval":  # the flusher's CPU after the last append
            c0 = time.process_time()
            time.sleep(0.25)
            cpu += time.process_time() - c0
        st = sp.stats()
        res = {"append_wall_s": wall, "append_cpu_s": cpu, "bytes": st.bytes,
               "fsyncs": st.fsyncs}
        if args["read"]:
            sp.close()
            t0 = time.perf_counter()
            sp = Spool(path, node="gpu-07", max_bytes=4 << 30, fsync="never")
            res["open_s"] = time.perf_counter() - t0
            for name, fn in (("cols", sp.read_batch_after), ("records", sp.read_after)):
                c0, t0, after, got = time.process_time(), time.perf_counter(), None, 0
                while b := fn(after, 10_000):
                    if name == "cols":
                        got, after = got + len(b.seqs), b.seqs[-1]
                    else:
                        got, after = got + len(b), b[-1].seq
                assert got == n, (got, n)
                res[f"read_{name}_wall_s"] = time.perf_counter() - t0
                res[f"read_{name}_cpu_s"] = time.process_time() - c0
        sp.close()
        res["maxrss_kib"] = _usage()[1]
        return res
    finally:
        shutil.rmtree(path, ignore_errors=True)


def baseline(args: dict) -> dict:
    """The same loop with no spool: what building the drafts costs, and its RSS."""
    n, batch = args["records"], 1000
    src = lines(n)
    gc.freeze()
    c0 = time.process_time()
    for i in range(0, n, batch):
        drafts(src, i, batch)
    return {"append_wall_s": 0.0, "append_cpu_s": time.process_time() - c0, "bytes": 0,
            "fsyncs": 0, "maxrss_kib": _usage()[1]}


def pieces() -> list[tuple[str, float]]:
    """CPU µs per record of each step of append and read, batches of 1000, best of 7."""
    import timeit

    import msgpack

    from firstfault import wire
    from firstfault.agent.spool.encode import _row
    from firstfault.agent.spool.format import COLUMNS, HEADER_BYTES, encode_entry, entry_at

    recs = drafts(lines(1000), 0, 1000)
    rows = list(map(_row, recs))
    cols = list(zip(*rows))
    payload = msgpack.packb([1000, *cols])
    entry = encode_entry(1, payload)
    obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    batch = wire.BatchColumns("gpu-07", "s", range(1, 1001), dict(zip(COLUMNS, obj[1:])))
    steps = [
        ("append: Draft -> row (attrgetter)", lambda: list(map(_row, recs))),
        ("append: rows -> columns (zip)", lambda: list(zip(*rows))),
        ("append: wire checks (validate=True)", lambda: wire._check_batch(
            {"node": "n", "stream": "s", "count": 1000, "seq": 0,
             "cols": dict(zip(COLUMNS, map(list, cols)))})),
        ("append: msgpack pack of the columns", lambda: msgpack.packb([1000, *cols])),
        ("append: header + crc32", lambda: encode_entry(1, payload)),
        ("read: crc32 check", lambda: entry_at(entry, 0, 0, None)),
        ("read: msgpack unpack of the columns", lambda: msgpack.unpackb(
            memoryview(entry)[HEADER_BYTES:], raw=False, strict_map_key=False)),
        ("read: columns -> Records (read_after)", lambda: batch.records()),
    ]
    return [(name, min(timeit.repeat(fn, number=20, repeat=7)) / 20 / 1000 * 1e6)
            for name, fn in steps]


SCENARIOS = [
    # name, batch, fsync, validate, tuples, read, share of --records
    ("baseline: build the drafts only", 0, "never", False, False, False, 1.0),
    ("append 1000/batch, fsync never, validate", 1000, "never", True, False, True, 1.0),
    ("append 1000/batch, fsync never, no validate", 1000, "never", False, False, False, 1.0),
    ("append 1000/batch, tuples, no validate", 1000, "never", False, True, False, 1.0),
    ("append 1000/batch, fsync interval 100 ms", 1000, "interval", True, False, False, 1.0),
    ("append 1000/batch, fsync always", 1000, "always", True, False, False, 1.0),
    ("append 100/batch, fsync always", 100, "always", True, False, False, 0.25),
    ("append 1/batch, fsync never", 1, "never", True, False, False, 0.25),
    ("append 1/batch, fsync always", 1, "always", True, False, False, 0.01),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--pieces", action="store_true", help="only the per-step costs")
    a = ap.parse_args()
    if a.pieces or not a.one:
        print("| step (1000 records a batch, best of 7) | CPU µs / record |\n|---|---|")
        for name, us in pieces():
            print(f"| {name} | {us:.2f} |")
        print(flush=True)
        if a.pieces:
            return
    if a.one:
        args = json.loads(a.one)
        print(json.dumps(baseline(args) if args["batch"] == 0 else one(args)))
        return
    rows = []
    for name, batch, fsync, validate, tuples, read, share in SCENARIOS:
        n = max(1000, int(a.records * share))
        args = {"records": n, "batch": batch, "fsync": fsync, "validate": validate,
                "tuples": tuples, "read": read, "dir": a.dir}
        runs = []
        for _ in range(a.repeat):
            out = subprocess.run([sys.executable, __file__, "--one", json.dumps(args)],
                                 check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out))
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows.append((name, n, med))
        print(name, n, json.dumps({k: round(v, 4) for k, v in med.items()}), flush=True)
    base, base_rss = rows[0][2]["append_cpu_s"] / rows[0][1], rows[0][2]["maxrss_kib"]
    print("\n| scenario | records | records/s | MB/s | CPU µs/record | fsyncs | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for name, n, m in rows[1:]:
        print(f"| {name} | {n:,} | {n / m['append_wall_s']:,.0f} | "
              f"{m['bytes'] / m['append_wall_s'] / 1e6:.1f} | "
              f"{m['append_cpu_s'] / n * 1e6:.2f} | {m['fsyncs']:.0f} | "
              f"{m['maxrss_kib'] / 1024:.0f} |")
    for name, n, m in rows:
        if "read_cols_wall_s" in m:
            print(f"\nread back {n:,} records ({m['bytes'] / 1e6:.1f} MB on disk): "
                  f"open (recovery scan) {m['open_s'] * 1e3:.0f} ms = "
                  f"{m['bytes'] / m['open_s'] / 1e6:.0f} MB/s; "
                  f"read_batch_after (columns) {n / m['read_cols_wall_s']:,.0f} records/s, "
                  f"{m['read_cols_cpu_s'] / n * 1e6:.2f} CPU µs/record; "
                  f"read_after (Records) {n / m['read_records_wall_s']:,.0f} records/s, "
                  f"{m['read_records_cpu_s'] / n * 1e6:.2f} CPU µs/record")
    print(f"\nbaseline (not in the figures above): building one Draft costs {base * 1e6:.2f} "
          f"CPU µs; a child that only builds them, 1000 at a time, peaks at "
          f"{base_rss / 1024:.0f} MiB RSS, so the spool's own memory is the difference")


if __name__ == "__main__":
    main()
