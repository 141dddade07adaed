"""Following growing log files byte-exactly across rotation and restarts (tailer.py's
docstring is the specification): tailer.py (the Tailer: its API), poll.py (one poll of a
path), file.py (reading one file, splitting lines), rotation.py (rotation, truncation,
restarts), state.py (the saved offsets), lines.py (what the Tailer hands out), follow.py
(the loop that drives a Tailer from inotify), inotify.py (inotify(7) by ctypes). The names
the rest of the agent uses are here (follow.py's are imported from it).
"""

from firstfault.agent.tail.lines import (
    CUT_MARKER,
    DELETED,
    ERROR,
    LOST,
    MIN_LINE_BYTES,
    ROTATED,
    STATE_RESET,
    TRUNCATED,
    FileChange,
    FileKey,
    Line,
    LineBatch,
    Position,
    StateError,
    TailError,
    cut_line,
    to_text,
)
from firstfault.agent.tail.state import STATE_FORMAT, STATE_VERSION, committed_at_ns
from firstfault.agent.tail.tailer import Tailer

__all__ = ["CUT_MARKER", "DELETED", "ERROR", "LOST", "MIN_LINE_BYTES", "ROTATED", "STATE_FORMAT",
           "STATE_RESET", "STATE_VERSION", "TRUNCATED", "FileChange", "FileKey", "Line",
           "LineBatch", "Position", "StateError", "TailError", "Tailer", "committed_at_ns",
           "cut_line", "to_text"]
