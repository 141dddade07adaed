"""Benchmark: the collector's ingest (firstfault/collector/server.py) into SqliteStore on one core.

A collector child (this file with ``--serve``: IngestServer + SqliteStore wired as
firstfault/collector/daemon.py wires them, default limits) runs pinned to core 0
(``taskset -c 0``); the agents are asyncio connections in this process, pinned to
core 1, each sending pre-built realistic batches (~150-byte DeepSpeed log lines,
5% kernel lines, occurred/observed times rising) and answering pings. Phases, each
on a fresh database file:

1. throughput: CLIENTS agents, batches of BATCH records, WINDOW batches unacked
   per agent, for SECONDS: records acked per second, the child's CPU per record.
   Blocks stored without their report marks (a store that leaves them for later)
   are marked when the agents stop: the phase waits for that and counts that CPU
   too (``marks_after``): records/s per free core = 1e6 / (CPU per record with it).
2. store-only: the same batches, decoded as the server decodes them, straight into
   ``insert_columns``: the store's own cost, no sockets.
3. sqlite-bound, the anchor: what SQLite alone costs per record to take each batch
   durably as the store keeps it (one row holding the frame's column bytes, its
   index entries, the stream's high_seq, one transaction), every value computed
   beforehand: no store can take these batches into this schema for less.
4. sqlite-rows, the issue's anchor: a plain row-per-record SQLite insert of the same
   13 columns (one table, no index beyond its rowid, one transaction and one
   ``executemany`` a batch, the values decoded beforehand, ``fields`` as JSON): what a
   simple collector would pay; the collector's records/s per free core over this
   one's is the ratio issue 24 asks to be at least 2.
5. latency: a steady RATE records/s, each agent sending a batch every 50 ms;
   latency = batch written to the socket -> its ack read (p50/p99/max).

``--base DIR`` runs the throughput and store-only phases for the collector of
another checkout too (before/after), ``--repeat N`` every phase N times in turn
(the order rotating), with medians at the end. ``--postgres 1,2,4`` instead runs
that many collectors (PostgresStore) on one private PostgreSQL server.

    python3 bench/collector.py [--clients 8] [--seconds 20] [--batch 1000]
                               [--rate 20000] [--latency-seconds 30] [--profile]
                               [--null-store] [--base DIR] [--repeat N] [--skip-latency]
                               [--postgres 1,2,4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import msgpack

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from firstfault.wire import COLUMNS, Ack, Hello, Ping, Pong, Welcome, array_header, encode_message  # noqa: E402
from firstfault.wiredecode import FrameDecoder  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


# --- the collector child -------------------------------------------------------

class NullStore:
    """A store that keeps nothing: the server's own cost (bench --null-store)."""

    def __init__(self, db: str) -> None:
        pass

    def high_seq(self, node: str, stream: str) -> None:
        return None

    def insert_columns(self, node: str, stream: str, seqs, cols) -> int:
        return len(seqs)

    def save_clock(self, clock) -> None:
        pass

    def close(self) -> None:
        pass


