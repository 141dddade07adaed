"""Writes main-v3.db.gz: a SQLite store file of schema version 3 as the SqliteStore of the
firstfault on sys.path writes it, for tests/collector/store/test_sqlite_open.py to open
with today's code. Run with an older checkout first on the path:

    PYTHONPATH=/path/to/old/checkout python3 tests/data/store/make.py

``records()`` is what the file holds (the test rebuilds it to compare): job-1 on two
nodes (ranks 0-7, a failed proc.exit at the end), job-2 on one, jobless kernel lines,
sent as the ingest server hands them over (wire frames, their bytes kept) with report
marks, and a last batch stored by a store without a marker (it waits in ``pending``).
"""

from __future__ import annotations

import gzip
import shutil
import sys
import tempfile
from pathlib import Path

from firstfault import wire, wiredecode
from firstfault.wire import Record

T0 = 1_796_206_319_782_000_000  # 2026-12-02 10:11:59.782 UTC
S = 10**9
OUT = Path(__file__).with_name("main-v3.db.gz")


def records() -> list[list[Record]]:
    """The batches, in the order stored; the last one is stored without a marker."""
    line = "[2026-12-02 10:11:59,782] [INFO] [timer.py:264:stop] epoch=0/micro_step={s}/global_step={s}"
    out = []
    for node, ranks in (("gpu-01", range(0, 4)), ("gpu-02", range(4, 8))):
        for lo in range(0, 1500, 500):
            batch = [Record(node=node, stream="r", seq=i, source="ranklog", kind="rank.line",
                            message=line.format(s=i // 8), occurred_ns=T0 + i * S // 10,
                            observed_ns=T0 + i * S // 10 + 5_000_000, job="job-1",
                            rank=ranks[i % 4], local_rank=i % 4, pid=24000 + ranks[i % 4])
                     for i in range(lo, lo + 500)]
            if lo == 500:  # a jobless kernel line and another job in the same frame
                batch[100] = Record(node=node, stream="r", seq=lo + 100, source="kmsg",
                                    kind="kernel.line", message="NVRM: Xid (PCI:0000:3b:00): 79",
                                    occurred_ns=T0 + (lo + 100) * S // 10,
                                    observed_ns=T0 + (lo + 100) * S // 10, boot_id="b-1",
                                    mono_ns=lo, fields={"xid": 79})
                batch[200] = Record(node=node, stream="r", seq=lo + 200, source="ranklog",
                                    kind="rank.line", message="job-2 says hello",
                                    occurred_ns=None, observed_ns=T0 + (lo + 150) * S // 10,
                                    job="job-2", rank=0)
            out.append(batch)
    out.append([Record(node="gpu-02", stream="r", seq=1500, source="procs", kind="proc.exit",
                       message="rank 5 exited", occurred_ns=T0 + 160 * S,
                       observed_ns=T0 + 160 * S, job="job-1", rank=5, pid=24005,
                       fields={"exitcode": -9, "signal": "SIGKILL"})])
    return out


def main() -> int:
    from firstfault.analysis.catalog import load_catalog
    from firstfault.analysis.reads import ReportMarker
    from firstfault.collector.store.sqlite import SqliteStore

    batches = records()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ff.db"
        with SqliteStore(path, marker=ReportMarker(load_catalog())) as s:
            for batch in batches[:-1]:
                b = wiredecode.decode_batch_columns(wire.encode_batch(batch))
                s.insert_columns(b.node, b.stream, b.seqs, b.cols)
        with SqliteStore(path) as s:
            s.insert(batches[-1])
        with open(path, "rb") as src, gzip.GzipFile(OUT, "wb", mtime=0) as dst:
            shutil.copyfileobj(src, dst)
    print(f"wrote {OUT} from {SqliteStore.__module__} in {sys.modules['firstfault'].__file__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
