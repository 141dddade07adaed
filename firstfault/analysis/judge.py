"""Judge: a finding's category and role from more than its own line. Pure.

The catalog gives each finding the category and role of its signature. Here, once identity is
known (identify.py), is the one place where a finding's category or role is decided from other
evidence, each rule returning new Findings (nothing is edited):

0. A traceback cut before its exception line right under a rank's error line is that error's raise
   (``told_above``): the error takes its frames, and the cut traceback is no failure of its own.
1. Deaths the agents saw (deaths.signal_deaths): a rank's exit by a signal with no line of its
   own that reports it becomes a finding of its own.
2. Signals (``judge_signals``): a worker killed by SIGKILL with no kernel OOM record tied to it
   is host-memory at low confidence when no kernel log of its node covers the kill (the OOM
   killer is the usual sender; the dmesg command confirms it), and stays unknown when one does
   and shows no OOM kill. A SIGBUS is config at low confidence: a /dev/shm too small for the job
   (the size a container or node was given) is its usual cause. A SIGABRT (exit -6, "Fatal
   Python error: Aborted") after or with a collective timeout is how PyTorch's NCCL watchdog
   takes a rank down: a cascade; so is a death its reporter could not explain (trait
   ``unexplained``: Ray's SYSTEM_ERROR worker death) printed after a collective timeout.
3. A traceback cut before its exception line, or a worker's exit no line explains, takes its
   category from the text's words (``with_mentioned_category``).
4. When no line says what failed, a worker's non-zero exit is the failure (``exit_failure``).
5. When no line of the log says what failed (nothing at all, or only cascades that single out
   no rank), a failure the text names in words (an issue's title, a note, a heading that
   names a known failure) is the answer, at low confidence (``named_in_words``).

Rules 3 to 5 apply to the one failure the verdict picks (verdict.decide), rules 0 to 2 to all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace

from firstfault.analysis.deaths import merged, signal_deaths
from firstfault.analysis.events import Event
from firstfault.analysis.findings import Finding, exit_of
from firstfault.analysis.identify import ANOTHER_JOBS, ANOTHER_PROCESS
from firstfault.analysis.phase import phase_from_task_words


def judge(findings: list[Finding], procs: Iterable[Event], kernel_span: Mapping[str | None, tuple[int, int]],
          rank_nodes: Mapping[int, str | None]) -> list[Finding]:
    """The identified findings, cut tracebacks joined to the error they raise, with the agents' signal
    deaths among them (in timeline order) and what each death by signal says (rules 0 to 2)."""
    procs = list(procs)
    return judge_signals(merged(told_above(findings), signal_deaths(procs, findings)), kernel_span, rank_nodes)


CUT_UNDER_LINES = 2  # a traceback cut before its exception line this close under a rank's error is its raise


def told_above(findings: list[Finding]) -> list[Finding]:
    """Rule 0: a traceback cut before its exception line (a paste that stops there), printed right under
    an error line of the same rank and stream (C++ code's warning before it raises, c10d's "socket ...
    timed out" over DistStoreError; a logger's error line over logger.exception's traceback), is that
    error's traceback: the error line takes its frames, and the cut traceback is no failure of its own.
    An error line is a root's, a wait that timed out or a peer's socket that closed under it (NCCL's "Last
    error:" cause, lasterror.py); a launcher's act (killing its workers) is none."""
    last: dict[str, Finding] = {}  # stream -> its latest error line so far, in stream order
    told: dict[int, Finding] = {}  # id of an error line -> it with the frames of the traceback under it
    dropped: set[int] = set()
    for f in sorted(findings, key=lambda f: (f.ev.stream, f.ev.seq)):
        above = last.get(f.ev.stream)
        if (f.has("cut-traceback") and above is not None and above.ev.rank == f.ev.rank
                and 0 < f.ev.seq - above.ev.seq <= CUT_UNDER_LINES and not above.ev.frames):
            told[id(above)] = replace(above, ev=replace(above.ev, frames=f.ev.frames),
                                      links=[*above.links, f"its traceback follows it (line {f.ev.seq}), cut "
                                                           "before its exception line"])
            dropped.add(id(f))
        if (f.role == "root" or f.has("collective-timeout") or f.has("peer-socket")) and not f.has("generic") \
                and not f.ev.frames and not f.ev.fields.get("prose"):  # a person's heading is no program's error line
            last[f.ev.stream] = f
        else:  # any other finding between: the traceback is no longer right under the error
            last.pop(f.ev.stream, None)
    return [told.get(id(f), f) for f in findings if id(f) not in dropped]


DMESG = "dmesg -T | grep -i -E 'killed process|out of memory'"
SHM = "df -h /dev/shm (containers default to 64 MiB)"


def _aborted(f: Finding) -> bool:
    ex = exit_of(f)
    return (ex is not None and ex["signal"] == "SIGABRT") or (
        f.has("fatal-error") and f.match.groups.get("reason", "").startswith("Aborted"))


def judge_signals(findings: list[Finding], kernel_span: Mapping[str | None, tuple[int, int]],
                  rank_nodes: Mapping[int, str | None]) -> list[Finding]:
    """``findings`` with what a rank's death by signal says (rule 2 of the module): new Findings
    where a signal changes a category, a role or a cap."""
    oom_ranks = {f.ev.rank for f in findings if f.has("oom-kill") and f.ev.rank is not None}
    timeouts = [f for f in findings if f.has("collective-timeout") or (f.role == "cascade" and f.sig.startswith("nccl."))]
    return [_judged(f, oom_ranks, timeouts, kernel_span, rank_nodes)
            if f.role == "root" and f.ev.source != "kernel" else f for f in findings]


def _judged(f: Finding, oom_ranks: set, timeouts: list[Finding], kernel_span: Mapping[str | None, tuple[int, int]],
            rank_nodes: Mapping[int, str | None]) -> Finding:
    ex = exit_of(f)
    if ex and ex["signal"] == "SIGKILL" and f.ev.rank not in oom_ranks:
        node = f.ev.node or rank_nodes.get(f.ev.rank)
        span = kernel_span.get(node) or (kernel_span.get(None) if node is None or len(kernel_span) == 1 else None)
        at = f.ev.occurred_ns
        where = f" of {node}" if node else ""
        if span and at is not None and span[0] <= at <= span[1] + 60 * 1_000_000_000:
            return replace(f, match=replace(f.match, category="unknown", summary=(
                f"A worker (pid {f.match.groups.get('pid', '?')}) was killed with SIGKILL; the kernel log{where} "
                "covers that time and shows no OOM kill, so something else sent it (the scheduler, an "
                "operator, a health check, the process itself).")), cap="medium",
                links=[*f.links, f"the kernel log{where} covers the kill and holds no OOM kill"])
        return replace(f, match=replace(f.match, category="host-memory"), cap="low",
                       links=[*f.links, f"no kernel log{where} covers the kill: the kernel OOM killer is the usual "
                                        f"sender of SIGKILL; confirm with {DMESG} on that node"])
    if ex and ex["signal"] == "SIGBUS" and f.category == "unknown":
        return replace(f, match=replace(f.match, category="config"), cap="low",
                       links=[*f.links, f"SIGBUS: a process touched a page its file could not back, in a training job "
                                        f"most often shared memory full (/dev/shm: DataLoader workers, NCCL's "
                                        f"intra-node buffers); confirm with {SHM} on that node"])
    if f.has("unexplained") and f.category == "unknown":
        waited = [t for t in timeouts if t.has("collective-timeout") and _printed_before(t, f)]
        if waited:
            t = waited[0]
            return replace(f, match=replace(f.match, role="cascade", category="cascade"),
                           links=[*f.links, f"a death no one explained after a collective timeout ({t.sig} on rank "
                                            f"{t.ev.rank}): PyTorch's watchdog takes a process down once a collective "
                                            "timed out, and Ray reports that as a death of unknown cause"])
    if _aborted(f):
        mine = [t for t in timeouts if t.ev.rank == f.ev.rank and f.ev.rank is not None]
        before = [t for t in timeouts if _timed_before(t, f) or _printed_before(t, f)]  # or above it in a paste
        if mine or before:
            t = (mine or before)[0]
            return replace(f, match=replace(f.match, role="cascade", category="cascade"),
                           links=[*f.links, f"SIGABRT after a collective timeout ({t.sig} on rank {t.ev.rank}): how "
                                            "PyTorch takes a rank down once a collective failed, not a cause"])
        return replace(f, cap="medium")  # an abort alone says little of why (a process can abort at teardown, FACTS.md)
    return f


def _printed_before(t: Finding, f: Finding) -> bool:
    """``t`` came before ``f``: earlier in the same stream (its order is what was printed; an untimed
    line takes the time of a later one), or earlier in time across streams where both are timed."""
    if t.ev.stream == f.ev.stream:
        return t.ev.seq < f.ev.seq
    return _timed_before(t, f)


def _timed_before(t: Finding, f: Finding) -> bool:
    """Both are timed and ``t`` is not after ``f`` (within their clocks' uncertainty)."""
    return (t.ev.occurred_ns is not None and f.ev.occurred_ns is not None
            and t.ev.occurred_ns <= f.ev.occurred_ns + f.ev.uncertainty_ns + t.ev.uncertainty_ns)


_QUIET = ("SIGTERM", "SIGINT")  # how launchers stop the survivors: no failure of the rank's own


USAGE_EXIT = 2
USAGE = ("exit status 2 with no error line is what a command line the script rejects ends with (argparse's "
         "parser.error, e.g. --local-rank where the script expects --local_rank) or a script path Python can not "
         "open; read the worker's first stderr lines (usage: ... error: ...) to confirm")


def exit_failure(findings: list[Finding]) -> Finding | None:
    """When no line says what failed, a worker that exited non-zero (not stopped by its launcher)
    is the failure, at low confidence: the one under torchrun's Root Cause header first (the
    failure its agent observed first), else the earliest. None when no worker exited so."""
    exits = [f for f in findings if f.ev.source != "kernel" and (ex := exit_of(f)) is not None
             and ex["code"] not in (0, None) and ex["signal"] not in _QUIET]
    headers = [f for f in findings if "root_cause" in f.match.groups]  # torchrun's "Root Cause (first observed failure):"
    if not exits:
        return _child_failed(findings)
    under = [f for f in exits if any(f.ev.stream == h.ev.stream and f.ev.seq > h.ev.seq for h in headers)]
    pick = min(under, key=lambda f: (f.ev.stream, f.ev.seq)) if under else exits[0]  # exits: in timeline order
    links = [*pick.links, "no line of the job says what failed: this worker's exit is the only sign"]
    category = pick.category
    if exit_of(pick)["code"] == USAGE_EXIT and pick.category == "unknown" and _said(findings) is None:
        category, links = "config", [*links, USAGE]
    return replace(pick, match=replace(pick.match, role="root", category=category), cap="low", links=links)


def _said(findings: Iterable[Finding], deaths: bool = True) -> Finding | None:
    """The first failure the text names in words: a mention (99-fallback's text.failure_mention), or a
    known failure in a heading (prose); of a class, not ``unknown`` or a cascade. ``deaths``: words that a
    process was killed without an error of its own (trait ``death-words``) count too."""
    return next((m for m in findings if m.category not in ("unknown", "cascade")
                 and (m.has("mention") or (m.ev.fields.get("prose") and m.role == "root"))
                 and (deaths or not m.has("death-words"))), None)


def _child_failed(findings: list[Finding]) -> Finding | None:
    """A launcher's word that a worker failed, with nothing else said (catalog trait ``child-failed``):
    torchrun's ChildFailedError with its failure table cut (elastic's launch_agent raises it only when a
    worker failed: torch/distributed/launcher/api.py ``if result.is_failed(): raise ChildFailedError``,
    1.9-2.9), mpirun's first process to exit non-zero, the training-operator's failed replicas. It is
    the failure, of the rank it names if any, of an unknown kind (low)."""
    banners = [f for f in findings if f.has("child-failed")]
    if not banners:
        return None
    banner = next((f for f in banners if f.ev.rank is not None), banners[0])  # mpirun's names the rank below its header
    return replace(banner, match=replace(banner.match, role="root"), cap="low",
                   links=[*banner.links, "no line of the job says what failed: the launcher's word that a worker "
                                         "failed is all there is"])


STOPPED = ("A worker ended and its launcher stopped the others; which worker ended, and why, is not in "
           "the text (a worker killed without a word of its own: often the kernel's OOM killer).")


def launcher_stopped(stops: list[Finding]) -> Finding:
    """The launcher's first act of stopping its workers as the failure, when it is all the text says:
    DeepSpeed's launcher (launcher/launch.py sigkill_handler, "Killing subprocess {pid}") and torchrun
    (elastic/multiprocessing/api.py, "Sending process {pid} closing signal SIGTERM") stop the workers
    when one exited non-zero (a signal from outside is told apart: stopped-from-outside). Low."""
    f = min(stops, key=lambda f: (f.ev.stream, f.ev.seq))
    return replace(f, match=replace(f.match, role="root", category="unknown", summary=STOPPED), cap="low",
                   links=[*f.links, "no rank waited and no line says what failed: the launcher stopping its "
                                    "workers is the only sign that one ended"])


QUOTED = ("no line of the log says what failed and no heading names it: the text quotes this exception "
          "inside a sentence; find it in the failing rank's own output to confirm")


CARRIED = ("no line of the log says what failed: this line carries a remote worker's exception to the driver "
           "and the worker's own traceback is not in the text; find it in that worker's log to confirm")


OOM_REPORTED = ("the kernel's OOM killer report is in the text, its line of the kill is not (cut off): the kernel "
                "prints that report only as it kills; the process it chose (task=, pid= in the report) died")


def oom_reported(findings: Iterable[Finding]) -> Finding | None:
    """Rule 5, before a quoted exception: the kernel's OOM report (trait ``oom-report``: the allocation
    that invoked the killer, the victim it chose, mm/oom_kill.c dump_header) with its "Killed process"
    line cut off (a paste, a capture that ends there) is the kill: host-memory, low; the victim's summary
    first, for its pid. Not when identify found the victim to be another job's or process's
    (link_kernel): that is no failure of this job."""
    reports = [f for f in findings if f.has("oom-report")]
    if not reports or any(link.endswith((ANOTHER_JOBS, ANOTHER_PROCESS)) for f in reports for link in f.links):
        return None
    f = next((f for f in reports if f.match.groups.get("pid")), reports[0])
    return replace(f, match=replace(f.match, role="root"), cap="low", links=[*f.links, OOM_REPORTED])


def quoted_exception(findings: Iterable[Finding]) -> Finding | None:
    """The last resort of rule 5, as a root at low confidence, when nothing else says what failed: the
    first exception a line carries from another process (trait ``carried-exception``: Ray's
    "RayTaskError(<cause>): ray::<task>() (pid=..., ip=...)" with the worker's traceback cut off), else
    the last exception the text quotes inside a line (a person's sentence: 'I got "AssertionError: ..."';
    99-fallback's text.exception_quoted); None when there is neither."""
    carried = [f for f in findings if f.has("carried-exception")]
    said = [f for f in findings if f.has("quoted-exception")]
    if not carried and not said:
        return None
    f, why = (carried[0], CARRIED) if carried else (said[-1], QUOTED)
    return replace(f, match=replace(f.match, role="root"), cap="low", links=[*f.links, why])


def with_mentioned_category(f: Finding, findings: Iterable[Finding]) -> Finding:
    """A traceback cut before its exception line, a worker's exit that no line explains
    (exit_failure), or a death its reporter could not explain (trait ``unexplained``: Ray's
    SYSTEM_ERROR worker death, whose list of possible causes is no finding) says nothing of what
    failed: where the text names a class of failure in words (an issue title, a note, a message, a
    known failure in a heading), the first such mention gives the category, said in the links
    (confidence low). A cut traceback under a title that quotes a survivor's error (a collective's
    timeout, a peer gone) is that error's traceback: cascade, low. An out-of-memory whose memory the line
    does not say (trait ``memory-unresolved``: Ray's RayTaskError(OutOfMemoryError), which torch's and
    Ray's own share) takes it from words about memory only: GPU where they name one, else the host's."""
    unexplained = f.has("unexplained") and f.category == "unknown"
    memory = f.has("memory-unresolved") and f.category == "unknown"
    if not (f.has("cut-traceback") or unexplained or memory
            or (f.category == "unknown" and f.cap == "low" and exit_of(f) is not None)):
        return f
    # a cut traceback raised: words that a process was killed without an error say nothing of its exception
    said = _said(findings, deaths=not f.has("cut-traceback"))
    if memory:  # which memory is all the words may add: GPU where they say so, else the host's
        if said is None or said.category not in ("gpu-memory", "host-memory"):
            return f
        category = "gpu-memory" if _GPU_WORDS.search(said.ev.text) else "host-memory"
        return replace(f, match=replace(f.match, category=category), cap="low",
                       links=[*f.links, f"which memory, from the text's words: {said.ev.text.strip()[:160]}"])
    if said is None:
        titled = f.has("cut-traceback") and next((h for h in findings if h.ev.fields.get("prose")
                                                  and h.role == "cascade"), None)
        if titled:  # the title quotes a survivor's error: the cut traceback's own, cut off
            return replace(f, match=replace(f.match, category="cascade"), cap="low",
                           links=[*f.links, "category from the text's title, a survivor's error (the traceback "
                                            f"is cut before its own): {titled.ev.text.strip()[:160]}"])
        return f
    category = said.category
    if unexplained and category == "gpu-memory" and not _GPU_WORDS.search(said.ev.text):
        category = "host-memory"  # out of memory, and the process died without an error of its own: killed
    return replace(f, match=replace(f.match, category=category), cap="low" if unexplained else f.cap,
                   links=[*f.links, f"category from the text's words: {said.ev.text.strip()[:160]}"])


# Words that put an out-of-memory on the GPU. A failed GPU allocation raises in the process
# (torch.OutOfMemoryError, "CUDA out of memory"); a process that died with no error of its own was
# killed, and "OOM" said of it without these words is the host's (the kernel's or Ray's OOM killer).
_GPU_WORDS = re.compile(r"CUDA|GPU|HIP|NPU|XPU|VRAM|device|显存", re.IGNORECASE)


WORDS_ONLY = ("no line of the log says what failed: the text names it in words only; find the failing "
              "rank's own error in its full log (its stderr, the launcher's summary, dmesg for a kill) to confirm")


def heading_phase(f: Finding) -> str | None:
    """The phase a mention names: its signature's one phase ("timeout on save checkpoint"), else the
    Ray task or worker method its words name ("NCCL timeout during compute_log_prob":
    phase.phase_from_task_words); None when it names none."""
    phases = f.match.signature.phases
    return phases[0] if len(phases) == 1 else phase_from_task_words(f.ev.text)


def phase_heading(findings: Iterable[Finding]) -> Finding | None:
    """The first heading (prose) that says the job failed in a phase (``heading_phase``): 99-fallback's
    phase mentions ("timeout on save checkpoint", "init_process_group hangs"), a failure named with
    the Ray task or worker method it happened in (a mention's words, or a known failure's line quoted in
    the title with the call it came from: "compute_log_probs(...) torch.OutOfMemoryError: ...")."""
    return next((f for f in findings if f.ev.fields.get("prose") and (f.has("mention") or f.role == "root")
                 and heading_phase(f) is not None), None)


def named_in_words(findings: Iterable[Finding], phases: bool = True, deaths: bool = True) -> Finding | None:
    """Rule 5: the failure a heading of the text (an issue's title: prose) names in words (``_said``),
    as a root at low confidence, when nothing else says what failed; None when none does. Words on
    a line of the log itself ("we saw NaN once") are no failure by themselves. ``phases``: a heading
    that names only the phase it failed in counts too (not beside a hang, whose cascades say more). ``deaths``:
    as ``_said``'s."""
    prose = [f for f in findings if f.ev.fields.get("prose") and (deaths or not f.has("death-words"))]
    said = _said(prose) or (phase_heading(prose) if phases else None)
    if said is None:
        return None
    return replace(said, match=replace(said.match, role="root"), cap="low", links=[*said.links, WORDS_ONLY])
