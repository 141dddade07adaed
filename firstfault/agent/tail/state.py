"""The tailer's state file (firstfault/agent/tail/tailer.py's docstring is the specification:
"State file"): ``StateFile.load`` reads it (a corrupt file is moved to ``<state>.corrupt``
and reported), ``save`` replaces it atomically (tmp, fsync, rename, fsync dir; the fsyncs
only if ``fsync``); ``committed_at_ns`` says when offsets were last committed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from firstfault.agent.tail.lines import STATE_RESET, FileChange, StateError

log = logging.getLogger("firstfault.agent.tail")

STATE_FORMAT = "firstfault.tail"
STATE_VERSION = 1


class StateFile:
    """The state file at ``path`` (None: no state kept); ``on_change(FileChange)`` hears of a
    reset (an unreadable file moved away)."""

    def __init__(self, path: str | None, *, fsync: bool,
                 on_change: Callable[[FileChange], None]) -> None:
        self.path, self.fsync, self.on_change = path, fsync, on_change
        self._last_saved = b""
        self._committed_at = 0  # the file's mtime when a commit last wrote it

    def load(self) -> dict[str, list[dict[str, Any]]]:
        """Path -> the saved entries of its files, in stream order."""
        if self.path is None:
            return {}
        try:
            doc, raw, mtime = _read_state(self.path)
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            bad = self.path + ".corrupt"
            os.replace(self.path, bad)
            log.error("tail state unreadable path=%s (%s): moved to %s; every file is read "
                      "again from offset 0", self.path, exc, bad)
            self.on_change(FileChange("", STATE_RESET, None, 0, f"{exc}; moved to {bad}",
                                      time.time_ns()))
            return {}
        if doc.get("version") != STATE_VERSION:
            raise StateError(f"{self.path}: state version {doc.get('version')!r}, this "
                             f"agent reads {STATE_VERSION}: upgrade the agent or move the file away")
        saved: dict[str, list[dict[str, Any]]] = {}
        types = {"path": str, "dev": int, "ino": int, "fp_len": int, "fp": str, "offset": int}
        for e in doc.get("files", ()):
            if isinstance(e, dict) and all(type(e.get(k)) is t for k, t in types.items()):
                saved.setdefault(e["path"], []).append({k: e[k] for k in types})
            else:
                log.warning("tail state: malformed entry skipped path=%s entry=%r",
                            self.path, e)
        self._last_saved = raw
        self._committed_at = _committed_at(doc, mtime)
        return saved

    def save(self, files: list[dict[str, Any]], committed: bool = False) -> None:
        """Write the state of ``files``; ``committed``: by a commit (its mtime is then the
        commit's time, else the file keeps that time in ``committed_at_ns``)."""
        if self.path is None:
            return
        doc: dict[str, Any] = {"format": STATE_FORMAT, "version": STATE_VERSION, "files": files}
        if not committed:
            doc["committed_at_ns"] = self._committed_at
        raw = json.dumps(doc, separators=(",", ":")).encode()
        if raw == self._last_saved:
            return
        tmp = self.path + ".tmp"
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
            os.replace(tmp, self.path)
            if self.fsync:
                dfd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as exc:
            raise StateError(f"cannot write the tail state {self.path}: {exc}") from exc
        self._last_saved = raw


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