def serve(db: str, profile: bool) -> None:
    import cProfile
    import logging
    import pstats
    from concurrent.futures import ThreadPoolExecutor

    from firstfault.collector.daemon import open_store
    from firstfault.collector.server import IngestServer

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if os.environ.get("BENCH_GC"):
        import gc
        gc.freeze()
        gc.set_threshold(*map(int, os.environ["BENCH_GC"].split(",")))

    async def main() -> dict:
        loop = asyncio.get_running_loop()
        writer = ThreadPoolExecutor(1, thread_name_prefix="firstfault-store")
        if db == "null":
            store = NullStore(db)
        else:  # as the daemon opens it: blocks, marked for reports, group commit
            store = await loop.run_in_executor(writer, open_store, db, True)
        server = IngestServer(store, writer=writer)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        profs = (cProfile.Profile(time.thread_time), cProfile.Profile(time.thread_time)) if profile else None
        if profs:
            profs[0].enable()
            await loop.run_in_executor(writer, profs[1].enable)
        _, port = await server.start("127.0.0.1", 0)
        cpu_start = (time.thread_time(), await loop.run_in_executor(writer, time.thread_time))
        print(f"READY {port}", flush=True)
        await stop.wait()
        cpu_end = (time.thread_time(), await loop.run_in_executor(writer, time.thread_time))
        if profs:
            profs[0].disable()
            await loop.run_in_executor(writer, profs[1].disable)
        m = server.metrics
        stats = {"records_stored": m.records_stored, "batches": m.batches,
                 "store_s": m.store_seconds_sum, "inflight_peak": server.budget.peak,
                 "errors": m.errors,
                 "thread_cpu_s": {"event_loop": cpu_end[0] - cpu_start[0],
                                  "store": cpu_end[1] - cpu_start[1]}}
        await server.stop()
        await loop.run_in_executor(writer, store.close)
        writer.shutdown()
        if profs:
            for name, p in zip(("event loop thread", "store thread"), profs):
                print(f"--- cProfile: {name} (tottime) ---", file=sys.stderr)
                pstats.Stats(p, stream=sys.stderr).sort_stats(os.environ.get("BENCH_SORT", "tottime")).print_stats(int(os.environ.get("BENCH_TOP", "14")))
        return stats

    print("STATS " + json.dumps(asyncio.run(main())), flush=True)


def _frames(records: int, batch: int):
    """(node, seqs, decoded columns) of the bench's batches as the server decodes them
    (FrameDecoder: with the frame's column bytes where this checkout keeps them)."""
    from firstfault.wiredecode import FrameDecoder

    batches = [_columns(random.Random(f"gpu-{i:03d}"), batch) for i in range(8)]
    offsets = list(range(batch))
    seqs = [0] * 8
    decoder = FrameDecoder(batch_columns=True)
    for done in range(0, records, batch):
        i = (done // batch) % 8
        cols = dict(batches[i])
        now_ns = time.time_ns()
        cols["occurred_ns"] = [None if s == "kmsg" else now_ns + o
                               for s, o in zip(cols["source"], offsets)]
        cols["observed_ns"] = [now_ns + o + 5000 for o in offsets]
        body = msgpack.packb({"type": "batch", "node": f"gpu-{i:03d}", "stream": "bench",
                              "count": batch, "seq": seqs[i], "cols": cols})
        (b,) = decoder.feed(len(body).to_bytes(4, "big") + body)
        yield b.node, b.seqs, b.cols
        seqs[i] += batch


def store_only(db: str, records: int, batch: int) -> None:
    """The same batches straight into SqliteStore.insert_columns: the store's own cost."""
    from firstfault.collector.daemon import open_store

    store = open_store(db)  # as the daemon opens it
    done, busy, cpu = 0, 0.0, 0.0
    for node, seqs, cols in _frames(records, batch):
        c0, t0 = time.process_time(), time.perf_counter()
        store.insert_columns(node, "bench", seqs, cols)
        busy += time.perf_counter() - t0
        cpu += time.process_time() - c0
        done += len(seqs)
    store.close()
    print(json.dumps({"phase": "store-only", "records": done, "wall_s": busy,
                      "rate": done / busy, "cpu_us_per_record": cpu / done * 1e6,
                      "insert_us_per_record": busy / done * 1e6}))


def sqlite_bound(db: str, records: int, batch: int) -> None:
    """The anchor: what SQLite alone costs to take each batch durably as the store keeps
    it (one ``blocks`` row holding the frame's column bytes, its three index entries,
    the stream's high_seq, one transaction), with every value computed beforehand."""
    import sqlite3

    from firstfault.collector.store.sqlite import SqliteStore

    SqliteStore(db).close()  # the schema, pragmas as the store sets them
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute("PRAGMA cache_size=-65536")
    con.execute("INSERT INTO streams (node, stream) VALUES ('gpu', 'bench')")
    rows = []
    for node, seqs, cols in _frames(records, batch):
        data = array_header(len(cols.packed)) + b"".join(cols.packed)
        t = [o if o is not None else b for o, b in zip(cols["occurred_ns"], cols["observed_ns"])]
        rows.append((1, seqs[0], seqs[-1], min(t), max(t), len(seqs), msgpack.packb(seqs[0]), data))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for row in rows:
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO blocks (sid, jid, seq_lo, seq_hi, t_lo, t_hi, n, seqs, data) "
                    "VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?)", row)
        con.execute("UPDATE streams SET high_seq = ? WHERE sid = 1", (row[2],))
        con.execute("COMMIT")
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    con.close()
    n = len(rows) * batch
    print(json.dumps({"phase": "sqlite-bound", "records": n, "wall_s": wall, "rate": n / wall,
                      "cpu_us_per_record": cpu / n * 1e6}))


