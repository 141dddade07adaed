"""The spool's fsync policy (firstfault/agent/spool/format.py's docstring: Durability): after
the writer's writes, make them durable as ``fsync`` says and move the readers' horizon
(``vis_size``, ``vis_seq``) to what is durable. "always" fsyncs in the writing thread; with
"interval" an append that finds the last fsync an interval old fsyncs itself, outside the
lock, and otherwise the flusher thread does once the interval is over; "never" shows
readers every write at once."""

from __future__ import annotations

import logging
import os
import threading
import time

from firstfault.agent.osthread import name_this_thread
from firstfault.agent.spool.state import SpoolState

log = logging.getLogger("firstfault.agent.spool")


class Durability:
    """The fsync policy of one spool's active segment; ``start()`` the flusher ("interval")."""

    def __init__(self, st: SpoolState, interval_ms: int) -> None:
        self.st, self.interval_ms = st, interval_ms
        self._dirty = threading.Event()  # written since the flusher's last look
        self._synced_at = -float("inf")  # monotonic time the last fsync began ("interval")
        self._syncing = False  # an appending thread is fsyncing
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None

    def start(self) -> None:
        if self.st.fsync == "interval":
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                             name="ff-spool-flush")
            self._flusher.start()

    def stop(self) -> None:
        """Stop the flusher (the writer fsyncs the rest at close)."""
        self._stop.set()
        self._dirty.set()
        if self._flusher is not None:
            self._flusher.join()

    def after_write(self, inline: bool = False) -> None:
        """After writes (under the lock): fsync if "always", then show readers what is
        durable ("interval": the flusher will, once an interval passed since the last
        fsync, unless the writing thread does at once: ``inline``)."""
        st = self.st
        act = st.segs[-1]
        if st.fsync == "interval":
            if st.vis_size < act.size and not inline:
                self._dirty.set()
            return
        if st.vis_size == act.size:
            return
        if st.fsync == "always":
            os.fsync(st.fd)
            st.counts["fsyncs"] += 1
        st.vis_size = act.size
        st.vis_seq = max(st.vis_seq, act.last_seq or 0)
        st.readable()

    def due_inline(self) -> bool:
        """"interval", after writes (under the lock): whether the writing thread fsyncs
        them itself, now: the last fsync is an interval old and none is under way
        (one wake appends and syncs, the flusher sleeps); else the flusher will."""
        st = self.st
        if (st.fsync != "interval" or self._syncing or st.vis_size >= st.segs[-1].size
                or time.monotonic() - self._synced_at < self.interval_ms / 1000):
            return False
        self._syncing = True
        return True

    def _flush_loop(self) -> None:
        """fsync what appends left unsynced, interval_ms after the last fsync; asleep
        while none come."""
        name_this_thread()
        while not self._stop.is_set():
            self._dirty.wait()
            self._dirty.clear()
            if self._stop.wait(self._synced_at + self.interval_ms / 1000 - time.monotonic()):
                return
            self.flush_once()

    def flush_once(self, inline: bool = False) -> None:
        """fsync the active segment and show readers what it holds; an error is logged
        and the flusher tries again an interval later. Not under the lock."""
        st = self.st
        try:
            with st.lock:
                act = st.segs[-1] if not st.closed else None
                if act is None or st.vis_size >= act.size:
                    return
                fd, size, last = os.dup(st.fd), act.size, act.last_seq
                self._synced_at = time.monotonic()
            try:
                os.fsync(fd)  # outside the lock: appends go on meanwhile
            finally:
                os.close(fd)
            with st.lock:
                st.counts["fsyncs"] += 1
                if st.segs and st.segs[-1] is act and size > st.vis_size:
                    st.vis_size, st.vis_seq = size, max(st.vis_seq, last or 0)
                    st.readable()
        except OSError as e:
            log.error("spool fsync failed path=%s error=%s", st.path, e)
            self._dirty.set()  # try again in an interval
        finally:
            if inline:
                self._syncing = False
