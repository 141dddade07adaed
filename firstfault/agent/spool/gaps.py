"""The spool's gap records: what they say (firstfault/agent/spool/format.py's docstring
specifies them), how two merge into one, where lost records came from, and finding the gap
records among a segment's entries. Pure: no I/O."""

from __future__ import annotations

import bisect
import json
import time
from collections import Counter
from typing import Any

import msgpack

from firstfault.agent.spool.columns import Columns, Runs
from firstfault.agent.spool.format import HEADER_BYTES
from firstfault.wire import KIND_AGENT_GAP, SOURCE_AGENT

GAP_KIND = msgpack.packb(KIND_AGENT_GAP)


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One gap naming both ranges (and what lies between)."""
    def lo(k):
        return min((v for v in (a[k], b[k]) if v is not None), default=None)

    def hi(k):
        return max((v for v in (a[k], b[k]) if v is not None), default=None)
    n = (None if a["dropped_records"] is None or b["dropped_records"] is None
         else a["dropped_records"] + b["dropped_records"])
    origins = Counter(a.get("origins") or {}) + Counter(b.get("origins") or {})
    return {**a, "dropped_records": n, "dropped_bytes": a["dropped_bytes"] + b["dropped_bytes"],
            "first_seq": lo("first_seq"), "last_seq": hi("last_seq"), "from_ns": lo("from_ns"),
            "to_ns": hi("to_ns"), "origins": dict(origins) if origins else None}


def origin(source: Any, fields: Any) -> str:
    """Where a record comes from, for a gap: its file (``fields.path``), else its source."""
    path = fields.get("path") if type(fields) is dict else None
    return path if type(path) is str else str(source)


def count_origins(c: Columns) -> Counter:
    """How many of ``c``'s records come from each origin (``origin``)."""
    source, fields = (col.values() if type(col) is Runs else col for col in (c.cols[0], c.cols[-1]))
    return Counter(map(origin, source, fields))


def iso(ns: int | None) -> str:
    if ns is None:
        return "?"
    ms = ns % 10**9 // 10**6
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ms:03d}Z"


def gap_row(g: dict[str, Any], now_ns: int) -> tuple:
    n, a, b = g["dropped_records"], g["first_seq"], g["last_seq"]
    what = {"overflow": "spool over max_bytes: dropped the oldest unshipped",
            "corrupt": "spool corrupt on disk: lost",
            "disk_full": "disk full: could not spool"}.get(g["reason"], "lost")
    count = f"{n}" if n is not None else f"at most {b - a + 1}"
    origins = sorted((g.get("origins") or {}).items(), key=lambda kv: (-kv[1], kv[0]))
    where = f" from {', '.join(f'{o} ({k})' for o, k in origins[:8])}" if origins else ""
    more = f" and {len(origins) - 8} more" if len(origins) > 8 else ""
    msg = (f"{what} {count} records (seq {a}..{b}, {g['dropped_bytes']} bytes) observed "
           f"{iso(g['from_ns'])} .. {iso(g['to_ns'])}{where}{more}")
    occurred = None if g["reason"] == "corrupt" else g.get("at_ns", now_ns)
    fields = {k: g[k] for k in ("reason", "dropped_records", "dropped_bytes", "first_seq",
                                "last_seq", "from_ns", "to_ns")}
    if origins:
        fields["origins"] = origins_text(origins)
    return (SOURCE_AGENT, KIND_AGENT_GAP, msg, occurred, now_ns, None, None, None, None,
            None, None, 4, fields)


def origins_text(origins: list[tuple[str, int]], limit: int = 1000) -> str:
    """A gap's ``origins`` field: JSON ``{file or source: records lost}``, largest first,
    within ``limit`` bytes; the records of what does not fit are counted under "(more)"."""
    kept: dict[str, int] = {}
    for i, (o, k) in enumerate(origins):
        rest = sum(k2 for _, k2 in origins[i + 1:])
        trial = {**kept, o: k, **({"(more)": rest} if rest else {})}
        if len(json.dumps(trial, ensure_ascii=False).encode()) > limit:
            kept["(more)"] = k + rest
            break
        kept[o] = k
    return json.dumps(kept, ensure_ascii=False)


def gaps_in(buf: bytes, entries: list[tuple[int, int, int, int]]) -> list[tuple[int, dict[str, Any]]]:
    """(seq, fields) of the gap records among ``entries`` (found by their kind's bytes)."""
    out, at, starts = [], 0, [e[0] for e in entries]
    while (i := buf.find(GAP_KIND, at)) != -1:
        k = bisect.bisect_right(starts, i) - 1
        if k < 0 or i >= entries[k][1]:  # in bytes that are no entry
            at = i + 1
            continue
        at = entries[k][1]
        try:
            cols = msgpack.unpackb(buf[entries[k][0] + HEADER_BYTES:entries[k][1]], raw=False,
                                   strict_map_key=False)[1:]
        except (ValueError, TypeError, msgpack.UnpackException):
            continue
        out += [(entries[k][2] + j, f) for j, (kind, f) in enumerate(zip(cols[1], cols[12]))
                if kind == KIND_AGENT_GAP and gap_ok(f)]
    return out


def gap_ok(g: Any) -> bool:
    """Whether ``g`` (from meta) has the fields of a gap."""
    return (type(g) is dict and type(g.get("reason")) is str
            and all(type(g.get(k)) is int for k in ("first_seq", "last_seq", "dropped_bytes"))
            and all(g.get(k) is None or type(g.get(k)) is int
                    for k in ("dropped_records", "from_ns", "to_ns")))
