"""marks: job start/end marks dropped by a scheduler's prolog/epilog or ``firstfault mark``.

Job identity usually comes from the rank processes' environment (procs) and from
log paths (ranklog). A scheduler knows more, and earlier: which nodes a job runs
on, even a node whose ranks never log a line. ``firstfault mark start|end --job ID
[--step S] [--nodes LIST]`` (firstfault/agent/mark.py, called by deploy/slurm/prolog.sh and
epilog.sh) drops one small JSON file into ``<state_dir>/marks/``; this source picks
each file up, ships it as one ``job.mark`` record and deletes it. The agent need
not run when the mark is written: the files wait for it.

The marks directory (this docstring is its spec, version 1)
    ``<state_dir>/marks/NAME.json``, one mark a file. Writers create
    ``.NAME.json.tmp`` (a dot name: readers skip it), write, fsync, and rename it
    to ``NAME.json``, so a reader never sees half a mark. NAME is
    ``<written ns>-<writer pid>-<event>``: names sort in time order. The content is
    one UTF-8 JSON object of at most MAX_MARK_BYTES, for example::

        {"version": 1, "event": "start", "job": "4242", "step": null,
         "nodes": "gpu-[01-04,07]", "at_ns": 1796212800123456789}

    ``event``: "start" | "end"; ``job``: the job id (1..256 bytes, printable, no
    "/"); ``step``: the step id or null; ``nodes``: the job's node list as the
    scheduler gave it (a Slurm hostlist expression, expanded by the collector) or
    null, at most 1024 bytes; ``at_ns``: when the mark was written (wall clock, ns).
    Unknown keys are an error (a newer writer): the mark is rejected, not guessed at.
    The directory is meant to be writable by the job's user and root and owned by
    the agent's user (mode 1733, deploy/tmpfiles.d): its sticky bit keeps users from
    deleting each other's marks, its owner (the agent) may delete any.

Emits
    ``job.mark`` (source "marks"): job = the mark's job, occurred_ns = at_ns,
    message ``job 4242 start on gpu-[01-04,07]``, fields ``event``, ``step``,
    ``nodes``, ``uid`` (the file's owner: who wrote the mark), ``file``.
    A file that is no mark (bad JSON, unknown key, too large, a symlink, not a
    regular file) becomes an ``agent.status`` record (state "rejected", severity
    warning, fields ``source``, ``file``, ``error``) and is moved to
    ``marks/rejected/`` (deleted if it can not be moved); nothing of its content is
    shipped. Then the source goes on.

The directory is ``marks/`` in the agent's state_dir (the daemon passes it as
``agent_state_dir``; the source's own state dir is private to the agent's user).

Delivery: a mark is deleted after ``emit`` returned (the record is in the spool),
so a crash in between sends it twice, never zero times. The directory is watched
with inotify (firstfault/agent/tail/inotify.py) and scanned at start and every ``rescan_s`` seconds (an
inotify queue overflow or a missed event costs at most that delay).

Known issues: any local user who may write the directory can mark any job id; a
false mark can only add a node to a job's report (with a note that it sent
nothing), never hide a record.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import stat
import threading
import time
from typing import NamedTuple

from firstfault.agent.sources.base import Draft, Emit, Source, SourceError, printable, register, stop_slice
from firstfault.agent.tail.inotify import IN_CLOSE_WRITE, IN_MOVED_TO, Inotify
from firstfault.wire import KIND_AGENT_STATUS, KIND_JOB_MARK, MAX_NAME_BYTES, MAX_TEXT_BYTES, SOURCE_AGENT, SOURCE_MARKS

log = logging.getLogger(__name__)

VERSION = 1
MARKS_DIR = "marks"
REJECTED_DIR = "rejected"
MAX_MARK_BYTES = 4096
EVENTS = ("start", "end")
_KEYS = {"version", "event", "job", "step", "nodes", "at_ns"}
STOP_SLICE_S = 0.5  # how often a plain threading.Event is looked at (a StopEvent wakes us)


class MarkError(SourceError):
    """A marks file that is not a version-1 mark; the message says what is wrong."""


class JobMark(NamedTuple):
    """A job's start or end on this node, as ``firstfault mark`` wrote it (not a phase or save mark)."""

    event: str
    job: str
    step: str | None
    nodes: str | None
    at_ns: int


