"""The one small interface every source implements, the thread that runs it, a registry.

A source reads one kind of raw fact (kmsg records, cgroup counters, processes) and
hands each observation to ``emit`` as a ``Draft``: a Record (firstfault/wire.py) without
``node``, ``stream`` and ``seq``, which the spool assigns when it stores it
(``draft.to_record(node, stream, seq)``). Sources interpret nothing.

    class Source:
        name: ClassVar[str]                      # = module name = config table = Record.source
        def __init__(self, *, paths=HostPaths(), state_dir=None, **options): ...
        def run(self, emit: Callable[[Draft], None], stop: threading.Event) -> None

``run`` blocks until ``stop`` is set and then returns; it raises on failure. It
must notice ``stop`` within about a second (poll with a timeout, never block
forever) and release what it opened before returning. The agent passes a
``StopEvent``: a source that waits on descriptors waits on ``stop.fileno()`` too
and so needs no timeout to notice it (an idle agent then wakes for nothing). ``PollingSource`` is the
variant for sources that sample: ``poll() -> list[Draft]`` every ``interval_s``;
``wait(stop, timeout)`` may return early when the source has an event to report.

``SourceRunner`` runs one source in its own thread and never lets it crash the
agent: every exception becomes an ``agent.status`` record (``Record.source`` =
"agent", fields ``source``, ``state`` = running | failed | stopped, ``error``,
``attempt``, ``retry_in_s``) and the source is started again after an
exponential backoff with jitter (1 s, 2 s, 4 s ... 60 s, each 50-100 % of that),
reset after a run that lasted ``healthy_after_s``.

The registry maps a name to its class. ``get(name)`` imports
``agent.sources.<name>`` on first use, so a module registers itself with
``@register`` and nothing imports sources that are not configured (nvml, journal).

``emit`` is called from the source's thread; it must be thread-safe and cheap.
Drafts are plain slotted dataclasses: building one costs about a microsecond.
In the agent ``emit`` is the spool's intake (firstfault/agent/spool/intake.py): when it returns the record is in the
spool (durable as its fsync setting says), so a source may then commit its own
position (a kmsg seq, a file offset). A source with many records at once uses
``emit_many(emit)(rows)``: one spool append for the list, where a row is a Draft
or a tuple of the wire columns in order (agent.spool.COLUMNS).

A source that saves a position (a kmsg seq, file offsets) saves it after emit
returned, so a crash between the two would repeat records. To make that exactly
once the agent calls ``catch_up(rows)`` before ``run`` with this source's rows
that the spool got at or after ``saved_at_ns()`` (the position's save time; 0:
none saved yet, so every spooled row; None, the default: the source keeps no
position), and the source takes what they reach as its position.

``unavailable(paths)`` (a classmethod) says why a source can not run on this
machine (no GPU, no systemd-python, no /dev/kmsg), None when it can: the agent
skips an unavailable source that was on only by default and says so in an
agent.status record (state = unavailable).

Options: a source's keyword arguments are its ``[sources.NAME]`` table in the
agent's TOML config (firstfault/agent/config.py checks names against the signature); each
raises ValueError naming the option for a bad value.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import logging
import os
import pkgutil
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterable

from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.osthread import name_this_thread
from firstfault.agent.spool.columns import Columns
from firstfault.wire import KIND_AGENT_STATUS, MAX_TEXT_BYTES, SOURCE_AGENT, Record

log = logging.getLogger(__name__)

FieldValue = int | float | str | bool | None


class SourceError(Exception):
    """Base of the errors of agent.sources."""


class UnknownSourceError(SourceError):
    """No source has this name."""


@dataclass(slots=True, kw_only=True)
class Draft:
    """A Record without node, stream and seq (the spool adds them); same fields, same units."""

    source: str
    kind: str
    message: str = ""
    occurred_ns: int | None = None
    observed_ns: int
    boot_id: str | None = None
    mono_ns: int | None = None
    job: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    severity: int = 6
    fields: dict[str, FieldValue] = field(default_factory=dict)

    def to_record(self, node: str, stream: str, seq: int) -> Record:
        return Record(node=node, stream=stream, seq=seq, source=self.source, kind=self.kind,
                      message=self.message, occurred_ns=self.occurred_ns,
                      observed_ns=self.observed_ns, boot_id=self.boot_id, mono_ns=self.mono_ns,
                      job=self.job, rank=self.rank, local_rank=self.local_rank, pid=self.pid,
                      severity=self.severity, fields=self.fields)


Emit = Callable[[Draft], None]


class IntakeFull(Exception):
    """The intake cannot take more now (the spool's disk is full); the first ``accepted``
    rows were taken. Raised only to a source that asked to hold (``emit_many(emit,
    hold=True)``): it offers the rest again later. Others lose them in a gap record."""

    def __init__(self, message: str, accepted: int) -> None:
        super().__init__(message)
        self.accepted = accepted


def emit_many(emit: Emit, *, hold: bool = False) -> Callable[[list], None]:
    """The batch form of ``emit``: the agent's intake takes a whole list (one spool append)
    through its ``many`` method (with ``hold``, where ``many`` takes it: IntakeFull when
    the disk is full, instead of a gap); any other callable (a test's list.append) gets
    the rows one by one."""
    many = getattr(emit, "many", None)
    if many is not None:
        return _holding(many, hold)

    def one_by_one(rows: list) -> None:
        for row in rows:
            emit(row)
    return one_by_one


def emit_columns(emit: Emit, *, hold: bool = False) -> Callable[[Columns], None]:
    """The columns form of ``emit`` (firstfault/agent/spool/columns.py): the agent's intake spools
    them as they are through its ``columns`` method (``hold`` as for emit_many); anything
    else gets rows."""
    columns = getattr(emit, "columns", None)
    if columns is not None:
        return _holding(columns, hold)
    many = emit_many(emit, hold=hold)
    return lambda c: many(c.rows())


def _holding(take: Callable, hold: bool) -> Callable:
    """``take`` told to hold where it can (it has a ``hold`` parameter)."""
    if hold and "hold" in inspect.signature(take).parameters:
        return functools.partial(take, hold=True)
    return take


def clip(text: str, limit: int = MAX_TEXT_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, on a character boundary."""
    if len(text) <= limit // 4:
        return text
    raw = text.encode("utf-8", "surrogatepass")
    return text if len(raw) <= limit else raw[:limit].decode("utf-8", "ignore")


def read_text(path: str) -> str | None:
    """A small pseudo file's text, None if it (or its process) is gone. Bytes that are not
    UTF-8 (a cgroup name may hold any) are kept as surrogates: pass paths on through
    ``printable``."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None


def printable(text: str, limit: int = MAX_TEXT_BYTES) -> str:
    """``text`` as a wire-safe str (surrogates as ``\\xNN``), cut to ``limit`` bytes."""
    if text.isascii():
        return clip(text, limit)
    raw = text.encode("utf-8", "surrogateescape")
    return clip(raw.decode("utf-8", "backslashreplace"), limit)


class StateFile:
    """A source's saved position: ``<state_dir>/<name>.json`` (no state_dir: nothing is kept).

    Written atomically (a temporary file renamed over it) without fsync: it only
    bounds what a restart must look up in the spool (``catch_up``). A save that fails
    is logged once per distinct error and costs nothing else: the spool's rows since
    the last good save carry the source on. An unreadable file counts as none (logged).
    """

    def __init__(self, state_dir: str | None, name: str) -> None:
        self.path = os.path.join(state_dir, f"{name}.json") if state_dir else None
        self._error: str | None = None

    def saved_at_ns(self) -> int | None:
        """When the state was last written (0: never); None without a state_dir."""
        if self.path is None:
            return None
        try:
            return os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return 0

    def load(self) -> dict | None:
        if self.path is None:
            return None
        try:
            with open(self.path, encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("source state unreadable, starting anew path=%s error=%s", self.path, e)
            return None
        return state if isinstance(state, dict) else None

    def save(self, state: dict) -> bool:
        """Write ``state``; False (logged once per error) when it could not be written."""
        if self.path is None:
            return False
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(state, f)
            os.replace(tmp, self.path)
        except OSError as e:
            if str(e) != self._error:
                log.warning("source state not saved path=%s error=%s", self.path, e)
            self._error = str(e)
            return False
        self._error = None
        return True


class Source:
    """One reader of raw facts; see the module docstring for the contract."""

    name: ClassVar[str] = ""

    def __init__(self, *, paths: HostPaths | None = None, state_dir: str | None = None) -> None:
        self.paths = paths or HostPaths()
        self.state_dir = state_dir

    @classmethod
    def unavailable(cls, paths: HostPaths) -> str | None:
        """Why this source can not run on this machine; None when it can."""
        return None

    def saved_at_ns(self) -> int | None:
        """When the saved position was written (0: never); None: no position kept."""
        return None

    def catch_up(self, rows: Iterable[tuple]) -> None:
        """Take the spooled ``rows`` (wire columns) past the saved position as done."""

    def draft(self, kind: str, message: str = "", **kw) -> Draft:
        """A Draft from this source, observed now unless ``observed_ns`` is given."""
        if "observed_ns" not in kw:
            kw["observed_ns"] = time.time_ns()
        return Draft(source=self.name, kind=kind, message=message, **kw)

    def run(self, emit: Emit, stop: threading.Event) -> None:
        raise NotImplementedError


class StopEvent(threading.Event):
    """A stop flag that poll() and select() can wait on: ``fileno()``, an eventfd, turns
    readable once it is set. Close it when the threads that wait on it are done."""

    def __init__(self) -> None:
        super().__init__()
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def set(self) -> None:
        super().set()
        try:
            os.eventfd_write(self._fd, 1)
        except OSError:  # closed, or the counter full: readable either way
            pass

    def clear(self) -> None:
        super().clear()
        try:
            os.eventfd_read(self._fd)
        except OSError:  # not set: nothing to drain
            pass

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def stop_slice(stop: threading.Event, slice_s: float) -> float | None:
    """How long a wait on descriptors may last before it looks at ``stop``: no limit
    (None) when ``stop`` is a StopEvent among the descriptors, else ``slice_s``."""
    return None if isinstance(stop, StopEvent) else slice_s


class PollingSource(Source):
    """A source that samples: ``poll()`` every ``interval_s`` until stopped."""

    interval_s: float = 10.0

    def __init__(self, *, interval_s: float | None = None, **kw) -> None:
        super().__init__(**kw)
        if interval_s is not None:
            if interval_s <= 0:
                raise ValueError(f"{self.name}: interval_s must be > 0, got {interval_s}")
            self.interval_s = float(interval_s)

    def poll(self) -> Iterable[Draft]:
        raise NotImplementedError

    def wait(self, stop: threading.Event, timeout: float) -> None:
        """Sleep until the next poll; override to wake early on an event."""
        stop.wait(timeout)

    def close(self) -> None:
        """Release what the source holds; called once when ``run`` ends."""

    def run(self, emit: Emit, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                for d in self.poll():
                    emit(d)
                self.wait(stop, self.interval_s)
        finally:
            self.close()


class SourceRunner:
    """Runs one source in a thread; failures become agent.status records and retries."""

    def __init__(self, source: Source, emit: Emit, stop: threading.Event, *,
                 backoff_initial_s: float = 1.0, backoff_max_s: float = 60.0,
                 healthy_after_s: float = 60.0, rng: random.Random | None = None) -> None:
        self.source, self.emit, self.stop = source, emit, stop
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self.healthy_after_s = healthy_after_s
        self._rng = rng or random.Random()
        self.thread = threading.Thread(target=self._loop, name=f"ff-{source.name}",
                                       daemon=True)
        self.failures = 0  # consecutive failed runs

    def start(self) -> SourceRunner:
        self.thread.start()
        return self

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread (after ``stop.set()``); True if it ended."""
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def backoff_s(self, failures: int) -> float:
        """Delay before retry number ``failures`` (>= 1): exponential, 50-100 % jitter."""
        base = min(self.backoff_max_s, self.backoff_initial_s * 2 ** min(failures - 1, 30))
        return base * (0.5 + 0.5 * self._rng.random())

    def _status(self, state: str, error: str | None = None, severity: int = 6, **extra) -> None:
        fields: dict[str, FieldValue] = {"source": self.source.name, "state": state,
                                         "error": clip(error) if error else None, **extra}
        msg = f"source {self.source.name} {state}" + (f": {error}" if error else "")
        try:
            self.emit(Draft(source=SOURCE_AGENT, kind=KIND_AGENT_STATUS, message=clip(msg, 4096),
                            observed_ns=time.time_ns(), severity=severity, fields=fields))
        except Exception:  # the intake is failing too: the log is all that is left
            log.exception("status record lost source=%s state=%s", self.source.name, state)

    def _loop(self) -> None:
        name_this_thread()
        name, last_error = self.source.name, None
        while not self.stop.is_set():
            self._status("running", attempt=self.failures + 1)
            started = time.monotonic()
            try:
                self.source.run(self.emit, self.stop)
                error = None if self.stop.is_set() else "run() returned before stop"
            except Exception as e:  # noqa: BLE001 - a source never takes the agent down
                error = f"{type(e).__name__}: {e}"
                if error != last_error:
                    log.warning("source failed source=%s error=%s", name, error, exc_info=True)
                else:
                    log.debug("source failed again source=%s error=%s", name, error)
            if error is None:
                break
            last_error = error
            if time.monotonic() - started >= self.healthy_after_s:
                self.failures = 0
            self.failures += 1
            delay = self.backoff_s(self.failures)
            self._status("failed", error, severity=3, attempt=self.failures,
                         retry_in_s=round(delay, 3))
            self.stop.wait(delay)
        self._status("stopped")


# --- registry ------------------------------------------------------------------

REGISTRY: dict[str, type[Source]] = {}


def register(cls: type[Source]) -> type[Source]:
    """Class decorator: make ``cls`` known under ``cls.name``."""
    if not cls.name or not cls.name.isidentifier():
        raise ValueError(f"{cls.__qualname__}.name must be a module-like name, got {cls.name!r}")
    other = REGISTRY.get(cls.name)
    if other is not None and other is not cls and (other.__module__, other.__qualname__) != (
            cls.__module__, cls.__qualname__):
        raise ValueError(f"source name {cls.name!r} taken by {other.__module__}.{other.__qualname__}")
    REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    """The names of the source modules shipped in agent.sources (imports nothing)."""
    from firstfault.agent import sources
    return sorted(m.name for m in pkgutil.iter_modules(sources.__path__)
                  if m.name != "base" and not m.name.startswith("_"))


def get(name: str) -> type[Source]:
    """The class of source ``name``, importing ``agent.sources.<name>`` if needed."""
    if name not in REGISTRY and name.isidentifier() and name in names():
        try:
            importlib.import_module(f"firstfault.agent.sources.{name}")
        except ImportError as e:  # e.g. an optional library (psutil, systemd) missing
            raise SourceError(f"source {name!r} cannot be loaded: {e}") from e
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownSourceError(f"unknown source {name!r}; known sources: "
                                 f"{', '.join(names())}") from None
