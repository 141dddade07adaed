"""Durability: a writer SIGKILLed at random moments loses nothing it reported committed."""

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from firstfault.collector.store.blocks import block_seqs
from firstfault.collector.store.sqlite import SqliteStore

ROOT = Path(__file__).resolve().parents[3]

# argv: db path, first seq. Inserts batches of 500 forever (every 7th record has no
# job: the kernel path); after each insert returns, writes its last seq to stdout.
CHILD = r"""
import os, sys
from firstfault.wire import Record
from firstfault.collector.store.sqlite import SqliteStore
store = SqliteStore(sys.argv[1])
seq, t0 = int(sys.argv[2]), 1_796_206_319_782_000_000
while True:
    batch = [Record(node="gpu-01", stream="s1", seq=s, source="ranklog", kind="rank.line",
                    message=f"[Rank {s % 8}] step={s} loss 1.25", occurred_ns=t0 + s * 1000,
                    observed_ns=t0 + s * 1000 + 5, job=None if s % 7 == 0 else "crash",
                    rank=s % 8) for s in range(seq, seq + 500)]
    store.insert(batch)
    os.write(1, f"{seq + 499}\n".encode())
    seq += 500
"""


@pytest.mark.slow
def test_sigkill_loses_nothing_reported_committed(tmp_path):
    seed = int(os.environ.get("FF_CRASH_SEED", time.time_ns() % 10**6))
    rnd = random.Random(seed)
    path = tmp_path / "ff.db"
    reported = -1
    for round_ in range(8):
        with SqliteStore(path) as s:
            high = s.high_seq("gpu-01", "s1")
        start = 0 if high is None else max(0, high - rnd.randrange(1000))  # resend some
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(start)],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = child.stdout.readline()  # started and committed once
        assert first, f"seed {seed}: the writer died: {child.stderr.read().decode()[-2000:]}"
        time.sleep(rnd.uniform(0, 0.4))
        child.send_signal(signal.SIGKILL)
        child.wait()
        lines = (first + child.stdout.read()).split()  # what it wrote before dying
        child.stdout.close(), child.stderr.close()
        assert child.returncode == -signal.SIGKILL
        reported = max(reported, int(lines[-1]))

        db = sqlite3.connect(path)  # what a new process finds
        try:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", seed
            seqs = [q for row in db.execute("SELECT seqs, idx, n FROM blocks") for q in block_seqs(*row)]
            n, distinct, top = len(seqs), len(set(seqs)), max(seqs)
            below = sum(q <= reported for q in seqs)
            assert below == reported + 1, f"seed {seed} round {round_}: lost committed records"
            assert n == distinct == top + 1, f"seed {seed}: duplicates or holes"
            jobs = db.execute("SELECT records FROM jobs WHERE job = 'crash'").fetchone()[0]
            assert jobs == db.execute("SELECT sum(n) FROM blocks WHERE jid IS NOT NULL"
                                      ).fetchone()[0], f"seed {seed}: jobs out of step"
            assert db.execute("SELECT high_seq FROM streams").fetchone()[0] == top
            print(f"seed {seed} round {round_}: from {start}, reported {reported}, stored {n}")
        finally:
            db.close()
    assert reported > 0
