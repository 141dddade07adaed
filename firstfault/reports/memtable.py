"""The report's ``memory`` object as a short table (rows of strings), for text and Markdown."""

from __future__ import annotations

MAX_ROWS = 8


def size(n) -> str:
    if n is None:
        return ""
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


HEADER = ("rank", "memory", "init peak", "steady", "peak (phase)", "at failure", "limit")


def memory_rows(rep: dict) -> tuple[list[tuple[str, ...]], int]:
    """Rows (HEADER's columns) of the failed rank first, then by peak; and how many were left out."""
    mem = rep.get("memory") or {}
    failed = (rep.get("first_failure") or {}).get("rank")
    rows = []
    for r, info in (mem.get("ranks") or {}).items():
        for name, s in (info.get("series") or {}).items():
            at = s.get("at_failure") or {}
            rows.append(((str(r) != str(failed), -(s.get("peak") or 0)), (
                r, s.get("label") or name, size(s.get("init_peak")), size(s.get("steady")),
                f"{size(s.get('peak'))} ({s.get('peak_phase') or 'unknown'})", size(at.get("value")),
                size(s.get("limit")))))
    rows.sort(key=lambda x: x[0])
    return [r for _, r in rows[:MAX_ROWS]], max(0, len(rows) - MAX_ROWS)
