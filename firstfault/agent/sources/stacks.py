"""stacks: the Python stacks of every local rank at the moment a hang shows (py-spy dump).

After a launcher kills a hung job, nothing says where each rank was. This source
takes ``py-spy dump --pid PID`` of every rank of the job on this node when:

- ``timeout``: a rank log line says a collective timed out (ranklog's ``watch`` hook
  hands every line over, once a wake per job; TRIGGERS below, from torch's and gloo's sources:
  NCCL's watchdog ``Watchdog caught collective operation timeout``, gloo's ``Timed out
  waiting <N>ms for recv operation to complete``, ``monitoredBarrier`` timeouts,
  ``Some NCCL operations have failed or timed out``). The waiting ranks print this as
  they give up, so the capture races the launcher's SIGTERM (torchrun looks every
  0.1 s): all ranks are dumped in parallel at once;
- ``stall``: no rank of the job on this node wrote a line for ``stall_s`` while its
  ranks live (every rank blocks in a hang: those waiting in a collective and the one
  that stopped). Set ``stall_s`` below the job's collective timeout to capture while
  all ranks still live; ``0`` turns it off. New lines re-arm it.

Emits (source "stacks"): ``rank.stacks`` per rank: message = py-spy's output (cut to
``max_bytes``), job/rank/local_rank/pid from the procs source's map (``ranks``, wired
by the daemon), occurred_ns = when the capture began, fields ``tool`` ("py-spy"),
``trigger``, ``detail`` (the line that triggered it), ``duration_ms``, ``bytes``,
``cut``. Without py-spy the source still runs: it says so once (``agent.status``, state
``degraded``) and each capture becomes a gap. A capture that failed (py-spy missing, not permitted, timed out, the rank
gone) is a ``rank.gap`` with ``reason`` and ``detail``: absence of stacks is evidence
too. A job's captures are rate-limited: at most ``max_captures_per_job``, at least
``min_interval_s`` apart (one ``rank.gap`` with reason ``rate_limited`` says when a
trigger was dropped).

Bounded: every py-spy runs at most ``timeout_s`` (killed after), its output is cut to
``max_bytes``. The trigger hook costs one regex search per chunk of lines in the
ranklog thread; captures run in this source's own thread.

Privileges: py-spy reads the rank's memory (``process_vm_readv``): it needs ptrace
access to the rank, i.e. the same user or CAP_SYS_PTRACE (in the systemd unit). By
default it runs ``--nonblocking`` (the rank is not paused; no ``ptrace`` call, which
the unit's system call filter denies); ``nonblocking = false`` pauses each rank for
the ~0.1 s of the dump, and ``native = true`` (needs it) adds C/C++ frames, ~0.3-1 s.

Job identity: the job of the lines (ranklog) names the ranks to dump: those whose
procs job, ``TORCHELASTIC_RUN_ID`` or ``SLURM_JOB_ID`` is it (a torchrun log names the
run id, a process under Slurm has the Slurm job id); lines of no job name the ranks
of no job any log names. Ranks of other jobs on the node are never dumped.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from firstfault.agent.sources.base import Draft, Emit, Source, clip, printable, register
from firstfault.wire import KIND_AGENT_STATUS, KIND_RANK_STACKS, MAX_MESSAGE_BYTES, SOURCE_AGENT, SOURCE_STACKS

log = logging.getLogger(__name__)

KIND_RANK_GAP = "rank.gap"
TRIGGERS = (b"Watchdog caught collective operation timeout", b"Timed out waiting ",
            b" failed to pass monitoredBarrier in ", b" timed out in monitoredBarrier after ",
            b"Some NCCL operations have failed or timed out")
_TRIGGER = re.compile(b"|".join(map(re.escape, TRIGGERS)))
WAKE_S = 0.5  # the worker looks at stalls and stop at least this often
FORGET_S = 86400.0  # a job with no line for this long is forgotten


def find_py_spy(configured: str = "") -> str | None:
    """The py-spy to run: the configured path, else the one installed beside this Python
    (the ``py-spy`` wheel, firstfault's [stacks] extra), else the one on PATH."""
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


@dataclass(slots=True)
class _Job:
    last_line: float  # monotonic time of the job's last line
    armed: bool = True  # a stall may trigger (new lines since the last capture)
    captures: int = 0
    last_capture: float = float("-inf")
    limited: bool = False  # a rate_limited gap was sent


def _positive(name: str, value, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 if zero_ok else value > 0):
        raise ValueError(f"stacks: {name} must be a number {'>= 0' if zero_ok else '> 0'}, got {value!r}")
    return float(value)


@register
class StacksSource(Source):
    """Captures ranks' stacks on a hang; see the module docstring. Options = ``[sources.stacks]``."""

    name = SOURCE_STACKS

    def __init__(self, *, py_spy: str = "", native: bool = False, nonblocking: bool = True,
                 stall_s: float = 300.0, on_timeout_lines: bool = True, timeout_s: float = 10.0,
                 max_bytes: int = MAX_MESSAGE_BYTES, max_captures_per_job: int = 3,
                 min_interval_s: float = 60.0, ranks: Callable[[], dict] | None = None, **kw) -> None:
        super().__init__(**kw)
        if not isinstance(py_spy, str) or (py_spy and not os.path.isabs(py_spy)):
            raise ValueError(f"stacks: py_spy must be an absolute path or empty, got {py_spy!r}")
        if native and nonblocking:
            raise ValueError("stacks: native = true needs nonblocking = false (py-spy pauses a rank to unwind it)")
        self.native, self.nonblocking, self.on_timeout_lines = bool(native), bool(nonblocking), bool(on_timeout_lines)
        self.stall_s = _positive("stall_s", stall_s, zero_ok=True)
        self.timeout_s = _positive("timeout_s", timeout_s)
        self.min_interval_s = _positive("min_interval_s", min_interval_s, zero_ok=True)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 1024 <= max_bytes <= MAX_MESSAGE_BYTES:
            raise ValueError(f"stacks: max_bytes must be an int in 1024..{MAX_MESSAGE_BYTES}, got {max_bytes!r}")
        if isinstance(max_captures_per_job, bool) or not isinstance(max_captures_per_job, int) or max_captures_per_job < 1:
            raise ValueError(f"stacks: max_captures_per_job must be an int >= 1, got {max_captures_per_job!r}")
        self.max_bytes, self.max_captures_per_job = max_bytes, max_captures_per_job
        self.tool = find_py_spy(py_spy)
        self.missing = None if self.tool else (
            f"py-spy not found ({py_spy or 'beside ' + sys.executable + ' or on PATH'}): "
            "pip install 'firstfault[stacks]'")
        self.ranks = ranks or (lambda: {})
        self._cond = threading.Condition()
        self._jobs: dict[str | None, _Job] = {}
        self._due: list[tuple[str | None, str, str]] = []  # (job, trigger, detail)

    # --- the hook ranklog calls, in its thread: cheap, never blocks on a capture --------

    def watch(self, ident: tuple, raw: bytes, observed_ns: int) -> None:
        """Lines of the job's ranks were read (``raw``: a wake's lines, joined by newlines)."""
        job = ident[0]
        now = time.monotonic()
        # a find per trigger (~0.02 µs a line each) before the regex (~0.6 µs a line)
        hit = (_TRIGGER.search(raw) if self.on_timeout_lines and any(map(raw.__contains__, TRIGGERS))
               else None)
        with self._cond:
            st = self._jobs.get(job)
            if st is None:
                st = self._jobs[job] = _Job(now)
            st.last_line, st.armed = now, True
            if hit is not None:
                start = raw.rfind(b"\n", 0, hit.start()) + 1
                end = raw.find(b"\n", hit.end())
                self._due.append((job, "timeout", raw[start:end if end >= 0 else len(raw)].decode("utf-8", "replace")))
                self._cond.notify()

    # --- the worker -------------------------------------------------------------------

    def run(self, emit: Emit, stop: threading.Event) -> None:
        if self.missing:
            log.warning("stacks: %s; no stacks will be captured", self.missing)
            emit(Draft(source=SOURCE_AGENT, kind=KIND_AGENT_STATUS, message=f"source stacks degraded: {self.missing}",
                       observed_ns=time.time_ns(), severity=4,
                       fields={"source": self.name, "state": "degraded", "error": clip(self.missing)}))
        while not stop.is_set():
            with self._cond:
                if not self._due:
                    self._cond.wait(WAKE_S)
                due, self._due = self._due, []
                due += self._stalled()
            if len(due) > 1:  # one capture per job and wake: a timeout line before a stall
                due = list({job: (job, trig, det) for job, trig, det in reversed(due)}.values())
            for job, trigger, detail in due:
                if not stop.is_set():
                    self.capture(job, trigger, detail, emit)

    def _stalled(self) -> list[tuple[str | None, str, str]]:
        """Jobs silent for stall_s since their last line (under the lock)."""
        if not self.stall_s:
            return []
        now = time.monotonic()
        for job in [j for j, st in self._jobs.items() if now - st.last_line > FORGET_S]:
            del self._jobs[job]
        return [(job, "stall", f"no line for {self.stall_s:g} s") for job, st in self._jobs.items()
                if st.armed and now - st.last_line >= self.stall_s]

    def _targets(self, job: str | None) -> dict:
        """The live ranks of ``job``: by the procs source's job, or its torchrun run id or
        Slurm job id (a torchrun log names the run id, the process's job may be Slurm's).
        Lines of no job (a glob without ``{job}``, no job label): the ranks of no job the
        logs name."""
        ranks = self.ranks()
        if job is not None:
            return {pid: i for pid, i in ranks.items() if job in (
                i.job, i.env.get("TORCHELASTIC_RUN_ID"), i.env.get("SLURM_JOB_ID"))}
        with self._cond:
            known = set(self._jobs) - {None}
        return {pid: i for pid, i in ranks.items() if not known & {
            i.job, i.env.get("TORCHELASTIC_RUN_ID"), i.env.get("SLURM_JOB_ID")}}

    def capture(self, job: str | None, trigger: str, detail: str, emit: Emit) -> int:
        """Dump every rank of ``job`` on this node; the number of stacks emitted."""
        targets = self._targets(job)
        now = time.monotonic()
        with self._cond:
            st = self._jobs.setdefault(job, _Job(now))
            if trigger == "stall" and not targets:
                return 0  # no rank lives: not a hang of live ranks; stays armed
            st.armed = False
            if st.captures >= self.max_captures_per_job or now - st.last_capture < self.min_interval_s:
                if not st.limited:
                    st.limited = True
                    emit(self._gap(job, None, "rate_limited", f"{trigger} ({detail}) after {st.captures} "
                                   f"capture(s); at most {self.max_captures_per_job}, {self.min_interval_s:g} s apart"))
                return 0
            st.captures, st.last_capture = st.captures + 1, now
        if self.missing:
            emit(self._gap(job, None, "py_spy_missing", self.missing))
            return 0
        return self._dump_all(job, targets, trigger, detail, emit)

    def _dump_all(self, job, targets: dict, trigger: str, detail: str, emit: Emit) -> int:
        args = [self.tool, "dump"] + (["--nonblocking"] if self.nonblocking else []) + (
            ["--native"] if self.native else [])
        started_ns, t0 = time.time_ns(), time.monotonic()
        running = []
        for pid, ident in sorted(targets.items(), key=lambda kv: (kv[1].rank is None, kv[1].rank or 0)):
            try:
                p = subprocess.Popen(args + ["--pid", str(pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
            except OSError as e:
                emit(self._gap(job, (pid, ident), "py_spy_failed", f"cannot start {self.tool}: {e}"))
                continue
            running.append((pid, ident, p))
        n = 0
        for pid, ident, p in running:
            try:
                out, err = p.communicate(timeout=max(0.0, t0 + self.timeout_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
                emit(self._gap(job, (pid, ident), "timeout", f"py-spy ran past {self.timeout_s:g} s"))
                continue
            if p.returncode != 0 or not out.strip():
                why = err.decode("utf-8", "replace").strip().splitlines()
                emit(self._gap(job, (pid, ident), "py_spy_failed",
                               f"exit {p.returncode}: {why[-1] if why else 'no output'}"))
                continue
            text = out.decode("utf-8", "replace").rstrip("\n")
            msg = clip(text, self.max_bytes)
            emit(self.draft(KIND_RANK_STACKS, msg, occurred_ns=started_ns, job=ident.job, rank=ident.rank,
                            local_rank=ident.local_rank, pid=pid, severity=4,
                            fields={"tool": "py-spy", "trigger": trigger, "detail": printable(detail),
                                    "duration_ms": round((time.monotonic() - t0) * 1000),
                                    "bytes": len(out), "cut": len(msg) < len(text), "native": self.native}))
            n += 1
        log.info("stacks captured job=%s trigger=%s ranks=%d of %d in %.2f s", job, trigger, n, len(targets),
                 time.monotonic() - t0)
        return n

    def _gap(self, job, who, reason: str, detail: str):
        pid, ident = who if who else (None, None)
        return self.draft(KIND_RANK_GAP, f"stacks not captured: {reason}: {detail}",
                          job=ident.job if ident else job, rank=ident.rank if ident else None,
                          local_rank=ident.local_rank if ident else None, pid=pid, severity=4,
                          fields={"reason": reason, "detail": printable(detail)})