def sqlite_rows(db: str, records: int, batch: int) -> None:
    """The issue's anchor: each record a row of the same 13 columns in a plain table,
    ``executemany`` a batch in one transaction, pragmas as the store sets them."""
    import sqlite3

    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute("PRAGMA cache_size=-65536")
    con.execute(f"CREATE TABLE records (node TEXT, seq INTEGER, {', '.join(COLUMNS)})")
    marks = ", ".join("?" * (len(COLUMNS) + 2))
    batches = []
    for node, seqs, cols in _frames(records, batch):
        columns = [cols[k] if k != "fields" else [json.dumps(f) for f in cols[k]] for k in COLUMNS]
        batches.append([(node, seq, *row) for seq, *row in zip(seqs, *columns)])
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for rows in batches:
        con.execute("BEGIN IMMEDIATE")
        con.executemany(f"INSERT INTO records VALUES ({marks})", rows)
        con.execute("COMMIT")
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    con.close()
    n = sum(map(len, batches))
    print(json.dumps({"phase": "sqlite-rows", "records": n, "wall_s": wall, "rate": n / wall,
                      "cpu_us_per_record": cpu / n * 1e6}))


class Child:
    def __init__(self, db: str, profile: bool, tree: Path = ROOT) -> None:
        """The collector of the checkout ``tree`` (its own bench/collector.py --serve)."""
        cmd = ["taskset", "-c", "0", sys.executable, str(tree / "bench" / "collector.py"),
               "--serve", db]
        self.proc = subprocess.Popen(cmd + (["--profile"] if profile else []),
                                     stdout=subprocess.PIPE, text=True, cwd=tree)
        line = self.proc.stdout.readline()
        assert line.startswith("READY"), line
        self.port = int(line.split()[1])

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def switches(self) -> int:
        """Context switches of every thread of the child so far."""
        n = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    n += int(line.split()[1])
        return n

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=120)
        return json.loads(out.split("STATS ", 1)[1])


# --- the agents ----------------------------------------------------------------

def _columns(rnd: random.Random, n: int) -> dict:
    """n realistic records' columns (times filled in per batch)."""
    cols: dict[str, list] = {k: [] for k in COLUMNS}
    for i in range(n):
        rank = rnd.randrange(8)
        if rnd.random() < 0.05:
            row = ("kmsg", "kernel.line", f"NVRM: GPU at PCI:0000:{rnd.randrange(256):02x}:00: "
                   f"GPU-{rnd.getrandbits(64):016x} Xid (PCI:0000:3b:00): 31, pid={rnd.randrange(99999)}",
                   None, None, "9b1e3c2a-5f4d-4e8b-a7c6-1d2e3f4a5b6c", None, None, None, None,
                   None, 4, {"kmsg_seq": i})
        else:
            step = rnd.randrange(100000)
            msg = (f"[2026-12-02 10:11:{i % 60:02d},{rnd.randrange(1000):03d}] [INFO] "
                   f"[logging.py:107:log_dist] [Rank {rank}] step={step}, skipped=0, "
                   f"lr=[0.0001], loss={rnd.random() * 3:.4f}, samples/s={180 + rnd.random():.2f}")
            row = ("ranklog", "rank.line", msg, None, None, None, None, "12345", rank, rank,
                   24211 + rank, 6, {} if rnd.random() < 0.9 else {"offset_bytes": step * 150})
        for k, v in zip(cols, row):
            cols[k].append(v)
    return cols


