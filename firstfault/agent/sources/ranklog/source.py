"""The ranklog source: its options, the globs it follows, the catch-up of positions from
the spool at start, and the thread that runs the engine (engine.RankLines) under a
FollowLoop. The behaviour is specified in the package docstring."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable

from firstfault.agent.sources.base import Emit, IntakeFull, Source, printable, register
from firstfault.agent.sources.ranklog.engine import LINE_KINDS, POSITION, POSITION_TYPES, RankLines, Watch
from firstfault.agent.tail import MIN_LINE_BYTES, Tailer, committed_at_ns
from firstfault.agent.tail.follow import FollowLoop, compile_glob
from firstfault.common.crilog import pod_log_globs
from firstfault.common.layouts import TORCHRUN_FILES, layout_globs, parse_log_path
from firstfault.wire import COLUMNS, MAX_MESSAGE_BYTES, SOURCE_RANKLOG

_GLOB_CHARS = set("*?[]{}")


def _option_paths(name: str, value, *, dirs: bool) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(
            isinstance(v, str) and v for v in value):
        raise ValueError(f"ranklog: {name} must be a list of paths, got {value!r}")
    out = []
    for v in value:
        if not os.path.isabs(v):
            raise ValueError(f"ranklog: {name}: {v!r} is not an absolute path")
        if dirs and _GLOB_CHARS & set(v):
            raise ValueError(f"ranklog: {name}: {v!r} holds a glob character; use globs for patterns")
        if not dirs:
            try:
                compile_glob(v)
            except (ValueError, re.error) as e:
                raise ValueError(f"ranklog: globs: {v!r}: {e}") from None
        out.append(os.path.normpath(v) if dirs else v)
    return out


def glob_names_a_job(glob: str) -> bool:
    """Whether a path ``glob`` matches can give its lines a job (see Identity above): it has a
    ``{job}`` part, or it can match torchrun's layout, whose run folder names the job. A glob
    that cannot (``/logs/*/rank*.log``) ships lines of no job unless the agent has ``job``:
    the collector lists no job for them (agent/config.py refuses it)."""
    try:
        _, rx = compile_glob(glob)
    except (ValueError, re.error):
        return True  # _option_paths says what is wrong with it
    if "job" in rx.groupindex:
        return True
    parts = glob.split("/")
    if len(parts) < 5:  # "", run folder, attempt_N, local rank, file
        return False
    run = parts[-4] if not _GLOB_CHARS & set(parts[-4]) else "job_abcdefgh"  # a run id + mkdtemp's "_" + 8
    samples = ("/".join([*parts[:-4], run, f"attempt_{attempt}", local, name])
               for name in TORCHRUN_FILES for attempt in ("0", "1") for local in ("0", "1", "7"))
    return any(rx.fullmatch(p) and (lp := parse_log_path(p)) is not None and lp.run_id for p in samples)


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"ranklog: {name} must be a number > 0, got {value!r}")
    return float(value)


@register
class RanklogSource(Source):
    """Follows rank log files; see the package docstring. Options = ``[sources.ranklog]``."""

    name = SOURCE_RANKLOG

    def __init__(self, *, globs: list[str] | tuple[str, ...] = (), dirs: list[str] | tuple[str, ...] = (),
                 pod_dirs: list[str] | tuple[str, ...] = (), job_label: str | None = None,
                 max_line_bytes: int = MAX_MESSAGE_BYTES, traceback_flush_s: float = 1.0,
                 partial_flush_s: float = 5.0, safety_poll_s: float = 5.0, read_gap_s: float = 0.025,
                 watch: Watch | None = None, pod_owner: Callable[[str], object | None] | None = None,
                 **kw) -> None:
        super().__init__(**kw)
        self.watch, self.pod_owner = watch, pod_owner
        self.globs = _option_paths("globs", globs, dirs=False)
        self.dirs = _option_paths("dirs", dirs, dirs=True)
        self.pod_dirs = _option_paths("pod_dirs", pod_dirs, dirs=True)
        if job_label is not None and not isinstance(job_label, str):
            raise ValueError(f"ranklog: job_label must be a string, got {job_label!r}")
        self.job_label = job_label or None
        if (isinstance(max_line_bytes, bool) or not isinstance(max_line_bytes, int)
                or not MIN_LINE_BYTES <= max_line_bytes <= MAX_MESSAGE_BYTES):
            raise ValueError(f"ranklog: max_line_bytes must be an int in {MIN_LINE_BYTES}.."
                             f"{MAX_MESSAGE_BYTES} (the wire's message limit), got {max_line_bytes!r}")
        self.max_line_bytes = max_line_bytes
        self.traceback_flush_s = _positive("traceback_flush_s", traceback_flush_s)
        self.partial_flush_s = _positive("partial_flush_s", partial_flush_s)
        self.safety_poll_s = _positive("safety_poll_s", safety_poll_s)
        self.read_gap_s = _positive("read_gap_s", read_gap_s)
        self.state_path = os.path.join(self.state_dir, "ranklog.json") if self.state_dir else None
        self._spooled: dict[str, tuple[int, int, int, int, str]] = {}  # path -> catch_up's

    def saved_at_ns(self) -> int | None:
        return committed_at_ns(self.state_path) if self.state_path else None

    def catch_up(self, rows) -> None:
        """Per path, the position of its newest spooled row that carries one."""
        i_kind, i_fields = COLUMNS.index("kind"), COLUMNS.index("fields")
        for r in rows:  # oldest first
            f = r[i_fields]
            if "ino" in f and r[i_kind] in LINE_KINDS:
                pos = tuple(f.get(k) for k in POSITION)
                if isinstance(f.get("path"), str) and list(map(type, pos)) == POSITION_TYPES:
                    self._spooled[f["path"]] = pos

    def patterns(self) -> list[str]:
        """Every glob followed: the configured ones, the layouts' under each dir, the kubelet's
        container logs under each pod dir."""
        return (self.globs + [g for d in self.dirs for g in layout_globs(d)]
                + [g for d in self.pod_dirs for g in pod_log_globs(d)])

    def run(self, emit: Emit, stop: threading.Event) -> None:
        tailer = Tailer(self.state_path, max_line_bytes=self.max_line_bytes,
                        partial_flush_s=self.partial_flush_s, fsync=False)
        try:
            for path in tailer.saved_paths():  # what the spool got after the last commit
                pos = self._spooled.get(printable(path))
                if pos is not None:
                    tailer.advance(path, *pos)
            engine = RankLines(tailer, emit, job_label=self.job_label,
                               traceback_flush_s=self.traceback_flush_s, watch=self.watch, hold=stop.wait,
                               spooled=self._spooled, pod_owner=self.pod_owner)
            loop = FollowLoop(tailer, self.patterns(), None, stop, on_batches=engine.batches,
                              on_events=engine.events, on_tick=engine.tick,
                              safety_poll_s=self.safety_poll_s, min_wake_s=self.read_gap_s)
        except BaseException:
            tailer.close()
            raise
        try:
            loop.run()  # closes the tailer
        except IntakeFull:
            if not stop.is_set():
                raise  # (hold returns True only when stopping)
        finally:
            engine.commit()  # what was emitted before a stop (or a failed emit)
