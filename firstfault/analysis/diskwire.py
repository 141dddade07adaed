"""A checkpoint directory's inspection (firstfault/common/checkpoint_files.py's plain data,
as an agent ships it) into the analysis' DiskCheckpoint. Pure.

The inspection may come from an agent over the wire: every field is checked for its type
and size, and anything else raises DiskWireError (the collector then notes a gap)."""

from __future__ import annotations

from typing import Any

from firstfault.analysis.checkpoint import DiskCheckpoint, DiskFile, DiskTag

SCHEMA = "firstfault.checkpoint-inspection/1"
MAX_TAGS, MAX_FILES, MAX_TEXT = 10_000, 100_000, 4096
STATUSES = ("ok", "missing", "empty", "truncated", "not-zip", "not-torch", "corrupt", "unreadable")


class DiskWireError(ValueError):
    """An inspection that is not the schema's."""


def _str(d: dict, k: str, *, none: bool = True) -> str | None:
    v = d.get(k)
    if v is None and none:
        return None
    if not isinstance(v, str) or len(v) > MAX_TEXT:
        raise DiskWireError(f"{k}: a string of at most {MAX_TEXT} characters expected")
    return v


def _int(d: dict, k: str) -> int | None:
    v = d.get(k)
    if v is None:
        return None
    if type(v) is not int:
        raise DiskWireError(f"{k}: an integer expected")
    return v


def _list(d: dict, k: str, limit: int) -> list:
    v = d.get(k) or []
    if not isinstance(v, list) or len(v) > limit:
        raise DiskWireError(f"{k}: a list of at most {limit} items expected")
    return v


def _strs(d: dict, k: str) -> list[str]:
    out = _list(d, k, MAX_FILES)
    if not all(isinstance(x, str) and len(x) <= MAX_TEXT for x in out):
        raise DiskWireError(f"{k}: strings expected")
    return out


def _dict(v: Any, what: str) -> dict:
    if not isinstance(v, dict):
        raise DiskWireError(f"{what}: an object expected")
    return v


def _file(d: dict) -> DiskFile:
    status = _str(d, "status", none=False)
    if status not in STATUSES:
        raise DiskWireError(f"status: one of {', '.join(STATUSES)} expected")
    return DiskFile(_str(d, "name", none=False), _int(d, "rank"), _str(d, "kind", none=False), status,
                    _int(d, "size_bytes"), _int(d, "mtime_ns"), _str(d, "detail") or "")


def _tag(d: dict) -> DiskTag:
    files = [_file(_dict(f, "file")) for f in _list(d, "files", MAX_FILES)]
    if not isinstance(d.get("complete"), bool):
        raise DiskWireError("complete: true or false expected")
    return DiskTag(_str(d, "tag", none=False), _int(d, "step"), files, d["complete"], _strs(d, "problems"),
                   _int(d, "world_size_seen") or 0, _int(d, "mtime_ns"))


def disk_from_wire(d: Any) -> DiskCheckpoint:
    """The DiskCheckpoint of an inspection; DiskWireError names what is wrong."""
    d = _dict(d, "inspection")
    if d.get("schema") != SCHEMA:
        raise DiskWireError(f"schema: {SCHEMA} expected")
    return DiskCheckpoint(_str(d, "path", none=False), _str(d, "latest"), _str(d, "latest_problem"),
                          [_tag(_dict(t, "tag")) for t in _list(d, "tags", MAX_TAGS)], _int(d, "world_size"),
                          _str(d, "world_size_from"), _str(d, "zero_stage") or "unknown", _strs(d, "notes"))