class Stats:
    def __init__(self) -> None:
        self.acked = 0
        self.latencies: list[float] = []
        self.measure = True


async def agent(port: int, node: str, *, batch: int, window: int, until: float, stats: Stats,
                interval_s: float | None = None) -> None:
    rnd = random.Random(node)
    cols = _columns(rnd, batch)
    offsets = list(range(batch))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode_message(Hello(node=node, stream="bench", token="", agent_ns=time.time_ns(),
                                      agent_name="bench", agent_version="0")))
    decoder = FrameDecoder()
    inflight: deque[tuple[int, float]] = deque()
    room = asyncio.Event()
    room.set()
    welcome = asyncio.get_running_loop().create_future()

    async def read() -> None:
        while data := await reader.read(65536):
            for msg in decoder.feed(data):
                if isinstance(msg, Welcome):
                    welcome.set_result(msg)
                elif isinstance(msg, Ack):
                    now = time.perf_counter()
                    while inflight and inflight[0][0] <= msg.seq:
                        last, sent = inflight.popleft()
                        stats.acked += batch
                        if stats.measure:
                            stats.latencies.append(now - sent)
                    room.set()
                elif isinstance(msg, Ping):
                    t2 = time.time_ns()
                    writer.write(encode_message(Pong(msg.t1, t2, time.time_ns())))
                else:
                    raise RuntimeError(f"unexpected {msg}")

    reading = asyncio.create_task(read())
    w = await welcome
    seq = 0 if w.high_seq is None else w.high_seq + 1
    next_send = time.perf_counter()
    while time.perf_counter() < until:
        if interval_s is not None:
            next_send += interval_s
            await asyncio.sleep(max(0.0, next_send - time.perf_counter()))
        while len(inflight) >= window:
            room.clear()
            await room.wait()
        now_ns = time.time_ns()
        cols["occurred_ns"] = [None if s == "kmsg" else now_ns + o
                               for s, o in zip(cols["source"], offsets)]
        cols["observed_ns"] = [now_ns + o + 5000 for o in offsets]
        body = msgpack.packb({"type": "batch", "node": node, "stream": "bench", "count": batch,
                              "seq": seq, "cols": cols})
        writer.write(len(body).to_bytes(4, "big") + body)
        seq += batch
        inflight.append((seq - 1, time.perf_counter()))
        await writer.drain()
    while inflight:
        room.clear()
        await room.wait()
    writer.close()
    reading.cancel()


async def run_agents(port: int | list[int], clients: int, seconds: float,
                     **kw) -> tuple[Stats, float]:
    """``clients`` agents for ``seconds``; with several ports, spread over them in turn."""
    ports = port if isinstance(port, list) else [port]
    stats = Stats()
    t0 = time.perf_counter()
    until = t0 + seconds
    await asyncio.gather(*(agent(ports[i % len(ports)], f"gpu-{i:03d}", until=until, stats=stats,
                                 **kw) for i in range(clients)))
    return stats, time.perf_counter() - t0


