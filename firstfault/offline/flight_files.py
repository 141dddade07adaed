"""Flight Recorder dump files among the inputs of ``analyze`` (the I/O side).

torch writes one dump per rank to ``<prefix><rank>`` (``TORCH_FR_DUMP_TEMP_FILE``,
default ``~/.cache/torch/comm_lib_trace_rank_``), pickle or JSON: a folder of them given
to ``analyze`` (alone or beside the logs) is read here, the rank taken from the file
name's trailing digits as torch's ``fr_trace`` does. Parsing is pure and restricted
(firstfault/analysis/frdump.py: no imports, no calls); a file that is no readable dump
becomes a gap and costs nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from firstfault.analysis.events import KIND_FLIGHT_RECORDER, Event
from firstfault.analysis.frdump import MAX_DUMP_BYTES, FRFormatError, looks_like_dump, parse_dump

_RANK = re.compile(r"(\d+)$")

__all__ = ["looks_like_dump", "dump_rank", "flight_recorder_events"]


def dump_rank(path: str) -> int | None:
    """The rank a dump file's name ends with (``.../comm_lib_trace_rank_3`` -> 3)."""
    m = _RANK.search(path.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def flight_recorder_events(f, path: str, node: str | None, mtime: int | None, res) -> Iterator[Event]:
    """One KIND_FLIGHT_RECORDER Event for the dump in the open file ``f``; a gap if unreadable."""
    data = f.read(MAX_DUMP_BYTES + 1)
    res.bytes_read += len(data)
    try:
        dump = parse_dump(data)
    except FRFormatError as e:
        res.gaps.append({"file": path, "source": "flight_recorder", "reason": f"not a readable dump: {e}"})
        return
    yield Event(text="", source="agent", kind=KIND_FLIGHT_RECORDER, node=node, rank=dump_rank(path),
                occurred_ns=mtime, observed_ns=mtime, clock="file-mtime" if mtime else None, origin=path,
                stream=path, fields={"dump": dump, "path": path})
