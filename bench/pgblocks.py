"""Benchmark: would blocks of records pay on PostgreSQL as they did on SQLite?

The same wire batches as bench/store.py (DeepSpeed-style rank lines, a jobless kernel
or cgroup record every 200th) go, interleaved batch by batch, into two databases of
one private PostgreSQL server (tests/collector/pg_server.py, pinned to its own core):

  rows     PostgresStore as shipped (a row per record, binary COPY, marks at insert)
  blocks   a prototype here: SqliteStore's layout (firstfault/collector/store/blocks.py:
           a batch's main job keeps the frame's column bytes as one ``bytea``, the other
           jobs' records packed apart, report marks in a table of their own), one
           INSERT of the batch's block rows (unnest of arrays) and a binary COPY of its
           marks, the stream's high_seq and the job's aggregates updated, one
           transaction per batch; the blobs stored out of line uncompressed (STORAGE
           EXTERNAL: pglz would cost the server more than the rows did)

Each store gets a database of its own, in turn (rows, blocks, blocks, rows, ...): CPU
per record of this process (pinned too) and of the server's processes (backend, WAL
writer, checkpointer, autovacuum; from /proc, until 3 s after the run), wall rate,
and the bytes on disk; medians over the runs.
The prototype writes what a block store would; it has no read side, so it shows the
ingest cost only.

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
from firstfault.collector.store.blocks import make_blocks, pack_ranks, times  # noqa: E402
from firstfault.collector.store.postgres import PostgresStore  # noqa: E402
from firstfault.collector.store.shared import failed_jobs  # noqa: E402

SCHEMA = """
CREATE TABLE streams (sid serial PRIMARY KEY, node text NOT NULL, stream text NOT NULL,
    high_seq bigint, UNIQUE (node, stream));
CREATE TABLE jobs (jid serial PRIMARY KEY, job text NOT NULL UNIQUE, first_ns bigint NOT NULL,
    last_ns bigint NOT NULL, records bigint NOT NULL, failed boolean NOT NULL);
CREATE TABLE blocks (bid bigserial PRIMARY KEY, sid int NOT NULL, jid int, seq_lo bigint NOT NULL,
    seq_hi bigint NOT NULL, t_lo bigint NOT NULL, t_hi bigint NOT NULL, n int NOT NULL,
    ranks bytea, seqs bytea NOT NULL, data bytea NOT NULL, idx bytea);
CREATE INDEX blocks_seq ON blocks (sid, seq_hi);
CREATE INDEX blocks_job ON blocks (jid, t_lo);
CREATE INDEX blocks_free ON blocks (sid, t_lo) WHERE jid IS NULL;
CREATE TABLE marks (bid bigint PRIMARY KEY, mid int NOT NULL, seqs bytea NOT NULL,
    data bytea NOT NULL);
ALTER TABLE blocks ALTER COLUMN data SET STORAGE EXTERNAL;
ALTER TABLE marks ALTER COLUMN data SET STORAGE EXTERNAL;
"""


class BlockProto:
    """What a PostgreSQL store of blocks would do per batch (ingest only)."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.db = psycopg.connect(url, autocommit=True)
        for stmt in SCHEMA.split(";"):
            if stmt.strip():
                self.db.execute(stmt)
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
        blocks = make_blocks(seqs, cols, times(cols), getattr(cols, "packed", None))
        failed = failed_jobs(cols["kind"], cols["fields"], cols["job"])
        with db.transaction():
            db.execute("SELECT high_seq FROM streams WHERE sid = %s FOR UPDATE", (sid,))
            rows, marks = [], []
            for b in blocks:
                c = b.cols
                b.marked = self.marker.mark(source=c[0], kind=c[1], message=c[2], occurred_ns=c[3],
                                            rank=c[8], fields=c[12], order=b.order)
                if b.order is not None:
                    b.marked.sort(key=b.t.__getitem__)
                jid = None
                if b.job is not None:
                    jid = self.jids.get(b.job)
                    lo, hi = b.bounds()[2:]
                    if jid is None:
                        jid = self.jids[b.job] = db.execute(
                            "INSERT INTO jobs (job, first_ns, last_ns, records, failed) VALUES "
                            "(%s, %s, %s, %s, %s) RETURNING jid",
                            (b.job, lo, hi, b.n, b.job in failed)).fetchone()[0]
                    else:
                        db.execute("UPDATE jobs SET first_ns = least(first_ns, %s), last_ns = "
                                   "greatest(last_ns, %s), records = records + %s, failed = "
                                   "failed OR %s WHERE jid = %s", (lo, hi, b.n, b.job in failed, jid))
                rows.append((sid, jid, *b.bounds(), b.n, pack_ranks(b.ranks()), b.seqs_data(),
                             b.data(), b.idx_data()))
            bids = [r[0] for r in db.execute(
                "INSERT INTO blocks (sid, jid, seq_lo, seq_hi, t_lo, t_hi, n, ranks, seqs, data, idx) "
                "SELECT * FROM unnest(%b::int[], %b::int[], %b::bigint[], %b::bigint[], %b::bigint[], "
                "%b::bigint[], %b::int[], %b::bytea[], %b::bytea[], %b::bytea[], %b::bytea[]) "
                "RETURNING bid", [list(c) for c in zip(*rows)]).fetchall()]
            for bid, b in zip(bids, blocks):
                marks.append((bid, 1, *b.marked_rows()))
            with db.cursor().copy("COPY marks (bid, mid, seqs, data) FROM STDIN (FORMAT BINARY)") as cp:
                cp.set_types(["int8", "int4", "bytea", "bytea"])
                for m in marks:
                    cp.write_row(m)
            db.execute("UPDATE streams SET high_seq = %s WHERE sid = %s", (seqs[-1], sid))
        return len(seqs)

    def disk_bytes(self) -> int:
        return sum(self.db.execute(f"SELECT pg_total_relation_size('{t}')").fetchone()[0]
                   for t in ("blocks", "marks", "streams", "jobs"))

    def close(self) -> None:
        self.db.close()


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
        made = {"rows": lambda: PostgresStore(server.create_database("rows"),
                                              marker=ReportMarker(CATALOG)),
                "blocks": lambda: BlockProto(server.create_database("blocks"))}
        data = [(node, stream, seqs, as_received(node, stream, seqs, cols)) for node, stream, seqs, cols
                in batches(args.records, args.batch, args.ranks, args.nodes)]
        n, runs = args.records, {name: [] for name in made}
        for rep in range(args.repeat):
            for name in (("rows", "blocks") if rep % 2 == 0 else ("blocks", "rows")):
                store = made[name]()
                insert = store.insert_columns if name == "rows" else store.insert
                s0, c0, w0 = _server_cpu(server.data), time.process_time(), time.perf_counter()
                for node, stream, seqs, cols in data:
                    assert insert(node, stream, seqs, cols) == len(seqs)
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                time.sleep(3)  # the server's deferred work (WAL writer, autovacuum) counts too
                srv = _server_cpu(server.data) - s0
                disk = (store._conn().execute("SELECT pg_total_relation_size('records')").fetchone()[0]
                        if name == "rows" else store.disk_bytes())
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
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