def postgres_phases(counts: list[int], clients: int, seconds: float, repeat: int, **kw) -> list[dict]:
    """Throughput of 1, 2, 4... collectors (children, PostgresStore) on one PostgreSQL
    server (tests/collector/pg_server.py) pinned to core 1 with the agents; the
    collectors share core 0. Each run on a fresh database; ``repeat`` rounds over the
    counts, in turn."""
    sys.path.insert(0, str(ROOT))
    from bench.store import _server_cpu
    from tests.collector.pg_server import PgServer

    out = []
    server = PgServer()
    try:
        os.sched_setaffinity(int((server.data / "postmaster.pid").read_text().split()[0]), {1})
        for rnd in range(repeat):
            for n in counts:
                url = server.create_database(f"c{n}r{rnd}")
                children = [Child(url, False) for _ in range(n)]
                try:
                    c0 = [c.cpu_s() for c in children]
                    s0 = _server_cpu(server.data)
                    stats, wall = asyncio.run(run_agents([c.port for c in children], clients,
                                                         seconds, **kw))
                    cpu = sum(c.cpu_s() - a for c, a in zip(children, c0))
                    time.sleep(2)  # the server's deferred work counts too
                    srv = _server_cpu(server.data) - s0
                finally:
                    stored = sum(c.stop()["records_stored"] for c in children)
                assert stored == stats.acked, (stored, stats.acked)
                out.append({"phase": f"postgres-{n}", "collectors": n, "round": rnd,
                            "records": stats.acked, "rate": stats.acked / wall,
                            "collector_us_per_record": cpu / stats.acked * 1e6,
                            "server_us_per_record": srv / stats.acked * 1e6})
                print(json.dumps(out[-1]), flush=True)
    finally:
        server.close()
    return out


def _wait_for_marks(db: str, timeout_s: float = 300) -> float:
    """The share of the records stored unmarked (group commits) when the agents
    stopped; returns once the idle collector has marked them all (mark_pending)."""
    if db == "null":
        return 0.0
    import sqlite3

    con = sqlite3.connect(db, timeout=30)
    try:
        total = con.execute("SELECT sum(n) FROM blocks").fetchone()[0] or 1
        v3 = con.execute("SELECT 1 FROM sqlite_master WHERE name = 'pending'").fetchone()
        unmarked_sql = ("SELECT coalesce(sum(n), 0) FROM pending JOIN blocks USING (bid)" if v3 else
                     "SELECT coalesce(sum(n), 0) FROM blocks WHERE mid IS NULL")  # schema 2
        first = None
        deadline = time.monotonic() + timeout_s
        while True:
            left = con.execute(unmarked_sql).fetchone()[0]
            first = left if first is None else first
            if not left or time.monotonic() > deadline:
                return first / total
            time.sleep(0.2)
    finally:
        con.close()


