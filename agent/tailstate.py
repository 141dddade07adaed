"""The tailer's state file and restart recovery (part of agent/tail.py, whose docstring
is the specification: "State file" and the "restart" rotation rule).

``_State`` is mixed into Tailer: ``_load`` reads ``state_path`` (a corrupt file is
moved to ``<state>.corrupt`` and reported), ``_save`` replaces it atomically
(tmp, fsync, rename, fsync dir); ``_resolve`` / ``_reopen`` find a path's saved
files again after a restart, at the path or rotated beside it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from agent.tailfile import (LOST, ROTATED, STATE_RESET, Event, FileKey, StateError, _File,
                            _fingerprint, _PathState)

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

    def _reopen(self, f: _File, where: str) -> str:
        try:
            fd = os.open(where, _OPEN_FLAGS)
        except OSError as exc:
            return f"cannot be opened ({exc.strerror})"
        try:
            st = os.fstat(fd)
            head = os.pread(fd, f.fp_len, 0) if f.fp_len else b""
        except OSError as exc:
            os.close(fd)
            return f"cannot be read ({exc.strerror})"
        if st.st_ino != f.key.ino:
            why = "was replaced"
        elif len(head) < f.fp_len or _fingerprint(head) != f.fp:
            why = "has other first bytes (truncated, rewritten or a reused inode)"
        elif st.st_size < f.committed:
            why = f"is shorter ({st.st_size}) than the committed offset"
        else:
            f.fd, f.restored, f.last_growth = fd, False, self.clock()
            if st.st_dev != f.key.dev:  # device numbers can change across reboots
                f.key = FileKey(st.st_dev, f.key.ino, f.key.serial)
            return ""
        os.close(fd)
        return why


    # -- state file --------------------------------------------------------------

    def _load(self) -> dict[str, list[dict[str, Any]]]:
        if self.state_path is None:
            return {}
        try:
            with open(self.state_path, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
                raise ValueError("not a firstfault.tail state file")
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
        return saved

    def _save(self) -> None:
        if self.state_path is None:
            return
        files = [f.state(ps.path) for ps in self._paths.values() for f in ps.files if not f.gone]
        files += [e for entries in self._saved.values() for e in entries]
        raw = json.dumps({"format": STATE_FORMAT, "version": STATE_VERSION, "files": files},
                         separators=(",", ":")).encode()
        if raw == self._last_saved:
            return
        tmp = self.state_path + ".tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(raw)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.state_path)
            dfd = os.open(os.path.dirname(self.state_path) or ".", os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            raise StateError(f"cannot write the tail state {self.state_path}: {exc}") from exc
        self._last_saved = raw

