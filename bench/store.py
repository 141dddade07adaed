"""Benchmark: the collector's stores, SQLite (firstfault/collector/store/sqlite.py) and PostgreSQL
(firstfault/collector/store/postgres.py).

Inserts N realistic records (DeepSpeed-style rank lines of ~150 bytes from RANKS
ranks on NODES nodes, one agent stream per node, a jobless kernel or cgroup record
every 200th) in wire batches of BATCH records through ``insert_columns`` (what the
ingest server calls, with the columns' bytes as the frame carried them), pinned to
one core. The same batches go, interleaved batch
by batch so that the machine's noise hits every variant alike, into the shipped
store (blocks marked for reports), one without a marker, and one with
synchronous=FULL. Then it times ``firstfault report`` of the whole job (query.report)
from the marks and from every record, and reads the shipped store back: a whole
job streamed through ``records``, a rank, a grep, the first page, and prunes half
of it by size.

With ``--postgres`` the same batches go into a PostgresStore on a private server
(tests/collector/pg_server.py, started here) or on ``--pg-url``, and the same reads
run on it; for a private server the CPU time of its processes (the backend, the WAL
writer, the checkpointer...) is measured beside the bench's own.

    python3 bench/store.py [--records 1000000] [--batch 10000] [--ranks 8] [--nodes 2]
                           [--variants shipped,no-marks,full-sync] [--out bench/out] [--keep]
                           [--postgres [--pg-url URL]]

Prints a Markdown table for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgpack  # noqa: E402

from firstfault import wiredecode  # noqa: E402
from firstfault.analysis.catalog import load_catalog  # noqa: E402
from firstfault.analysis.reads import ReportMarker  # noqa: E402
from firstfault.collector import query  # noqa: E402
from firstfault.collector.store.base import Selection  # noqa: E402
from firstfault.collector.store.sqlite import COLUMNS, SqliteStore  # noqa: E402
from firstfault.wire import Record  # noqa: E402

CATALOG = load_catalog()

T0 = 1_796_206_319_782_000_000
JOB = "48213"

# name -> (what it is, keyword arguments of SqliteStore); "shipped" is the store as
# firstfault/collector/daemon.py opens it.
VARIANTS = {
    "shipped": ("blocks + report marks (ReportMarker)", {"marker": True}),
    "no-marks": ("blocks, no marker", {}),
    "full-sync": ("shipped, power_safe=True (synchronous=FULL)", {"marker": True, "power_safe": True}),
}

_STAMP_CACHE: dict[int, str] = {}


def _stamp(t_ns: int) -> str:
    s = t_ns // 10**9
    base = _STAMP_CACHE.get(s)
    if base is None:
        base = _STAMP_CACHE[s] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s))
    return f"{base},{t_ns // 10**6 % 1000:03d}"


def _line(rank: int, step: int, t: int, rnd: random.Random) -> str:
    """A line as DeepSpeed 0.19 and a training script print them (~150 bytes on average)."""
    k = rnd.random()
    if k < 0.35:
        return (f"[{_stamp(t)}] [INFO] [logging.py:107:log_dist] [Rank {rank}] step={step}, "
                f"skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]")
    if k < 0.65:
        return (f"[{_stamp(t)}] [INFO] [timer.py:264:stop] epoch=0/micro_step={step}/"
                f"global_step={step}, RunningAvgSamplesPerSec={180 + rnd.random():.6f}, "
                f"CurrSamplesPerSec={181 + rnd.random():.6f}, MemAllocated=21.33GB, "
                "MaxMemAllocated=27.9GB")
    if k < 0.97:
        loss = 2.5 / (1 + step / 500) + rnd.random() * 0.05
        return (f"[rank{rank}]: epoch 0 step {step} loss {loss:.4f} "
                f"lr 0.0001 tokens/s {48000 + rnd.randrange(4000)} grad_norm {rnd.random():.3f} "
                f"mem 21.33GiB/79.10GiB data_time 0.0{rnd.randrange(10)}s")
    return (f"[{_stamp(t)}] [WARNING] [stage3.py:2171:step] 1 pytorch allocator cache flushes "
            "since last step. this happens when there is high memory pressure and is "
            "detrimental to performance.")


def batches(n: int, batch: int, ranks: int, nodes: int):
    """(node, stream, seqs, cols) wire batches, round-robin over the nodes' streams."""
    rnd = random.Random(42)
    per_node = max(1, ranks // nodes)
    seq = [0] * nodes
    t = [T0] * nodes
    made = 0
    b = 0
    while made < n:
        k = b % nodes
        node, count = f"gpu-{k + 1:02d}", min(batch, n - made)
        cols: dict[str, list] = {c: [] for c in COLUMNS}
        for i in range(count):
            t[k] += rnd.randrange(200_000, 1_800_000)  # ~1000 lines/s per node
            s = seq[k] + i
            if s % 200 == 199:
                kernel = s % 400 == 399
                row = ("kmsg" if kernel else "cgroup", "kernel.line" if kernel else "cgroup.memory",
                       "NVRM: Xid (PCI:0000:3b:00): 79, pid=24211, GPU has fallen off the bus."
                       if kernel else "", t[k], t[k] + 3_000_000, "b7e1" if kernel else None,
                       s * 1000 if kernel else None, None, None, None, None, 4,
                       {"kmsg_seq": s} if kernel
                       else {"usage_bytes": 7 << 30, "limit_bytes": 8 << 30})
            else:
                rank = k * per_node + i % per_node
                row = ("ranklog", "rank.line", _line(rank, s // per_node, t[k], rnd), t[k],
                       t[k] + 8_000_000, None, None, JOB, rank, rank % per_node, 24000 + rank,
                       6, {})
            for c, v in zip(COLUMNS, row):
                cols[c].append(v)
        yield node, "stream-" + node, range(seq[k], seq[k] + count), cols
        seq[k] += count
        made += count
        b += 1


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def bench_inserts(args, out: Path) -> dict:
    stores = {}
    for name in args.variants:
        path = out / f"{name}.db"
        for p in out.glob(f"{name}.db*"):
            p.unlink()
        kw = dict(VARIANTS[name][1])
        if kw.pop("marker", False):
            kw["marker"] = ReportMarker(CATALOG)
        stores[name] = SqliteStore(path, **kw)
    cpu = dict.fromkeys(stores, 0.0)
    wall = dict.fromkeys(stores, 0.0)
    names = list(stores)
    for i, (node, stream, seqs, cols) in enumerate(
            batches(args.records, args.batch, args.ranks, args.nodes)):
        cols = as_received(node, stream, seqs, cols)
        for name in names[i % len(names):] + names[:i % len(names)]:
            c0, w0 = time.process_time(), time.perf_counter()
            new = stores[name].insert_columns(node, stream, seqs, cols)
            cpu[name] += time.process_time() - c0
            wall[name] += time.perf_counter() - w0
            assert new == len(seqs), (name, new)
    result = {}
    for name, s in stores.items():
        s.close()
        result[name] = (cpu[name], wall[name], _size(out / f"{name}.db"))
    return result


def as_received(node: str, stream: str, seqs: range, cols: dict) -> dict:
    """The batch's columns as the ingest server hands them over: a wire frame decoded
    with its columns' bytes (wire.PackedColumns; not timed: the server's work)."""
    body = msgpack.packb({"type": "batch", "node": node, "stream": stream, "count": len(seqs),
                          "seq": seqs.start, "cols": cols})
    return wiredecode.decode_batch_columns(len(body).to_bytes(4, "big") + body).cols


def bench_records_path(args, out: Path) -> float:
    """CPU s of insert(records) (Record objects built outside the timing) into a fresh store."""
    path = out / "records-path.db"
    for p in out.glob("records-path.db*"):
        p.unlink()
    spent = 0.0
    with SqliteStore(path) as s:
        for node, stream, seqs, cols in batches(args.records // 4, args.batch, args.ranks,
                                                args.nodes):
            recs = [Record(node=node, stream=stream, seq=q, **dict(zip(COLUMNS, row)))
                    for q, row in zip(seqs, zip(*cols.values()))]
            c0 = time.process_time()
            s.insert(recs)
            spent += time.process_time() - c0
    for p in out.glob("records-path.db*"):
        p.unlink()
    return spent


def timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    r = fn()
    return r, time.process_time() - c0, time.perf_counter() - w0


def bench_reports(out: Path) -> list[tuple[str, int, float, float, str]]:
    """query.report of the whole job: from marks (shipped) and from every record."""
    rows = []
    for label, name in (("report, from marks", "shipped"), ("report, every record", "no-marks")):
        if not (out / f"{name}.db").exists():
            continue
        with SqliteStore(out / f"{name}.db") as s:
            rss0 = _rss_mib()
            rep, cpu, wall = timed(lambda: query.report(s, JOB, CATALOG))
            n = sum(1 for _ in query.needed_records(s, Selection(job=JOB), ReportMarker(CATALOG).name))
            rows.append((label, n, cpu, wall, f"RSS +{_rss_mib() - rss0:.0f} MiB, "
                         f"{len(rep['ranks'])} ranks, first failure "
                         f"{(rep['first_failure'] or {}).get('signature')}"))
    return rows


def _server_cpu(data: Path | None) -> float:
    """CPU seconds (user + system) of the server whose data directory is ``data``: its
    postmaster and every process it started that is still running (0 if unknown)."""
    if data is None:
        return 0.0
    top = int((data / "postmaster.pid").read_text().split()[0])
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat.parent.name) == top or int(f[1]) == top:  # f[1]: ppid
            total += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def bench_postgres(args, data: Path | None, url: str) -> list[str]:
    """Insert the batches into a PostgresStore that marks (as the collector's does),
    then read it back; Markdown lines."""
    from firstfault.collector.store.postgres import PostgresStore

    lines = []
    with PostgresStore(url, marker=ReportMarker(CATALOG)) as s:
        cpu = wall = 0.0
        srv0 = _server_cpu(data)
        for node, stream, seqs, cols in batches(args.records, args.batch, args.ranks, args.nodes):
            c0, w0 = time.process_time(), time.perf_counter()
            assert s.insert_columns(node, stream, seqs, cols) == len(seqs)
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
        srv = _server_cpu(data) - srv0
        n = args.records
        disk = sum(s._conn().execute(f"SELECT pg_total_relation_size('{t}')").fetchone()[0]
                   for t in ("blocks", "marks"))
        lines += ["| store (marks at insert) | CPU µs/record, this process | CPU µs/record, server | records/s (wall) "
                  "| disk bytes/record | used_bytes / disk |", "|---|---|---|---|---|---|",
                  f"| PostgresStore, batches of {args.batch:,} | {cpu / n * 1e6:.2f} | "
                  f"{srv / n * 1e6:.2f} | {n / wall:,.0f} | {disk / n:.0f} | "
                  f"{s.used_bytes() / disk:.2f} |", ""]
        lines += ["| read | records | CPU s | server CPU s | wall s | note |",
                  "|---|---|---|---|---|---|"]
        srv0 = _server_cpu(data)
        rep, cpu, wall = timed(lambda: query.report(s, JOB, CATALOG))
        marked = sum(1 for _ in query.needed_records(s, Selection(job=JOB), ReportMarker(CATALOG).name))
        lines.append(f"| report from the marks ({marked:,} records read) | {s.job(JOB).records:,} | {cpu:.2f} | "
                     f"{_server_cpu(data) - srv0:.2f} | {wall:.2f} | first failure "
                     f"{(rep['first_failure'] or {}).get('signature')} |")
        for label, n, cpu, wall, note, server in bench_reads(s, lambda: _server_cpu(data)):
            rate = f" ({n / wall:,.0f}/s)" if n > 1000 and wall else ""
            lines.append(f"| {label} | {n:,}{rate} | {cpu:.2f} | {server:.2f} | {wall:.2f} | "
                         f"{note} |")
    return lines


def bench_reads(s, server_cpu=lambda: 0.0) -> list[tuple[str, int, float, float, str, float]]:
    """Reads of the store ``s``: (label, records, CPU s, wall s, note, server CPU s)."""
    rows = []

    def stream_all(sel):
        n, rss0, peak = 0, _rss_mib(), 0.0
        for _ in s.records(sel):
            n += 1
            if n % 100_000 == 0:
                peak = max(peak, _rss_mib() - rss0)
        return n, peak

    def run(label, fn, note):
        s0 = server_cpu()
        r, cpu, wall = timed(fn)
        n, text = note(r)
        rows.append((label, n, cpu, wall, text, server_cpu() - s0))
    for label, sel in (("whole job", Selection(job=JOB)),
                       ("one rank", Selection(job=JOB, ranks=(3,))),
                       ("grep 'allocator cache'", Selection(job=JOB, grep="allocator cache")),
                       ("grep 'allocator cache' (regex: not plain)",
                        Selection(job=JOB, grep="allocator cach[e]")),
                       ("first 1000", Selection(job=JOB, limit=1000)),
                       ("everything, no job", Selection())):
        run(label, lambda: stream_all(sel), lambda r: (r[0], f"RSS +{r[1]:.0f} MiB"))
    run("jobs()", s.jobs, lambda info: (len(info), f"{info[0].records} records"))
    run("high_seq() x1000", lambda: [s.high_seq("gpu-01", "stream-gpu-01") for _ in range(1000)],
        lambda _: (1000, ""))
    used = s.used_bytes()
    run("prune to half the bytes", lambda: s.prune(max_age_s=None, max_bytes=used // 2),
        lambda n: (n, f"{used / 2**20:.0f} -> {s.used_bytes() / 2**20:.0f} MiB live"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--cpu", type=int, default=0, help="the core to pin to")
    ap.add_argument("--out", default="bench/out/store")
    ap.add_argument("--keep", action="store_true", help="keep the database files")
    ap.add_argument("--postgres", action="store_true",
                    help="also the PostgreSQL store, on a private server started here")
    ap.add_argument("--pg-url", metavar="URL", help="with --postgres: an existing, empty database")
    ap.add_argument("--pg-cpu", type=int, default=1, help="the core to pin a private server to")
    args = ap.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    if "shipped" not in args.variants or not set(args.variants) <= set(VARIANTS):
        ap.error(f"--variants: must include shipped; known: {', '.join(VARIANTS)}")
    os.sched_setaffinity(0, {args.cpu})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    sample = next(batches(1000, 1000, args.ranks, args.nodes))[3]["message"]
    print(f"# {args.records:,} records, batches of {args.batch:,}, {args.ranks} ranks on "
          f"{args.nodes} nodes, mean message {sum(map(len, sample)) / len(sample):.0f} bytes, "
          f"pinned to CPU {args.cpu}, SQLite {__import__('sqlite3').sqlite_version}, "
          f"Python {sys.version.split()[0]}\n")
    res = bench_inserts(args, out)
    base = res["shipped"][0]
    print("| variant | indexes | CPU µs/record | records/s (CPU) | records/s (wall) "
          "| DB bytes/record |")
    print("|---|---|---|---|---|---|")
    for name, (cpu, wall, size) in res.items():
        n = args.records
        print(f"| {name} | {VARIANTS[name][0]} | {cpu / n * 1e6:.2f} ({cpu / base - 1:+.0%}) | "
              f"{n / cpu:,.0f} | {n / wall:,.0f} | {size / n:.0f} |")
    spent = bench_records_path(args, out)
    print(f"\ninsert(records) instead of insert_columns, {args.records // 4:,} records: "
          f"{spent / (args.records // 4) * 1e6:.2f} CPU µs/record\n")
    print("| read | records | CPU s | wall s | note |")
    print("|---|---|---|---|---|")
    reports = bench_reports(out)
    with SqliteStore(out / "shipped.db") as s:
        for label, n, cpu, wall, note in reports + [r[:5] for r in bench_reads(s)]:
            rate = f" ({n / wall:,.0f}/s)" if n > 1000 and wall else ""
            print(f"| {label} | {n:,}{rate} | {cpu:.2f} | {wall:.2f} | {note} |")
    if not args.keep:
        shutil.rmtree(out)
    if args.postgres:
        print("\n" + "\n".join(run_postgres(args)))
    return 0


def run_postgres(args) -> list[str]:
    if args.pg_url:
        return bench_postgres(args, None, args.pg_url)
    from tests.collector.pg_server import PgServer  # the repository root is on sys.path (above)

    server = PgServer()
    try:
        pids = [int((server.data / "postmaster.pid").read_text().split()[0])]
        os.sched_setaffinity(pids[0], {args.pg_cpu})  # its backends inherit it
        head = [f"PostgreSQL {server.version()}, server pinned to CPU {args.pg_cpu}, the "
                f"bench to CPU {args.cpu}; default settings but shared_buffers=128MB, "
                "max_wal_size=2GB (tests/collector/pg_server.py), fsync and "
                "synchronous_commit on", ""]
        return head + bench_postgres(args, server.data, server.create_database("bench"))
    finally:
        server.close()


if __name__ == "__main__":
    raise SystemExit(main())
