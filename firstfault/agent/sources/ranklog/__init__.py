"""ranklog: every line of the ranks' log files, byte-exact, a whole traceback as one record.

Follows files by ``globs`` with named parts (``/logs/{job}/rank{rank}.log``,
firstfault/agent/tail/follow.py ``compile_glob``), the launchers' layouts under ``dirs``
(torchrun ``--log-dir``, DeepSpeed ``--enable_each_rank_log``: firstfault/common/layouts.py)
and the kubelet's container logs under ``pod_dirs`` (``/var/log/pods``, the CRI format:
firstfault/common/crilog.py),
with the byte-exact tailer (firstfault/agent/tail/: rotation, copytruncate, positions) woken
by inotify (firstfault/agent/tail/follow.py). A line as written by a rank (tests/data/real)::

    [rank1]: ValueError: feature vector has 17 columns, expected 16 (bad record in batch at step 5)

Emits (source "ranklog", ``occurred_ns`` nil: the collector reads the line's own
stamp, firstfault/analysis/records.py; ``observed_ns`` when the chunk was read):

- ``rank.line``: one per line; message = the line's bytes as UTF-8, invalid bytes
  as ``\\xNN``, a line over ``max_line_bytes`` cut with the tailer's marker.
- ``rank.stacks`` (severity 4, field ``tool`` = faulthandler): a faulthandler dump's
  thread blocks as one record, grouped and flushed like a traceback (torchelastic's
  ``@record`` enables faulthandler: a rank that dies of SIGABRT or SIGSEGV prints one).
- ``rank.traceback`` (severity 3): the lines of one Python traceback joined by
  ``\\n`` (firstfault/analysis/assembly.py says which, the machine the offline scanner
  runs too, over traceback.py's grammar), prefixes kept, cut to
  MAX_MESSAGE_BYTES with the same marker; observed_ns of its first line. A
  traceback still open (no line has ended it yet) is shipped ``traceback_flush_s``
  after its last line, so a rank's dying words never wait for more.
- ``rank.gap`` (severity 4): lines that will never come: fields ``reason`` (the
  tailer's event: ``lost``, ``truncated`` (copytruncate: what was written just
  before it may be gone), ``error``, ``state_reset`` (positions forgotten: lines
  may come twice)), ``path``, ``ino`` and ``offset`` (the file and the byte after
  which its lines are gone), ``detail``.

A CRI log (``pod_dirs``): each record's ``<time> <stream> <P|F>`` is read off, the
partial records of a long line joined to its full one (one line, at its first record's
time), ``occurred_ns`` = the record's time, field ``stream`` (stdout | stderr), and
tracebacks are grouped per stream; fields ``namespace``, ``pod``, ``pod_uid``,
``container``, ``restart`` from the path; job and rank from the pods source (``pod_owner``,
wired by the daemon: the pod's one rank; asked again for each chunk until it knows the pod).
A line whose full record never came is held until its file is rotated away (commits
stop at its start meanwhile: a restart then reads the lines after it again).

Identity, on every record: fields ``path`` (and the glob's other named parts,
``attempt`` for torchrun); ``job``: the ``{job}`` part, else torchrun's run id
(the run folder's name less mkdtemp's suffix, = TORCHELASTIC_RUN_ID as procs
reports it), else the agent's job label (``job_label``, wired by the daemon);
``rank`` / ``local_rank``: the ``{rank}`` / ``{local_rank}`` parts (a part that is
not a number is logged and dropped), else the layout's (DeepSpeed: rank; torchrun:
local rank). Other named parts (``{node}``) become fields of that name.

Exactly once across restarts: rows of one poll go to the spool in one
``emit_many`` call, and only after it returned are their positions committed
(``<state_dir>/ranklog.json``, written without fsync: a commit only bounds the
restart's catch-up scan of the spool; after a wake's polls once COMMIT_S passed
since the last commit or COMMIT_BYTES of lines were read since, and at stop).
Lines held for an open traceback are not committed, and nothing after the first
held line is emitted before it (a path's records leave in one
prefix of its stream, so the committed offset never passes an emitted line).
A stop, or an emit that raises, at any point: the restarted source reads again
exactly what the spool lacks (the positions of what it spooled are kept in memory
across its runs, as the catch-up below would find them). A position that cannot be
saved (the state dir's disk is full) is logged and left to the spool. The spool's
disk full: the rows are held and offered again every HOLD_RETRY_S, reading waits
(the lines stay in their files), nothing is lost and no gap is written. An agent *killed* between a spool append and the
next commit: the positions are in the spool too. In each ``emit_many`` call the
last row of each path carries where that path's stream then stands, fields
``dev``, ``ino`` (the file), ``end_offset`` (just past the row's last line: the
position a commit would save, never past a held line) and ``fp_len``, ``fp``
(the tailer's fingerprint of its first bytes: tells a truncated file's new
content from the old); one extra dict per path per call. At start
``saved_at_ns`` is when the committed offsets were written
(firstfault/agent/tail/ ``committed_at_ns``), ``catch_up`` keeps each path's newest
spooled position since then, and ``run`` hands them to ``Tailer.advance``
before following: a saved file of that (dev, ino) whose first bytes still match
is resumed there, the path's files before it are dropped (drained: a stream
leaves in order); a position naming no saved file (committed and forgotten
since, another inode) changes nothing. Known issue: rows in a spool segment that
was filled, acknowledged and removed between two commits (a whole segment between
two commits: COMMIT_BYTES is 1 MiB, the default segment 8 MiB, a spool configured
smaller has smaller segments) are not seen at restart: those lines are sent again.
An OS crash may bring back an older state file (the catch-up scan then starts
earlier) or a corrupt one (``state_reset``: lines may come twice).

``watch`` (wired by the daemon to the stacks and checkpoints sources): told of every
line, once a wake per job: the identity of the job's first file in the wake, the
lines of all its files read in that wake (bytes joined by newlines) and the wake's
first read time, in this thread, before they are emitted (a call per chunk cost ~10 µs
a file a wake, bench/agent.py).

Cost: the hot path builds no object per line: a chunk's lines go to the spool
as the bytes read (a wake's chunks checked UTF-8 in one call) in columns whose other values are
runs per chunk and per file (firstfault/agent/spool/columns.py; bench/ranklog.py,
bench/RESULTS.md); only chunks where a traceback may open (a header, a frame
line: ``traceback.may_open``), and a path's lines while one of its tracebacks is
open, go line by line.
"""

from firstfault.agent.sources.ranklog.engine import (
    COMMIT_BYTES,
    COMMIT_S,
    HOLD_RETRY_S,
    KIND_RANK_GAP,
    MAX_TRACEBACK_BYTES,
    RankLines,
    Watch,
    decode_lines,
    fit_message,
)
from firstfault.agent.sources.ranklog.identity import PathIdentity
from firstfault.agent.sources.ranklog.source import RanklogSource, glob_names_a_job

__all__ = ["COMMIT_BYTES", "COMMIT_S", "HOLD_RETRY_S", "KIND_RANK_GAP", "MAX_TRACEBACK_BYTES", "PathIdentity",
           "RankLines", "RanklogSource", "Watch", "decode_lines", "fit_message", "glob_names_a_job"]
