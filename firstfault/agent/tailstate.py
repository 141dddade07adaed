"""The tailer's state file and restart recovery (part of firstfault/agent/tail.py, whose docstring
is the specification: "State file" and the "restart" rotation rule).

``_State`` is mixed into Tailer: ``_load`` reads ``state_path`` (a corrupt file is
moved to ``<state>.corrupt`` and reported), ``_save`` replaces it atomically
(tmp, fsync, rename, fsync dir; the fsyncs only if ``fsync``); ``_resolve`` /
``_reopen`` find a path's saved files again after a restart, at the path or rotated
beside it, and ``_recheck`` a content truncated in place (copytruncate: its copy
beside the path, ``find_copy``); ``advance`` (with
``fingerprint`` and ``committed_at_ns``) moves a restored position past the last
commit to where the consumer's own records say it took the stream.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from firstfault.agent.tailfile import (
    LOST,
    ROTATED,
    STATE_RESET,
    TRUNCATED,
    Event,
    FileKey,
    LineBatch,
    StateError,
    TailError,
    _File,
    _fingerprint,
    _PathState,
)

log = logging.getLogger(__name__)

STATE_FORMAT = "firstfault.tail"
STATE_VERSION = 1
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


class _State:
    """State file and restart lookup of a Tailer (mixed in: uses its paths, events, clock)."""

    def _resolve(self, ps: _PathState, st: os.stat_result | None) -> bool:
        """After a restart: find the saved files of a path (at it, or rotated beside it)."""
        ps.resolved = True
        found: dict[int, str] = {}
        if st is not None:
            found[st.st_ino] = ps.path
        wanted = {f.key.ino for f in ps.files if f.restored} - set(found)
        if wanted:
            try:
                with os.scandir(os.path.dirname(ps.path) or ".") as it:
                    for entry in it:
                        ino = entry.inode()
                        if ino in wanted and ino not in found:
                            found[ino] = entry.path
            except OSError as exc:
                log.warning("tail cannot scan for rotated files path=%s: %s", ps.path, exc)
        keep = []
        for f in ps.files:
            if not f.restored:
                keep.append(f)
                continue
            where = found.get(f.key.ino)
            if where is None:
                why = "not found at the path or beside it"
            elif not f.fp_len and where != ps.path:  # no first bytes to tell it from a stranger
                why = f"was empty when last seen, so {where} may be another file"
            else:
                why = self._reopen(f, where)
            if why and f.fp_len:  # copytruncate while stopped: the content lives on in its copy
                copy = find_copy(ps.path, f.key.ino, f.fp_len, f.fp, f.committed)
                if copy is not None and not self._reopen(f, copy, same_inode=False):
                    where, why = copy, ""
            if why:
                self._event(ps, LOST, f, f.committed,
                            f"saved file {f.key.dev}:{f.key.ino} {why}: its bytes after the "
                            f"committed offset {f.committed} are lost")
                continue
            f.at_path = where == ps.path
            keep.append(f)
            if not f.at_path:
                self._event(ps, ROTATED, f, f.committed,
                            f"rotated while stopped, now {where}: draining from the committed offset")
        for f in keep[:-1]:  # only the newest file of a stream can be the one at the path
            f.at_path = False
        ps.files = keep
        return True

    def _reopen(self, f: _File, where: str, same_inode: bool = True) -> str:
        try:
            fd = os.open(where, _OPEN_FLAGS)
        except OSError as exc:
            return f"cannot be opened ({exc.strerror})"
        ahead = f.ahead
        try:
            st = os.fstat(fd)
            n = max(f.fp_len, ahead[1] if ahead else 0)
            head = os.pread(fd, n, 0) if n else b""
        except OSError as exc:
            os.close(fd)
            return f"cannot be read ({exc.strerror})"
        if same_inode and st.st_ino != f.key.ino:
            why = "was replaced"
        elif len(head) < f.fp_len or _fingerprint(head[:f.fp_len]) != f.fp:
            why = "has other first bytes (truncated, rewritten or a reused inode)"
        elif st.st_size < f.committed:
            why = f"is shorter ({st.st_size}) than the committed offset"
        else:
            f.fd, f.restored, f.last_growth, f.ahead = fd, False, self.clock(), None
            if (st.st_dev, st.st_ino) != f.key[:2]:  # devices renumbered at boot; a copy
                f.key = FileKey(st.st_dev, st.st_ino, f.key.serial)
            if ahead is not None:
                offset, fp_len, fp = ahead
                if offset <= st.st_size and len(head) >= fp_len and _fingerprint(head[:fp_len]) == fp:
                    log.info("tail file=%d:%d committed offset %d -> %d (taken after the last "
                             "commit)", st.st_dev, st.st_ino, f.committed, offset)
                    f.read = f.line_start = f.committed = offset
                else:
                    log.info("tail file=%d:%d advance to %d ignored: not this content",
                             st.st_dev, st.st_ino, offset)
            return ""
        os.close(fd)
        return why


    # -- a content truncated in place ---------------------------------------------

    def _recheck(self, ps: _PathState, i: int, now_ns: int, out: list[LineBatch],
                 size: int | None = None) -> tuple[_File | None, bool]:
        """(file, truncated): ps.files[i] if it still holds the content being read, else
        (truncated, or rewritten in place) its new content, read from 0 -- or, when a copy
        of the old content lies beside the path (``find_copy``), the old content read on
        from the copy, the new one right after it; None: unknown."""
        f = ps.files[i]
        known = f.fp_len
        try:
            if size is None:  # (given: the path's stat, when it names this inode)
                size = os.fstat(f.fd).st_size
            if size >= f.read and self._check_fingerprint(f):
                return f, not known and f.fp_len > 0  # first bytes seen: save them
        except OSError as exc:
            self._error(ps, f, "fstat", exc)
            return None, False
        copy = find_copy(ps.path, f.key.ino, f.fp_len, f.fp, f.read,
                         (f.line_start, f.pending)) if f.fp_len else None
        try:
            copy_fd = os.open(copy, _OPEN_FLAGS) if copy is not None else None
        except OSError:
            copy_fd = None
        if copy_fd is None:
            self._flush(ps, f, now_ns, out)  # the partial line held in memory is all that is left
        if copy_fd is None:
            self._event(ps, TRUNCATED, f, f.read,
                        f"size {size} < offset {f.read} or first bytes changed: reading from 0")
        else:  # nothing lost: as a rotation
            self._event(ps, ROTATED, f, f.read, f"copytruncate (size {size} < offset {f.read} "
                        f"or first bytes changed): the rest is read from its copy {copy}")
        new = _File(self._key(f.key.dev, f.key.ino), f.fd, at_path=f.at_path, now=self.clock())
        # the descriptor now reads the new content; the old one is in the copy, or gone
        f.fd, f.at_path, f.gone = copy_fd, False, copy_fd is None
        ps.files.insert(i + 1, new)
        try:
            self._check_fingerprint(new)
        except OSError as exc:
            self._error(ps, new, "read", exc)
        return (new if copy_fd is None else f), True

    # -- catching up -------------------------------------------------------------

    def fingerprint(self, path: str, file: FileKey) -> tuple[int, str] | None:
        """(fp_len, fp) of a content of ``path`` that lines were returned from (None: not
        known): with the file's (dev, ino) it names that content across restarts."""
        with self._lock:
            ps = self._paths.get(path)
            for f in ps.files if ps is not None else ():
                if f.key == file:
                    return f.fp_len, f.fp
            return None

    def advance(self, path: str, dev: int, ino: int, offset: int, fp_len: int, fp: str) -> bool:
        """Before ``add(path)``: the consumer durably took ``path``'s stream up to ``offset``
        of the file (dev, ino) whose first ``fp_len`` bytes hash to ``fp`` (a position it
        kept itself after the last commit, e.g. in its spool). The saved files before that
        one are forgotten (a stream is taken in order); its committed offset moves there
        when the restart finds it (as ``_resolve`` does) with those first bytes, at least
        ``offset`` long; otherwise nothing moves. Only forward. False: no saved file of
        the path has that (dev, ino) (stale, unknown): nothing changes."""
        with self._lock:
            if path in self._paths:
                raise TailError(f"advance of path={path!r} after add()")
            entries = self._saved.get(path, [])
            i = next((i for i, e in enumerate(entries) if (e["dev"], e["ino"]) == (dev, ino)), -1)
            if i < 0:
                return False
            del entries[:i]
            if offset > entries[0]["offset"]:
                self._ahead[path] = (dev, ino, offset, fp_len, fp)
            return True

    # -- state file --------------------------------------------------------------

    def _load(self) -> dict[str, list[dict[str, Any]]]:
        if self.state_path is None:
            return {}
        try:
            doc, raw, mtime = _read_state(self.state_path)
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            bad = self.state_path + ".corrupt"
            os.replace(self.state_path, bad)
            log.error("tail state unreadable path=%s (%s): moved to %s; every file is read "
                      "again from offset 0", self.state_path, exc, bad)
            self._events.append(Event("", STATE_RESET, None, 0, f"{exc}; moved to {bad}",
                                      time.time_ns()))
            return {}
        if doc.get("version") != STATE_VERSION:
            raise StateError(f"{self.state_path}: state version {doc.get('version')!r}, this "
                             f"agent reads {STATE_VERSION}: upgrade the agent or move the file away")
        saved: dict[str, list[dict[str, Any]]] = {}
        types = {"path": str, "dev": int, "ino": int, "fp_len": int, "fp": str, "offset": int}
        for e in doc.get("files", ()):
            if isinstance(e, dict) and all(type(e.get(k)) is t for k, t in types.items()):
                saved.setdefault(e["path"], []).append({k: e[k] for k in types})
            else:
                log.warning("tail state: malformed entry skipped path=%s entry=%r",
                            self.state_path, e)
        self._last_saved = raw
        self._committed_at = _committed_at(doc, mtime)
        return saved

    def _save(self, committed: bool = False) -> None:
        """Write the state; ``committed``: by a commit (its mtime is then the commit's time,
        else the file keeps that time in ``committed_at_ns``)."""
        if self.state_path is None:
            return
        files = [f.state(ps.path) for ps in self._paths.values() for f in ps.files if not f.gone]
        files += [e for entries in self._saved.values() for e in entries]
        doc: dict[str, Any] = {"format": STATE_FORMAT, "version": STATE_VERSION, "files": files}
        if not committed:
            doc["committed_at_ns"] = self._committed_at
        raw = json.dumps(doc, separators=(",", ":")).encode()
        if raw == self._last_saved:
            return
        tmp = self.state_path + ".tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(raw)
                while view:
                    view = view[os.write(fd, view):]
                if self.fsync:
                    os.fsync(fd)
                if committed:
                    self._committed_at = os.fstat(fd).st_mtime_ns
            finally:
                os.close(fd)
            os.replace(tmp, self.state_path)
            if self.fsync:
                dfd = os.open(os.path.dirname(self.state_path) or ".", os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as exc:
            raise StateError(f"cannot write the tail state {self.state_path}: {exc}") from exc
        self._last_saved = raw


def find_copy(path: str, ino: int, fp_len: int, fp: str, min_size: int,
              tail: tuple[int, bytes] = (0, b"")) -> str | None:
    """A copy of a content of ``path`` (logrotate ``copytruncate``: ``rank3.log.1``,
    ``rank3.log-20261202``): a regular file beside it whose name starts with the path's,
    another inode, at least ``min_size`` bytes, whose first ``fp_len`` bytes hash to ``fp``
    and that holds ``tail`` (offset, bytes: a partial line in memory); newest first, the 16
    newest candidates looked at."""
    folder, base = os.path.split(path)
    found = []
    try:
        with os.scandir(folder or ".") as it:
            for e in it:
                if e.name != base and e.name.startswith(base) and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    if st.st_ino != ino and st.st_size >= min_size:
                        found.append((st.st_mtime_ns, e.path))
    except OSError as exc:
        log.warning("tail cannot scan for a copy of path=%s: %s", path, exc)
        return None
    for _, where in sorted(found, reverse=True)[:16]:
        try:
            with open(where, "rb") as fh:
                head = fh.read(fp_len)
                fh.seek(tail[0])
                same_tail = fh.read(len(tail[1])) == tail[1]
        except OSError:
            continue
        if len(head) == fp_len and _fingerprint(head) == fp and same_tail:
            return where
    return None


def _read_state(path: str) -> tuple[dict, bytes, int]:
    """(document, its bytes, the file's mtime); FileNotFoundError, ValueError (not ours)."""
    with open(path, "rb") as fh:
        raw, mtime = fh.read(), os.fstat(fh.fileno()).st_mtime_ns
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        raise ValueError("not a firstfault.tail state file")
    return doc, raw, mtime


def _committed_at(doc: dict, mtime: int) -> int:
    at = doc.get("committed_at_ns")
    return at if type(at) is int else mtime


def committed_at_ns(state_path: str) -> int:
    """When the committed offsets in the state file at ``state_path`` were written (the
    clock of file mtimes, ns); 0: no (usable) state, nothing committed yet. Lines returned
    after that time and taken by the consumer are past the saved offsets (``advance``)."""
    try:
        doc, _, mtime = _read_state(state_path)
    except (OSError, ValueError):
        return 0
    return _committed_at(doc, mtime)
