"""Checkpoints of a SQLite store's WAL on a thread of their own, off the ingest's commits.

SQLite's auto-checkpoint runs inside the COMMIT that crosses its page count: that commit
copies the WAL into the database file and fsyncs it (tens of milliseconds for 16 MiB), and
every batch waiting behind it waits for its ack as long (bench/RESULTS.md: write -> acked p99
84-89 ms with it, 40 ms without). A ``WalCheckpointer`` instead runs a PASSIVE checkpoint from
a connection of its own every ``every_s`` seconds: PASSIVE takes no writer lock, so the
ingest's commits go on meanwhile. Once a checkpoint has copied every frame, the next write
transaction starts the WAL over from its beginning (and journal_size_limit cuts the file),
so the WAL stays small while writes leave gaps between commits, as ingest below its peak does.
Where they never do (ingest at its peak), a WAL of RESTART_FRAMES is checkpointed with RESTART,
which holds the writers off while it copies the little the last PASSIVE left and makes the next
one start the WAL over. The writer's own auto-checkpoint stays on at ``SAFETY_PAGES`` in case
this thread fails.

Durability is the same as before: a commit is in the WAL when it returns (synchronous=NORMAL
or FULL, sqlite.py), and a checkpoint only moves committed pages into the database file.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

log = logging.getLogger("firstfault.collector.store")

EVERY_S = 0.5  # between checkpoints: ~1 MB of WAL at 2 MB/s of ingest, a few ms to copy
RESTART_FRAMES = 4096  # a WAL this long (64 MiB of 16 KiB pages) is started over (RESTART)
SAFETY_PAGES = 16384  # the writer's own auto-checkpoint, should the thread fail (256 MiB)
RESTART_WAIT_S = 0.1  # the longest a RESTART holds writers off waiting for a reader (then next round)


class WalCheckpointer:
    """``start()`` a thread that checkpoints ``path``'s WAL (PASSIVE) every ``every_s`` seconds;
    ``close()`` stops it and closes its connection."""

    def __init__(self, path: str, every_s: float = EVERY_S) -> None:
        self.path, self.every_s = path, every_s
        self.checkpoints = 0  # that copied frames
        self.restarts = 0  # RESTART checkpoints run (a WAL of RESTART_FRAMES)
        self._db = sqlite3.connect(path, timeout=RESTART_WAIT_S, isolation_level=None,
                                   check_same_thread=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ff-store-ckpt")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                _busy, frames, copied = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                if frames >= RESTART_FRAMES:  # never a gap between commits: start the WAL over
                    _busy, frames, copied = self._db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                    self.restarts += 1
            except sqlite3.Error as e:  # the file is still the writer's to use; try again later
                log.warning("store checkpoint failed path=%s error=%s", self.path, e)
                continue
            if copied > 0:
                self.checkpoints += 1
            log.debug("store checkpoint path=%s wal_frames=%d copied=%d", self.path, frames, copied)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._db.close()