def _name(value: object, what: str, limit: int, nullable: bool) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not value:
        raise MarkError(f"{what} must be a non-empty string, got {value!r:.80}")
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise MarkError(f"{what} is longer than {limit} bytes")
    if not value.isprintable() or (what != "nodes" and ("/" in value or " " in value)):
        raise MarkError(f"{what} {value!r:.80} has a character that is not allowed")
    return value


def check_mark(m: object) -> JobMark:
    """The JobMark a decoded JSON object holds; MarkError naming the first problem."""
    if not isinstance(m, dict):
        raise MarkError("a mark is a JSON object")
    unknown = set(m) - _KEYS
    if unknown:
        raise MarkError(f"unknown keys {sorted(unknown)} (written by a newer firstfault?)")
    if m.get("version") != VERSION:
        raise MarkError(f"version must be {VERSION}, got {m.get('version')!r:.40}")
    if m.get("event") not in EVENTS:
        raise MarkError(f"event must be one of {', '.join(EVENTS)}, got {m.get('event')!r:.40}")
    at_ns = m.get("at_ns")
    if type(at_ns) is not int or not 0 <= at_ns < 2**63:
        raise MarkError(f"at_ns must be an int of ns since the epoch, got {at_ns!r:.40}")
    return JobMark(m["event"], _name(m.get("job"), "job", MAX_NAME_BYTES, False),
                _name(m.get("step"), "step", MAX_NAME_BYTES, True),
                _name(m.get("nodes"), "nodes", MAX_TEXT_BYTES, True), at_ns)


def parse_mark(data: bytes) -> JobMark:
    """A marks file's content as a JobMark. Pure; MarkError if it is not one."""
    if len(data) > MAX_MARK_BYTES:
        raise MarkError(f"larger than {MAX_MARK_BYTES} bytes")
    try:
        m = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise MarkError(f"not UTF-8 JSON: {e}") from None
    return check_mark(m)


def marks_dir(state_dir: str) -> str:
    return os.path.join(state_dir, MARKS_DIR)