def phase(name: str, tmp: str, profile: bool, clients: int, seconds: float,
          tree: Path = ROOT, **kw) -> dict:
    db = "null" if name.startswith("null") else os.path.join(tmp, f"{name}.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.unlink(db + suffix)
    child = Child(db, profile, tree)
    try:
        cpu0, sw0 = child.cpu_s(), child.switches()
        stats, wall = asyncio.run(run_agents(child.port, clients, seconds, **kw))
        cpu, switches = child.cpu_s() - cpu0, child.switches() - sw0
        unmarked, marks_cpu = _wait_for_marks(db), child.cpu_s() - cpu0 - cpu
        rss = child.peak_rss_mb()
    except BaseException:
        child.proc.kill()
        raise
    server = child.stop()
    assert server["records_stored"] == stats.acked, (server, stats.acked)
    lat = sorted(stats.latencies)
    q = (lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000) if lat else (lambda p: 0.0)
    size = sum(os.path.getsize(db + s) for s in ("", "-wal") if os.path.exists(db + s)
               and db != "null")
    return {"phase": name, "records": stats.acked, "wall_s": wall, "rate": stats.acked / wall,
            "cpu_s": cpu, "cpu_us_per_record": cpu / max(stats.acked, 1) * 1e6,
            "store_s": server["store_s"], "peak_rss_mb": rss, "db_mb": size / 1e6,
            "p50_ms": q(0.50), "p99_ms": q(0.99), "max_ms": lat[-1] * 1000 if lat else 0.0,
            "mean_ms": statistics.fmean(lat) * 1000 if lat else 0.0,
            "inflight_peak": server["inflight_peak"], "errors": server["errors"],
            "switches_per_batch": round(switches / max(server["batches"], 1), 1),
            "unmarked_at_end": unmarked,
            "marks_after_us_per_record": marks_cpu / max(stats.acked, 1) * 1e6,
            "thread_us_per_record": {k: round(v / max(stats.acked, 1) * 1e6, 2)
                                     for k, v in server["thread_cpu_s"].items() if v}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", metavar="DB", help=argparse.SUPPRESS)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--rate", type=int, default=20000)
    ap.add_argument("--latency-clients", type=int, default=4)
    ap.add_argument("--latency-seconds", type=float, default=30)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--null-store", action="store_true",
                    help="also run the throughput phase into a store that keeps nothing")
    ap.add_argument("--store-only", metavar="DB", help=argparse.SUPPRESS)
    ap.add_argument("--store-records", type=int, default=400_000)
    ap.add_argument("--postgres", metavar="N,N", help="only: N collectors on one PostgreSQL, "
                    "for each N (e.g. 1,2,4)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every phase, in turn")
    ap.add_argument("--base", metavar="DIR", help="also the collector of this checkout (before/after)")
    ap.add_argument("--sqlite-bound", metavar="DB", help=argparse.SUPPRESS)
    ap.add_argument("--sqlite-rows", metavar="DB", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, args.profile)
    if args.store_only:
        return store_only(args.store_only, args.store_records, args.batch)
    if args.sqlite_bound:
        return sqlite_bound(args.sqlite_bound, args.store_records, args.batch)
    if args.sqlite_rows:
        return sqlite_rows(args.sqlite_rows, args.store_records, args.batch)
    os.sched_setaffinity(0, {1})  # the agents; the collector child has core 0
    if args.postgres:
        runs = postgres_phases([int(n) for n in args.postgres.split(",")], args.clients,
                               args.seconds, args.repeat, batch=args.batch, window=args.window)
        for n in sorted({r["collectors"] for r in runs}):
            got = [r for r in runs if r["collectors"] == n]
            med = {k: statistics.median(r[k] for r in got)
                   for k in ("rate", "collector_us_per_record", "server_us_per_record")}
            print(f"{n} collector(s) on one PostgreSQL: {med['rate']:,.0f} records/s (median of "
                  f"{len(got)}), collectors {med['collector_us_per_record']:.2f} + server "
                  f"{med['server_us_per_record']:.2f} CPU us/record")
        print(f"load average during the run: {os.getloadavg()[0]:.1f} (2 cores)")
        return
    wire_bytes = len(msgpack.packb(_columns(random.Random(1), 1000))) / 1000
    print(f"records: ~{wire_bytes:.0f} bytes each on the wire (columnar)")
    trees = {"this": ROOT, **({"base": Path(args.base).resolve()} if args.base else {})}
    runs: dict[str, list[dict]] = {}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="ff-bench-") as tmp:
        for rep in range(args.repeat):
            names = list(trees)[rep % len(trees):] + list(trees)[:rep % len(trees)]
            for name in names:  # in turn, the order rotating each round
                r = phase("throughput", tmp, args.profile, args.clients, args.seconds,
                          tree=trees[name], batch=args.batch, window=args.window)
                runs.setdefault(f"throughput.{name}", []).append(r)
                print(f"throughput.{name}: {json.dumps(r)}", flush=True)
            for name in names:
                r = child_phase(["--store-only", os.path.join(tmp, "store-only.db")], args, trees[name])
                runs.setdefault(f"store-only.{name}", []).append(r)
                print(f"store-only.{name}: {json.dumps(r)}", flush=True)
            r = child_phase(["--sqlite-bound", os.path.join(tmp, "bound.db")], args, ROOT)
            runs.setdefault("sqlite-bound", []).append(r)
            print(f"sqlite-bound: {json.dumps(r)}", flush=True)
            r = child_phase(["--sqlite-rows", os.path.join(tmp, "rows.db")], args, ROOT)
            runs.setdefault("sqlite-rows", []).append(r)
            print(f"sqlite-rows: {json.dumps(r)}", flush=True)
            loads.append(os.getloadavg()[0])
        if args.null_store:
            for size in (args.batch, max(1, round(args.rate * 0.05 / args.latency_clients))):
                r = phase(f"null-store-{size}", tmp, False, args.clients, min(args.seconds, 10),
                          batch=size, window=args.window)
                runs[r["phase"]] = [r]
        if not args.skip_latency:
            per_batch = max(1, round(args.rate * 0.05 / args.latency_clients))
            runs["latency"] = [phase("latency", tmp, False, args.latency_clients,
                                     args.latency_seconds, batch=per_batch, window=1000,
                                     interval_s=0.05)]
    for key in [k for k in runs if k.startswith("throughput")]:
        ratios = [1e6 / (t["cpu_us_per_record"] + t["marks_after_us_per_record"]) / (1e6 / r["cpu_us_per_record"])
                  for t, r in zip(runs[key], runs["sqlite-rows"])]
        print(f"{key} per free core / the row-per-record insert's, same rounds: median "
              f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}, n={len(ratios)})")
    print(f"\nmedians of {args.repeat} round(s); load average {[round(x, 1) for x in loads]} (2 cores)")
    for key, got in runs.items():
        med = {k: statistics.median(r[k] for r in got) for k in got[0] if isinstance(got[0][k], (int, float))}
        if key.startswith("throughput"):
            counted = med["cpu_us_per_record"] + med["marks_after_us_per_record"]
            split = ", ".join(f"{k} {statistics.median(r['thread_us_per_record'][k] for r in got):.2f}"
                              for k in got[0]["thread_us_per_record"])
            print(f"{key}: {med['rate']:,.0f} records/s, collector CPU {med['cpu_us_per_record']:.2f} "
                  f"us/record ({split}) + marks left for later {med['marks_after_us_per_record']:.2f} "
                  f"= {counted:.2f} us/record = {1e6 / counted:,.0f} records/s per free core (marks "
                  f"counted in); {med['unmarked_at_end']:.0%} stored unmarked; it had "
                  f"{med['cpu_s'] / med['wall_s']:.0%} of its core; peak RSS {med['peak_rss_mb']:.0f} MB")
        elif key.startswith(("store-only", "sqlite-bound", "sqlite-rows")):
            print(f"{key}: CPU {med['cpu_us_per_record']:.2f} us/record = "
                  f"{1e6 / med['cpu_us_per_record']:,.0f} records/s per core")
        elif key.startswith("null-store"):
            print(f"server alone ({key}): {med['rate']:,.0f} records/s, CPU "
                  f"{med['cpu_us_per_record']:.2f} us/record")
        else:
            print(f"latency at {med['rate']:,.0f} records/s: p50 {med['p50_ms']:.1f} ms, p99 "
                  f"{med['p99_ms']:.1f} ms, max {med['max_ms']:.1f} ms; collector CPU "
                  f"{med['cpu_us_per_record']:.2f} us/record, peak RSS {med['peak_rss_mb']:.0f} MB")


def child_phase(what: list[str], args, tree: Path) -> dict:
    """A store-only or sqlite-bound measurement in a child pinned to core 0 (the
    checkout ``tree``'s bench for store-only), on a fresh database file."""
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(what[1] + suffix):
            os.unlink(what[1] + suffix)
    out = subprocess.run(["taskset", "-c", "0", sys.executable, str(tree / "bench" / "collector.py"),
                          *what, "--batch", str(args.batch), "--store-records",
                          str(args.store_records)],
                         capture_output=True, text=True, check=True, cwd=tree).stdout
    return json.loads(out.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
