"""The notice queue on disk: pending deliveries survive a restart; bounded.

The folder (this docstring is its spec, version 1)::

    QUEUE_DIR/pending/<id>.json     one delivery: a notice for one target
    QUEUE_DIR/sent.json             the answer last told of each job (no repeat after a restart)

``<id>`` is a 20-digit number, increasing: names sort in the order the deliveries were
queued. A delivery file is one JSON object ``{"version": 1, "target": NAME, "notice":
{...}, "attempts": N, "next_at": UNIX_S, "queued_at": UNIX_S}``. Every file is written
whole: to ``.<name>.tmp``, fsync, rename over the name, fsync of the folder; a reader
skips dot names, so it never sees half a file. A delivery's file is deleted once it is
delivered or given up (both logged). More than ``max_items`` pending: the oldest are
deleted, each logged as dropped. A file that cannot be read as a delivery (a crash of
the disk, an edit) is moved aside to ``QUEUE_DIR/bad/`` and logged, never retried.

Synchronous and small: the notifier calls these off the event loop (asyncio.to_thread).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

VERSION = 1
MAX_SENT = 10_000  # jobs remembered in sent.json (the oldest forgotten)


@dataclass(frozen=True, slots=True)
class Delivery:
    id: str
    target: str
    notice: dict
    attempts: int
    next_at: float
    queued_at: float


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class NoticeQueue:
    def __init__(self, folder: Path, max_items: int) -> None:
        self.folder = Path(folder)
        self.pending = self.folder / "pending"
        self.pending.mkdir(parents=True, exist_ok=True)
        self.max_items = max_items
        names = self._names()
        self._next = int(names[-1]) + 1 if names else 1

    def _names(self) -> list[str]:
        return sorted(p.stem for p in self.pending.glob("[0-9]*.json"))

    def _path(self, id: str) -> Path:
        return self.pending / f"{id}.json"

    def put(self, target: str, notice: dict, now: float) -> tuple[Delivery, list[str]]:
        """The new delivery, and the ids of the oldest ones dropped to keep the bound."""
        d = Delivery(f"{self._next:020d}", target, notice, 0, now, now)
        self._next += 1
        self.save(d)
        names = self._names()
        dropped = names[:max(0, len(names) - self.max_items)]
        for old in dropped:
            self._path(old).unlink(missing_ok=True)
            log.error("notice dropped delivery=%s reason=queue-full max_queue=%d", old, self.max_items)
        return d, dropped

    def save(self, d: Delivery) -> None:
        doc = {"version": VERSION, "target": d.target, "notice": d.notice, "attempts": d.attempts,
               "next_at": d.next_at, "queued_at": d.queued_at}
        _write(self._path(d.id), json.dumps(doc, ensure_ascii=False).encode())

    def remove(self, id: str) -> None:
        self._path(id).unlink(missing_ok=True)

    def load(self) -> list[Delivery]:
        """Every pending delivery, oldest first; unreadable files moved to bad/."""
        out = []
        for name in self._names():
            path = self._path(name)
            try:
                doc = json.loads(path.read_bytes())
                if doc.get("version") != VERSION:
                    raise ValueError(f"version {doc.get('version')!r}, this collector reads {VERSION}")
                out.append(Delivery(name, str(doc["target"]), dict(doc["notice"]), int(doc["attempts"]),
                                    float(doc["next_at"]), float(doc["queued_at"])))
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError) as e:
                bad = self.folder / "bad"
                bad.mkdir(exist_ok=True)
                try:
                    os.replace(path, bad / path.name)
                except OSError:
                    path.unlink(missing_ok=True)
                log.error("notice file unreadable file=%s error=%s: moved to %s", path.name, e, bad)
        return out

    # --- what was told of each job --------------------------------------------------

    def load_sent(self) -> dict[str, dict]:
        path = self.folder / "sent.json"
        try:
            doc = json.loads(path.read_bytes())
            return dict(doc["jobs"]) if doc.get("version") == VERSION else {}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.error("notice state unreadable file=%s error=%s: every job counts as untold", path, e)
            return {}

    def save_sent(self, sent: dict[str, dict]) -> None:
        if len(sent) > MAX_SENT:
            for job in sorted(sent, key=lambda j: sent[j].get("at", 0))[:len(sent) - MAX_SENT]:
                del sent[job]
        _write(self.folder / "sent.json", json.dumps({"version": VERSION, "jobs": sent},
                                                      ensure_ascii=False).encode())
