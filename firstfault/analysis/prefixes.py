"""Peel what launchers, log collectors and pastes put in front of a line. Pure.

A rank's line reaches a reader behind any number of prefixes that the program
never printed, in any order. ``peel`` removes every known one and keeps what it
says (the rank, the node, the time, who printed the line), so the catalog and the
traceback grammar see the line as the program printed it. Known prefixes, each from
the tool's own format (examples made up)::

    [rank7]:  [default0]:             PyTorch's worker prefix (global rank); torchrun --tee (role + local rank)
    [rank: 3]                         Lightning's rank_prefixed_message
    [1,3]<stderr>:                    Open MPI mpirun --tag-output ([jobid,rank]<stream>:)
    12:                               srun --label (task id = global rank)
    gpu-node-3:  10.0.0.5:            pdsh / the DeepSpeed multi-node launcher (host:)
    trainer.node-7 [stderr]           a runner naming the node and the stream (milabench)
    finetune/0 [default2]:[rank2]:    torchx's log viewer (role/replica id; NeMo-Run), peeled only before a
                                      PyTorch or torchrun --tee prefix
    (WorkerDict pid=123, ip=10.0.0.5) Ray's worker prefix; (raylet), (pid=123); "[repeated 3x across cluster]" after;
                                      the ip is a host name where Ray was given one (--node-ip-address), an
                                      IPv6 address in brackets (ip=[fd00::5]); the name is the actor's repr,
                                      which names the global rank where the trainer says so
                                      ((MegatronPolicyWorker[rank=3] pid=123): NeMo-RL's workers) and may
                                      hold a role in parentheses ((ActorWorker(reference-0) pid=123): ROLL's)
    (VllmWorker rank=3 pid=44710)     vLLM's own worker processes ((VllmWorker TP0 pid=N), (EngineCore_DP0 pid=N)):
                                      its rank is the engine's worker index, no training rank
    (head, rank=0, pid=4773)          SkyPilot's run prefix: the node's name and index (a node, not a training rank),
    (worker1, rank=1, pid=88, ip=10.0.0.2)  with the worker node's ip; one node: (task name, pid=4773)
    [2026-02-18 10:48:25]             a collector's bracketed time, peeled only before a Ray or rank prefix (a
                                      program's own "[2026-02-18 10:48:25,681] [INFO]" header stays)
    2026-02-18 10:48:25,681 - app - INFO - [rank0]:
                                      a Python logger relaying a rank's output (logging's "%(asctime)s -
                                      %(name)s - %(levelname)s - " format), peeled only before a rank prefix
    trainer-1  |                      docker compose service prefix
    2026-02-18T10:48:25.681Z          a collector's RFC 3339 time (kubectl --timestamps, Loki, CloudWatch, docker), with or
                                      without a colon after it
    2026-02-18T10:48:25.681Z stdout F the CRI log format (kubelet's files)
    Feb 18 10:48:25 gpu-3 kernel:     journald / syslog (time, host, identifier[pid])
    E       RuntimeError: x           pytest's marker of a failing test's exception lines ("E" and three spaces or
                                      more: _pytest/_code/code.py FormattedExcinfo's fail marker and indent)
    > >>  `                           Markdown quoting and inline code left in a paste
    [80851]                           a log viewer's line number (3 to 7 digits; one or two digits may be a
                                      rank's tag, "[0] node0:13571:13571 [0] NCCL INFO ...", and stay); it
                                      names no one, so it adds nothing to the key
    # ##                              a Markdown heading (or a shell comment): what a person wrote, not a log
    **RuntimeError: x**  _**x**_      Markdown bold around a whole line: a person's emphasis over words
                                      quoted from the log; peeled at both ends and marked prose
    Error:  Log:  Output:             a caption alone on its line (one word and a colon): a person's words
                                      over the paste. Python prints an exception with an empty message
                                      without the colon (traceback.format_exception_only: "Error"), so
                                      such a line is no program's exception; it is marked prose
    \\t, spaces                       only in front of another known prefix

A program's own log header (DeepSpeed's ``[2026-... ] [INFO]``, glog, Python logging's
``2026-02-18 10:48:25,681 - INFO -``) is part of what it printed and stays. Labels that
could be ordinary words (``12: ``, ``node03: ``) are peeled only where the stream is
known to be labelled or something known follows them (another prefix, a log header, a
traceback line). ``key`` names who printed the line (node, Ray worker, service, task,
rank): tracebacks are followed per key, so interleaved ranks stay apart.

Invariants: never raises; the text comes back unchanged when nothing known leads it;
at most MAX_PEELS prefixes come off a line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

MAX_PEELS = 8

_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
# A Ray worker's name in its prefix: a task or actor class, with what its repr adds (NeMo-RL's
# "[rank=3]", ROLL's "(reference-0)", vLLM's " rank=3", " TP0"); the actor's rank where it names one.
_RAY_ACTOR = r"[A-Za-z_][\w.<>:-]*(?:\[rank=(?P<rayrank>\d+)\]|\([\w.:-]*\)| rank=\d+| [TDP]P\d+)?"
# each alternative is one prefix; named groups say what it carries
_PREFIX = re.compile(
    r"[ \t]*(?:"
    r"\[rank(?P<rank>\d+)\]:[ ]?"
    r"|\[rank: (?P<lrank>\d+)\][ ]"
    r"|\[(?P<role>[A-Za-z_][\w.-]{0,62}?)(?P<local>\d+)\]:"
    r"|\[\d+,(?P<mpi>\d+)\]<(?:stdout|stderr)>:[ ]?"
    r"|\((?P<ray>(?:" + _RAY_ACTOR + r")?(?: ?pid=\d+)?)(?:, ip=(?:\[(?P<rayip6>[0-9A-Fa-f.:]+)\]|(?P<rayip>[0-9A-Fa-f.:]+|[A-Za-z0-9][\w.-]*)))?(?:, repr=[^)]*)?\)[ ]"
    r"|\((?P<sky>[A-Za-z][\w-]*), (?:rank=(?P<skynode>\d+), )?pid=\d+(?:, ip=(?P<skyip>[0-9A-Fa-f.:]+))?\)[ ]"
    r"|(?P<service>[A-Za-z0-9][\w.-]*[-_]\d+)[ ]+\|[ ]"
    r"|(?P<runner>[A-Za-z][\w-]*\.[\w.-]+) \[(?:stdout|stderr)\][ ]"
    r"|(?P<torchx>[A-Za-z_][\w-]*/\d+)[ ](?=\[(?:rank\d+|[A-Za-z_][\w.-]*?\d+)\]:)"
    r"|\[(?P<bstamp>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?)\][ ](?=\((?:" + _RAY_ACTOR.replace("(?P<rayrank>", "(?:") + r")?(?: ?pid=\d+)|\[rank\d+\]:)"
    r"|(?P<pylog>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - [\w.-]+ - [A-Z]+ - (?=\[rank\d+\]:)"
    r"|(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?):?[ \t]+(?:(?:stdout|stderr) [FP][ ])?"
    r"|(?P<syslog>(?:" + _MONTHS + r") [ \d]\d \d\d:\d\d:\d\d) (?P<sysnode>[\w.-]+) [\w./@-]+(?:\[\d+\])?:[ ]"
    r"|E[ ]{3,}(?=\S)"
    r"|>+[ ]?"
    r"|\[(?P<lineno>\d{3,7})\][ ]"
    r"|(?P<tick>`+)"
    r"|(?P<heading>\#{1,6})[ ]"
    r")"
)
# A label that may be an ordinary word: peeled only where something known follows it.
_LABEL = re.compile(
    r"[ \t]*(?:(?P<task>\d{1,5})|(?P<host>(?:\d{1,3}\.){3}\d{1,3}|[A-Za-z][\w-]*\d[\w.-]*|[A-Za-z][\w-]*-[\w.-]+)): "
)
# what may follow a label for it to be one: a launcher prefix, a log header, a traceback line
_AFTER_LABEL = re.compile(
    r"\[(?:rank\d|\d{4}-\d\d-\d\d|[IWEF]\d{4} |[A-Za-z_][\w.-]*\d+\]:)|Traceback \(|\s+File \"|[IWEF]\d{4} \d\d:"
    r"|\d{4}-\d\d-\d\d[ T]\d\d:|[\w.-]+:\d+:\d+ \[\d+\] NCCL "
)
# "Error:", "Log:" alone on a line (a person's caption); not a builtin exception's name ("Exception: " heads a
# message that starts with a newline, as mp.spawn's before 1.7; "ValueError: "), none of which is bare "Error"
_CAPTION = re.compile(r"(?![A-Za-z]*(?:Exception|Warning|Interrupt|Exit|[A-Za-z]Error):)[A-Z][A-Za-z]{1,23}:[ \t]*")
_EMPHASIS = re.compile(r"(?P<u>_?)\*\*(?=\S)(?P<inner>.*?\S)\*\*(?P=u)[ \t]*")  # **words**, _**words**_
_RAY_REPEAT = re.compile(r" \[repeated \d+x across cluster\]$")
_PEELABLE = frozenset("[ \t(>`#0123456789")  # a line starting otherwise can start only with a word prefix


@dataclass(frozen=True, slots=True)
class Peeled:
    """One line with its prefixes off: the text the program printed and what the prefixes said."""

    text: str
    key: str = ""  # who printed it, from the prefixes ("" when nothing was peeled)
    rank: int | None = None  # a global rank a prefix named
    local_rank: int | None = None
    label: int | None = None  # an srun task id
    node: str | None = None
    stamp: str | None = None  # a collector's or syslog's time in front of the line, as written
    peeled: str = ""  # the prefixes as they were written
    labels: tuple[str, ...] = ()  # the word labels peeled (``12``, ``gpu-3``): known for the stream's next lines
    prose: bool = False  # a heading or comment: a person's words about the log, not a line of it


def peel(line: str, *, srun_labels: bool = False, labels: frozenset[str] | set[str] = frozenset()) -> Peeled:
    """``line`` without the prefixes in front of it (module docstring), and what they said.

    ``srun_labels``: the stream is known to be labelled by srun; ``labels``: word labels
    already peeled from this stream (with something known after them), peeled again
    whatever follows them (a traceback's source lines)."""
    if line[:1] in ("*", "_") and (em := _EMPHASIS.fullmatch(line)) is not None:
        inner = peel(em.group("inner"), srun_labels=srun_labels, labels=labels)
        return replace(inner, prose=True, peeled=line[:em.start("inner")] + inner.peeled)
    if not line or (line[0] not in _PEELABLE and not line[0].isalpha()):
        return Peeled(line)
    pos, n = 0, 0
    rank = local = label = None
    node = stamp = None
    prose = False
    who: list[str] = []
    words: list[str] = []
    while n < MAX_PEELS:
        m = _PREFIX.match(line, pos)
        if m is not None and m.end() > pos:
            g = m.groupdict()
            if g["rank"] is not None:
                rank = int(g["rank"])
            elif g["lrank"] is not None:
                rank = int(g["lrank"])
            elif g["local"] is not None:
                local = int(g["local"])
                who.append(f"{g['role']}{g['local']}")
            elif g["mpi"] is not None:
                rank = int(g["mpi"])
            elif g["sky"] is not None:  # SkyPilot: rank= is the node's index, not a training rank
                node = node or g["skyip"] or (g["sky"] if g["skynode"] is not None else None)
                who.append(f"({g['sky']})")
            elif g["service"] is not None:
                who.append(g["service"])
            elif g["torchx"] is not None:
                who.append(g["torchx"])
            elif g["runner"] is not None:
                node = node or g["runner"].rsplit(".", 1)[-1]
                who.append(g["runner"])
            elif (written := g["iso"] or g["bstamp"] or g["pylog"]) is not None:
                stamp = stamp or written
            elif g["heading"] is not None:
                prose = True
            elif g["syslog"] is not None:
                stamp, node = stamp or g["syslog"], node or g["sysnode"]
            elif m.group(0).strip().startswith("("):
                ip = g["rayip"] or g["rayip6"]
                node = node or ip
                if g["rayrank"] is not None:  # an actor whose repr names its rank (NeMo-RL's workers)
                    rank = int(g["rayrank"])
                who.append(f"({g['ray']}{', ' + ip if ip else ''})")
            pos, n = m.end(), n + 1
            continue
        m = _LABEL.match(line, pos)
        if m is None:
            break
        word = m.group("task") or m.group("host")
        rest = line[m.end():]
        if not (srun_labels and m.group("task") is not None) and word not in labels \
                and _AFTER_LABEL.match(rest) is None and not (rest[:1] in ("[", "(") and peel(rest).peeled):
            break
        words.append(word)
        if m.group("task") is not None:
            label = int(m.group("task"))
            who.append(f"task{label}")
        else:
            node = node or m.group("host")
            who.append(m.group("host"))
        pos, n = m.end(), n + 1
    if pos == 0:
        return Peeled(line, prose=True) if line[-1:] in (":", " ", "\t") and _CAPTION.fullmatch(line) else Peeled(line)
    text = line[pos:]
    if "`" in line[:pos] and text.endswith("`"):
        text = text.rstrip("`")
    if text.endswith("across cluster]"):
        text = _RAY_REPEAT.sub("", text)
    if rank is None and label is not None:
        rank = label
    if rank is not None:
        who.append(f"rank{rank}")
    return Peeled(text, "|".join(who), rank, local, label, node, stamp, line[:pos], tuple(words), prose)
