"""Benchmark: the PostgreSQL store's blocks against the row per record it kept before.

The same wire batches as bench/store.py (DeepSpeed-style rank lines, a jobless kernel
or cgroup record every 200th) go into two databases of one private PostgreSQL server
(tests/collector/pg_server.py, pinned to its own core):

  blocks   PostgresStore as shipped (schema version 3): SqliteStore's layout
           (firstfault/collector/store/blocks.py: a batch's main job keeps the frame's
           column bytes as one ``bytea``, the other jobs' records packed apart, report
           marks in a table of their own), stored out of line uncompressed (STORAGE
           EXTERNAL), one transaction per batch
  rows     the row layout of schema version 2, rebuilt here as that store wrote it (a
           row per record by binary COPY with its three indexes, the report marker's
           choice as a ``needed`` column, the stream's high_seq and the job's
           aggregates updated, one transaction per batch)

Each store gets a database of its own, in turn (rows, blocks, blocks, rows, ...): CPU
per record of this process (pinned too) and of the server's processes (backend, WAL
writer, checkpointer, autovacuum; from /proc, until 3 s after the run), wall rate,
and the bytes on disk; medians over the runs, and the ratio rows / blocks.

    python3 bench/pgblocks.py [--records 300000] [--batch 1000] [--repeat 2] [--cpu 0] [--pg-cpu 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from store import CATALOG, _server_cpu, as_received, batches  # noqa: E402

from firstfault.analysis.reads import ReportMarker  # noqa: E402
from firstfault.collector.store import postgres_schema  # noqa: E402
from firstfault.collector.store.postgres import PostgresStore  # noqa: E402
from firstfault.collector.store.shared import failed_jobs  # noqa: E402
from firstfault.wire import COLUMNS  # noqa: E402

_COPY = ("COPY records (sid, seq, t_ns, jid, rank, source, kind, message, occurred_ns, "
         "observed_ns, boot_id, mono_ns, local_rank, pid, severity, fields, escaped, needed) "
         "FROM STDIN (FORMAT BINARY)")
_COPY_TYPES = ("int4", "int8", "int8", "int4", "int4", "text", "text", "text", "int8", "int8",
               "text", "int8", "int4", "int4", "int2", "bytea", "bool", "bool")


class RowsBaseline:
    """What the row store of schema version 2 did per batch (ingest only)."""

    def __init__(self, url: str) -> None:
        import msgpack
        import psycopg

        self.pack = msgpack.Packer().pack
        self.db = psycopg.connect(url, autocommit=True)
        with self.db.transaction():
            postgres_schema._v1(self.db)
            postgres_schema._v2(self.db)
        self.marker = ReportMarker(CATALOG)
        self.sids: dict[tuple[str, str], int] = {}
        self.jids: dict[str, int] = {}

    def insert(self, node: str, stream: str, seqs, cols) -> int:
        db = self.db
        sid = self.sids.get((node, stream))
        if sid is None:
            sid = self.sids[(node, stream)] = db.execute(
                "INSERT INTO streams (node, stream) VALUES (%s, %s) RETURNING sid",
                (node, stream)).fetchone()[0]
        c = [cols[k] for k in COLUMNS]
        occurred, observed, job = c[3], c[4], c[7]
        t = [b if o is None else o for o, b in zip(occurred, observed)]
        with db.transaction():
            db.execute("SELECT high_seq FROM streams WHERE sid = %s FOR UPDATE", (sid,))
            for j in sorted(set(job) - {None} - set(self.jids)):
                self.jids[j] = db.execute(
                    "INSERT INTO jobs (job, first_ns, last_ns, records, failed, bytes, marked_by) "
                    "VALUES (%s, %s, %s, 0, false, 0, 0) RETURNING jid",
                    (j, 2**63 - 1, -(2**63))).fetchone()[0]
            jids = [None if j is None else self.jids[j] for j in job]
            need = [False] * len(seqs)
            groups: dict[int, list[int]] = {}
            for i, jid in enumerate(jids):
                if jid is not None:
                    groups.setdefault(jid, []).append(i)
            for rows in groups.values():
                rows.sort(key=lambda i: (t[i], seqs[i]))
                for k in self.marker.mark(**{name: [cols[name][i] for i in rows] for name in (
                        "source", "kind", "message", "occurred_ns", "rank", "fields", "pid")}):
                    need[rows[k]] = True
            fields = [self.pack(f) if f else None for f in c[12]]
            with db.cursor().copy(_COPY) as copy:
                copy.set_types(_COPY_TYPES)
                for row in zip([sid] * len(seqs), seqs, t, jids, c[8], c[0], c[1], c[2], occurred,
                               observed, c[5], c[6], c[9], c[10], c[11], fields,
                               [False] * len(seqs), need):
                    copy.write_row(row)
            failed = failed_jobs(c[1], c[12], job)
            for j, rows in groups.items():
                ts = [t[i] for i in rows]
                size = sum(len(c[2][i]) for i in rows)
                db.execute("UPDATE jobs SET first_ns = least(first_ns, %s), last_ns = "
                           "greatest(last_ns, %s), records = records + %s, bytes = bytes + %s, "
                           "failed = failed OR %s WHERE jid = %s",
                           (min(ts), max(ts), len(rows), size, j in failed, j))
            db.execute("UPDATE streams SET high_seq = %s WHERE sid = %s", (seqs[-1], sid))
        return len(seqs)

    def disk_bytes(self) -> int:
        return sum(self.db.execute(f"SELECT pg_total_relation_size('{t}')").fetchone()[0]
                   for t in ("records", "streams", "jobs"))

    def close(self) -> None:
        self.db.close()


def _blocks_disk(store: PostgresStore) -> int:
    return sum(store._conn().execute(f"SELECT pg_total_relation_size('{t}')").fetchone()[0]
               for t in ("blocks", "marks", "streams", "jobs"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--cpu", type=int, default=0)
    ap.add_argument("--pg-cpu", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    from tests.collector.pg_server import PgServer

    server = PgServer()
    try:
        os.sched_setaffinity(int((server.data / "postmaster.pid").read_text().split()[0]), {args.pg_cpu})
        made = {"rows": lambda: RowsBaseline(server.create_database("rows")),
                "blocks": lambda: PostgresStore(server.create_database("blocks"),
                                                marker=ReportMarker(CATALOG))}
        data = [(node, stream, seqs, as_received(node, stream, seqs, cols)) for node, stream, seqs, cols
                in batches(args.records, args.batch, args.ranks, args.nodes)]
        n, runs = args.records, {name: [] for name in made}
        for rep in range(args.repeat):
            for name in (("rows", "blocks") if rep % 2 == 0 else ("blocks", "rows")):
                store = made[name]()
                insert = store.insert if name == "rows" else store.insert_columns
                s0, c0, w0 = _server_cpu(server.data), time.process_time(), time.perf_counter()
                for node, stream, seqs, cols in data:
                    assert insert(node, stream, seqs, cols) == len(seqs)
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                time.sleep(3)  # the server's deferred work (WAL writer, autovacuum) counts too
                srv = _server_cpu(server.data) - s0
                disk = store.disk_bytes() if name == "rows" else _blocks_disk(store)
                runs[name].append((cpu / n * 1e6, srv / n * 1e6, n / wall, disk / n))
                store.close()
        print(f"# PostgreSQL {server.version()}, {n:,} records, batches of {args.batch:,}, "
              f"{args.repeat} runs each alternating (medians); this process on CPU {args.cpu}, "
              f"the server on CPU {args.pg_cpu}; server CPU includes the 3 s after each run\n")
        print("| store | CPU µs/record, collector side | CPU µs/record, server | both | records/s (wall) | disk bytes/record |")
        print("|---|---|---|---|---|---|")
        for name, got in runs.items():
            c, sv, rate, disk = (statistics.median(x) for x in zip(*got))
            print(f"| {name} | {c:.2f} | {sv:.2f} | {c + sv:.2f} | {rate:,.0f} | {disk:.0f} |")
        (rc, rs, rr, rd), (bc, bs, br, bd) = ([statistics.median(x) for x in zip(*runs[k])]
                                              for k in ("rows", "blocks"))
        print(f"| rows / blocks | {rc / bc:.2f} | {rs / bs:.2f} | {(rc + rs) / (bc + bs):.2f} | "
              f"{rr / br:.2f} | {rd / bd:.2f} |")
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
