"""One poll of a followed path (tailer.py's docstring is the specification): stat the path,
notice a rotation or deletion, drain the rotated files in stream order, open a new file at
the path, read the current one, flush a quiet partial line. The Tailer holds the paths,
the lock and the saved state; a PathPoller reads (file.py's FileReader), follows rotations
(rotation.py) and keeps the FileChange events the Tailer hands out."""

from __future__ import annotations

import logging
import os
import stat as _stat
import time
from collections import deque
from collections.abc import Callable

from firstfault.agent.tail.file import OPEN_FLAGS, FileReader, PathFiles, TailedFile
from firstfault.agent.tail.lines import DELETED, ERROR, ROTATED, TRUNCATED, FileChange, FileKey, LineBatch
from firstfault.agent.tail.rotation import Rotation

log = logging.getLogger("firstfault.agent.tail.tailer")


class PathPoller:
    """Polls one path at a time (under the Tailer's lock); ``events``: the FileChanges not yet
    taken (the oldest dropped beyond ``max_events``)."""

    def __init__(self, *, max_line_bytes: int, read_chunk: int, fingerprint_bytes: int,
                 partial_flush_s: float, clock: Callable[[], float], max_events: int) -> None:
        self.partial_flush_s, self.clock = partial_flush_s, clock
        self.events: deque[FileChange] = deque(maxlen=max_events)
        self._serial = 0
        self.reader = FileReader(max_line_bytes=max_line_bytes, read_chunk=read_chunk,
                                 fingerprint_bytes=fingerprint_bytes, clock=clock,
                                 on_error=self.error)
        self._rotation = Rotation(self.reader, self.event, self.error, self.key)

    def key(self, dev: int, ino: int) -> FileKey:
        self._serial += 1
        return FileKey(dev, ino, self._serial)

    def event(self, ps: PathFiles, kind: str, f: TailedFile | None, offset: int, detail: str) -> None:
        level = logging.INFO if kind in (ROTATED, DELETED, TRUNCATED) else logging.WARNING
        log.log(level, "tail %s path=%s file=%s offset=%d %s", kind, ps.path,
                f and f"{f.key.dev}:{f.key.ino}", offset, detail)
        self.events.append(FileChange(ps.path, kind, f.key if f else None, offset, detail, time.time_ns()))

    def error(self, ps: PathFiles, f: TailedFile | None, what: str, exc: OSError) -> None:
        detail = f"{what}: {exc.strerror or exc}"
        if detail != ps.error:  # the same failure is reported once per path
            ps.error = detail
            self.event(ps, ERROR, f, f.read if f else 0, detail)

    def poll(self, ps: PathFiles, budget: int, now_ns: int, out: list[LineBatch]) -> bool:
        """One poll of a path; True if the set of files changed (save the state)."""
        changed = False
        try:
            st: os.stat_result | None = os.stat(ps.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            self.error(ps, None, "stat", exc)
            return False
        if not ps.resolved:
            changed = self._rotation.resolve(ps, st)
        files = ps.files
        cur = files[-1] if files and files[-1].at_path else None
        if cur is not None and (st is None or (st.st_ino, st.st_dev) != (cur.key.ino, cur.key.dev)):
            cur.at_path = False
            self.event(ps, DELETED if st is None else ROTATED, cur, cur.read,
                        "the file at the path is gone" if st is None else
                        f"a new file (inode {st.st_ino}) is at the path; draining the old one")
            cur = None
        ps.more = False
        if cur is None or len(files) > 1:  # (only the file at the path: nothing to drain or drop)
            i = -1
            while (i := i + 1) < len(files):  # drain rotated files first, in stream order
                f = files[i]
                if f.at_path or f.fd is None:
                    continue
                f, truncated = self._rotation.recheck(ps, i, now_ns, out)
                if f is None:
                    files[i].close()
                    continue
                changed |= truncated
                i += files[i] is not f  # truncated: the new content comes right after the old one
                used, eof = self.reader.read(ps, f, budget, now_ns, out)
                budget -= used
                if not eof:
                    ps.more = True
                    return changed
                self.reader.flush(ps, f, now_ns, out)
                f.close()
            done = [f for f in files if f.fd is None and not f.restored and not f.at_path
                    and f.committed >= f.line_start]
            for f in done:
                files.remove(f)
                changed = True
        if cur is None and st is not None:
            if not _stat.S_ISREG(st.st_mode):
                self.error(ps, None, "open", OSError(0, "not a regular file"))
                return changed
            cur = self._open(ps)
            if cur is None:
                return changed
            files.append(cur)
            changed = True
        if cur is None:
            return changed
        if budget <= 0:
            ps.more = True
            return changed
        # the path's stat names cur's inode: its size is cur's, no fstat (a file opened
        # since the stat may be another)
        same = st is not None and (st.st_ino, st.st_dev) == (cur.key.ino, cur.key.dev)
        cur, truncated = self._rotation.recheck(ps, len(files) - 1, now_ns, out, st.st_size if same else None)
        changed |= truncated
        if cur is not None and not cur.at_path:  # the old content goes on in its copy: drain it
            used, eof = self.reader.read(ps, cur, budget, now_ns, out)
            budget -= used
            if eof:
                self.reader.flush(ps, cur, now_ns, out)
                cur.close()
            if not eof or budget <= 0:
                ps.more = True
                return changed
            cur = files[-1]
        if cur is None:
            return changed
        size = st.st_size if (st.st_ino, st.st_dev) == (cur.key.ino, cur.key.dev) else None
        used, eof = self.reader.read(ps, cur, budget, now_ns, out, size)
        if not eof:
            ps.more = True
        elif (cur.pending or cur.cut_head) and self.clock() - cur.last_growth >= self.partial_flush_s:
            self.reader.flush(ps, cur, now_ns, out)
        return changed

    def _open(self, ps: PathFiles) -> TailedFile | None:
        try:
            fd = os.open(ps.path, OPEN_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.error(ps, None, "open", exc)
            return None
        try:
            st = os.fstat(fd)
            f = TailedFile(self.key(st.st_dev, st.st_ino), fd, at_path=True, now=self.clock())
            f.restored = False
            self.reader.check_fingerprint(f)
        except OSError as exc:
            os.close(fd)
            self.error(ps, None, "open", exc)
            return None
        ps.error = ""
        return f