def write_mark(state_dir: str, event: str, job: str, *, step: str | None = None,
               nodes: str | None = None, now_ns: int | None = None) -> str:
    """Write one mark atomically into ``<state_dir>/marks/`` (created if missing); its path.
    MarkError for a bad value (nothing written), OSError if it can not be written."""
    at_ns = time.time_ns() if now_ns is None else now_ns
    mark = {"version": VERSION, "event": event, "job": job, "step": step, "nodes": nodes,
            "at_ns": at_ns}
    data = json.dumps(mark, ensure_ascii=False).encode("utf-8")
    parse_mark(data)  # the reader's checks, before anything touches the disk
    directory = marks_dir(state_dir)
    os.makedirs(directory, exist_ok=True)
    name = f"{at_ns}-{os.getpid()}-{event}.json"
    tmp, path = os.path.join(directory, f".{name}.tmp"), os.path.join(directory, name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def read_mark_file(path: str) -> tuple[JobMark, int]:
    """The mark in ``path`` and the uid that owns it. Never follows a symlink and reads
    only a small regular file. MarkError if it is not a mark, FileNotFoundError if gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise MarkError("a symbolic link, not a mark") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MarkError("not a regular file")
        if st.st_size > MAX_MARK_BYTES:
            raise MarkError(f"larger than {MAX_MARK_BYTES} bytes")
        return parse_mark(os.read(fd, MAX_MARK_BYTES + 1)), st.st_uid
    finally:
        os.close(fd)


def mark_draft(mark: JobMark, uid: int, file: str, observed_ns: int | None = None) -> Draft:
    text = f"job {mark.job} {mark.event}" + (f" step {mark.step}" if mark.step else "") + (
        f" on {mark.nodes}" if mark.nodes else "")
    return Draft(source=SOURCE_MARKS, kind=KIND_JOB_MARK, message=text, job=mark.job,
                 occurred_ns=mark.at_ns,
                 observed_ns=time.time_ns() if observed_ns is None else observed_ns,
                 fields={"event": mark.event, "step": mark.step, "nodes": mark.nodes,
                         "uid": uid, "file": printable(file)})


@register
class MarksSource(Source):
    """Ships and deletes the marks in ``<state_dir>/marks/``; see the module docstring."""

    name = SOURCE_MARKS

    def __init__(self, *, rescan_s: float = 5.0, agent_state_dir: str | None = None, **kw) -> None:
        super().__init__(**kw)
        if rescan_s <= 0:
            raise ValueError(f"marks: rescan_s must be > 0, got {rescan_s}")
        self.rescan_s = float(rescan_s)
        # the daemon wires the agent's state_dir (the sources' own ones are private, 0700)
        self.agent_state_dir = agent_state_dir or self.state_dir
        self._stuck: set[str] = set()  # names that could be neither shipped nor removed

    def run(self, emit: Emit, stop: threading.Event) -> None:
        if not self.agent_state_dir:
            raise SourceError("marks: no state_dir to watch")
        directory = marks_dir(self.agent_state_dir)
        os.makedirs(directory, exist_ok=True)
        with Inotify() as ino:
            ino.add_watch(directory, IN_CLOSE_WRITE | IN_MOVED_TO)
            slice_s = stop_slice(stop, STOP_SLICE_S)
            waited = [ino, stop] if slice_s is None else [ino]
            while not stop.is_set():
                ino.read()  # whatever woke us: scan the whole folder
                self.scan(directory, emit)
                deadline = time.monotonic() + self.rescan_s
                while not stop.is_set() and time.monotonic() < deadline:
                    left = max(0.0, deadline - time.monotonic())
                    ready, _, _ = select.select(waited, [], [], left if slice_s is None
                                                else min(left, slice_s))
                    if ready:
                        break

    def scan(self, directory: str, emit: Emit) -> int:
        """Ship every mark now in ``directory``, oldest first; how many were shipped."""
        try:
            names = sorted(n for n in os.listdir(directory)
                           if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            os.makedirs(directory, exist_ok=True)
            return 0
        shipped = 0
        for name in names:
            if name in self._stuck:
                continue
            path = os.path.join(directory, name)
            try:
                mark, uid = read_mark_file(path)
            except FileNotFoundError:
                continue
            except (MarkError, OSError) as e:
                self._reject(directory, name, e, emit)
                continue
            emit(mark_draft(mark, uid, name))
            shipped += 1
            self._remove(path, name)
        return shipped

    def _reject(self, directory: str, name: str, error: Exception, emit: Emit) -> None:
        why = str(error) if isinstance(error, MarkError) else f"{type(error).__name__}: {error}"
        log.warning("mark rejected file=%s error=%s", name, why)
        emit(Draft(source=SOURCE_AGENT, kind=KIND_AGENT_STATUS, severity=4,
                   message=printable(f"source marks: {name} rejected: {why}", 4096),
                   observed_ns=time.time_ns(),
                   fields={"source": self.name, "state": "rejected", "file": printable(name),
                           "error": printable(why)}))
        aside = os.path.join(directory, REJECTED_DIR)
        try:
            os.makedirs(aside, exist_ok=True)
            os.rename(os.path.join(directory, name), os.path.join(aside, name))
        except OSError as e:
            log.warning("rejected mark not moved aside file=%s error=%s", name, e)
            self._remove(os.path.join(directory, name), name)

    def _remove(self, path: str, name: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:  # e.g. the directory is not the agent's: never ship it again
            log.warning("mark not removed file=%s error=%s", name, e)
            self._stuck.add(name)
