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

``watch`` (wired by the daemon to the stacks source): called with each chunk's
identity, lines (bytes joined by newlines) and read time, in this thread, before
they are emitted.

Cost: the hot path builds no object per line: a chunk's lines go to the spool
as the bytes read (checked UTF-8 in one call) in columns whose other values are
runs per chunk and per file (firstfault/agent/spool/columns.py; bench/ranklog.py,
bench/RESULTS.md); only chunks where a traceback may open (a header, a frame
line: ``traceback.may_open``), and a path's lines while one of its tracebacks is
open, go line by line.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable

from firstfault.agent.sources.base import Emit, IntakeFull, Source, emit_columns, emit_many, printable, register
from firstfault.agent.spool.columns import ColumnsBuilder, as_text
from firstfault.agent.tail import (
    ERROR,
    LOST,
    MIN_LINE_BYTES,
    STATE_RESET,
    TRUNCATED,
    FileChange,
    LineBatch,
    Position,
    StateError,
    Tailer,
    committed_at_ns,
    cut_line,
)
from firstfault.agent.tail.follow import FollowLoop, compile_glob
from firstfault.analysis.assembly import RANK_LOG, STACKS, Assembly, Group
from firstfault.analysis.prefixes import peel
from firstfault.analysis.stacks import DUMP_MARK
from firstfault.analysis.traceback import may_open, visible
from firstfault.common.crilog import CriJoiner, parse_pod_log_path, pod_log_globs
from firstfault.common.layouts import TORCHRUN, TORCHRUN_FILES, layout_globs, parse_log_path
from firstfault.wire import (
    COLUMNS,
    KIND_RANK_LINE,
    KIND_RANK_STACKS,
    KIND_RANK_TRACEBACK,
    MAX_MESSAGE_BYTES,
    MAX_NAME_BYTES,
    SOURCE_RANKLOG,
)

log = logging.getLogger(__name__)

KIND_RANK_GAP = "rank.gap"  # not (yet) in wire.KINDS; new kinds decode as-is
GAP_EVENTS = (LOST, TRUNCATED, ERROR, STATE_RESET)
MAX_TRACEBACK_BYTES = 4 * MAX_MESSAGE_BYTES  # a traceback held longer is shipped as it is
COMMIT_S = 0.25  # positions are committed at most this often while lines flow...
COMMIT_BYTES = 1 << 20  # ...or once this many bytes of lines were read since the last
HOLD_RETRY_S = 0.5  # the spool's disk full: rows offered again this often
MAX_PATHS_KNOWN = 4096  # identities cached; the cache starts over beyond (paths come and go)
_GLOB_CHARS = set("*?[]{}")
_DUMP_MARK = DUMP_MARK.encode()
_LINE_KINDS = (KIND_RANK_LINE, KIND_RANK_TRACEBACK, KIND_RANK_STACKS)
# ``watch(identity, lines, observed_ns)``: told of every chunk of lines (bytes joined by
# newlines), in the ranklog thread (the stacks source's trigger: it must return at once)
Watch = Callable[[tuple, bytes, int], None]
_POSITION = ("dev", "ino", "end_offset", "fp_len", "fp")  # Tailer.advance's arguments
_POSITION_TYPES = [int, int, int, int, str]


def fit_message(text: str) -> str:
    """``text`` cut to MAX_MESSAGE_BYTES of UTF-8 with the tailer's cut marker."""
    if len(text) <= MAX_MESSAGE_BYTES // 4:
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_MESSAGE_BYTES:
        return text
    return cut_line(raw[:MAX_MESSAGE_BYTES], len(raw), MAX_MESSAGE_BYTES).decode("utf-8", "ignore")


def decode_lines(data: list[bytes], raw: bytes | None = None) -> tuple[list[bytes] | list[str], bool]:
    """(the lines as messages, whether one may open a traceback); ``raw``: the lines
    joined by newlines, if known. A chunk that is UTF-8 (checked in one call) keeps
    its lines' bytes: the spool packs them as str, nothing is decoded (its lines are
    at most max_line_bytes <= MAX_MESSAGE_BYTES). Else each line as text, each
    invalid byte as ``\\xNN`` (tail.to_text), fit to the wire's message limit."""
    raw = b"\n".join(data) if raw is None else raw
    marked = may_open(raw) or _DUMP_MARK in raw
    if raw.isascii():
        return data, marked
    try:
        raw.decode()
        return data, marked
    except UnicodeDecodeError:
        return [fit_message(d.decode("utf-8", "backslashreplace")) for d in data], marked


class _Pending:
    """A path's lines not yet emitted because a traceback among them is open.

    ``lines`` in file order: [start, end, text, observed_ns, owner, occurred_ns, stream],
    owner None for a line of its own, else the assembly.Group holding it (its ``data``:
    [when it was last fed, its bytes]); occurred_ns and stream: a CRI record's time and
    stream (None for a plain log's line). A CRI file's lines come in the order they were
    completed (a joined line after the lines of the other stream written between its records)."""

    __slots__ = ("file", "lines", "groups")

    def __init__(self, file) -> None:
        self.file = file
        self.lines: list[list] = []
        self.groups = Assembly(RANK_LOG)  # prefix -> its open traceback or dump (the analysis' machine)


class RankLines:
    """Tailer batches -> wire rows (emitted), tracebacks grouped, positions committed.

    The engine of the source, without threads or inotify: ``batches(list[LineBatch])``
    and ``events(list[FileChange])`` as a FollowLoop hands them over, ``tick()`` when
    ``next_tick`` (on ``clock``) is due; positions are committed ``commit_s`` after the
    last commit (or after COMMIT_BYTES) and by ``commit()``.
    """

    def __init__(self, tailer: Tailer, emit: Emit, *, job_label: str | None = None,
                 traceback_flush_s: float = 1.0, commit_s: float = COMMIT_S,
                 clock: Callable[[], float] | None = None, watch: Watch | None = None,
                 pod_owner: Callable[[str], object | None] | None = None,
                 hold: Callable[[float], bool] | None = None,
                 spooled: dict[str, tuple] | None = None) -> None:
        """``watch``: told of every chunk of lines (the stacks source's trigger); ``hold(seconds)``
        (a stop event's wait): when the spool's disk is full, wait and offer the rows again
        (True: stopping, give up) instead of losing them; ``spooled`` (path -> advance()'s
        position) is kept up to date with every emit."""
        self.tailer, self.commit_s = tailer, commit_s
        self.emit_rows, self.hold = emit_many(emit, hold=hold is not None), hold
        self.emit_columns = emit_columns(emit, hold=hold is not None)
        self.spooled = spooled if spooled is not None else {}
        self.watch, self.pod_owner = watch, pod_owner
        self.job_label, self.traceback_flush_s = job_label, traceback_flush_s
        self.clock = clock or tailer.clock
        self._holding = False  # the spool's disk is full: rows wait
        self._ident: dict[str, tuple] = {}
        self._pending: dict[str, _Pending] = {}
        self._cri: set[str] = set()  # paths in the CRI layout (/var/log/pods)
        self._joiners: dict[str, list] = {}  # CRI path -> [file, CriJoiner, stop of its last batch]
        self._emitted: dict[str, Position] = {}  # emitted, not yet committed
        self._emitted_bytes, self._commit_at = 0, self.clock() + commit_s

    def identity(self, path: str) -> tuple:
        """(job, rank, local_rank, fields) of a path, from the glob's named parts and the layout."""
        got = self._ident.get(path)
        if got is not None:
            return got
        parts = dict(self.tailer.fields(path))
        lp = parse_log_path(path)
        fields: dict = {"path": printable(path)}
        named_job = parts.pop("job", None)
        job = named_job or (lp.run_id if lp and lp.layout == TORCHRUN else None) or self.job_label
        named = parts.pop("rank", None), parts.pop("local_rank", None)
        rank, local = map(_int, named)
        if (rank, local).count(None) > named.count(None):
            log.warning("ranklog: a rank part of path=%s is not a number %s: not used", path, named)
        pl = parse_pod_log_path(path) if lp is None else None
        known = True
        if pl is not None:  # the kubelet's layout: the pod says who; its rank comes from the pods source
            self._cri.add(path)
            fields.update(namespace=pl.namespace, pod=pl.pod, container=pl.container)
            fields.update((k, v) for k, v in (("pod_uid", pl.pod_uid), ("restart", pl.restart),
                                              ("container_id", pl.container_id)) if v is not None)
            owner = self.pod_owner(pl.pod_uid) if self.pod_owner and pl.pod_uid else None
            known = self.pod_owner is None or getattr(owner, "rank", None) is not None  # else asked again
            if owner is not None:
                job = named_job or owner.job or job
                rank = rank if rank is not None else owner.rank
        if lp is not None:
            rank = rank if rank is not None else lp.rank
            local = local if local is not None else lp.local_rank
            if lp.attempt is not None:
                fields["attempt"] = lp.attempt
        for k, v in parts.items():
            fields.setdefault(k, printable(v))
        got = (printable(job, MAX_NAME_BYTES) if job else None, rank, local, fields)
        if not known:
            return got
        if len(self._ident) >= MAX_PATHS_KNOWN:
            self._ident.clear()
        self._ident[path] = got
        return got

    # -- what the FollowLoop hands over --------------------------------------------

    def batches(self, batches: list[LineBatch]) -> None:
        rows = ColumnsBuilder()
        commit: dict[str, tuple[Position, int]] = {}
        for b in batches:
            self._emitted_bytes += b.stop - b.start
            ident = self.identity(b.path)
            if self.watch is not None:
                self.watch(ident, b.text, b.observed_ns)
            if b.path in self._cri:
                self._cri_batch(b, ident, rows, commit)
                continue
            p = self._pending.get(b.path)
            if p is not None and p.file != b.file:  # rotated or truncated: its tracebacks end
                self._close_all(p)
                self._drain(b.path, p, ident, rows, commit)
                p = self._pending.get(b.path)
            texts, marked = decode_lines(b.data, b.text)
            if p is None and not marked:
                rows.lines(texts, b.observed_ns, *ident, joined=b.text if texts is b.data else None)
                commit[b.path] = b.position, len(rows) - 1
                continue
            if p is None:
                p = self._pending[b.path] = _Pending(b.file)
            self._group(p, [[s, e, t, b.observed_ns, None, None, None]
                            for s, e, t in zip(b.offsets, b.ends, as_text(texts))])
            self._drain(b.path, p, ident, rows, commit)
        self._ship(rows, commit)

    def _cri_batch(self, b: LineBatch, ident: tuple, rows: ColumnsBuilder,
                   commit: dict[str, tuple[Position, int]]) -> None:
        """A CRI log's records: partial records joined to whole lines (firstfault/common/crilog.py),
        each line stamped with its record's time and stream, then grouped as any rank log's."""
        j = self._joiners.get(b.path)
        p = self._pending.get(b.path)
        if j is not None and j[0] != b.file:  # rotated or truncated: its open lines end as they are
            if p is None:
                p = self._pending[b.path] = _Pending(j[0])
            self._group(p, self._entries(j[1].flush(j[2]), b.observed_ns))
            del self._joiners[b.path]
            j = None
        if p is not None and p.file != b.file:
            self._close_all(p)
            self._drain(b.path, p, ident, rows, commit)
            p = self._pending.get(b.path)
        if j is None:
            limit = self.tailer.max_line_bytes
            j = self._joiners[b.path] = [b.file, CriJoiner(limit, lambda h, n: cut_line(h, n, limit)), 0]
        if p is None:
            p = self._pending[b.path] = _Pending(b.file)
        joined = []
        for data, start, end in zip(b.data, b.offsets, b.ends):
            joined += j[1].feed(data, start, end)
        j[2] = b.stop
        self._group(p, self._entries(joined, b.observed_ns))
        self._drain(b.path, p, ident, rows, commit)

    @staticmethod
    def _entries(joined: list, observed_ns: int) -> list[list]:
        texts, _ = decode_lines([x.content for x in joined])
        return [[x.start, x.end, t, observed_ns, None, x.time_ns if x.stream else None, x.stream or None]
                for x, t in zip(joined, as_text(texts))]

    def events(self, events: list[FileChange]) -> None:
        rows = []
        for e in events:
            if e.kind not in GAP_EVENTS:
                continue  # rotated, deleted: the tailer logged them; nothing is lost
            job, rank, local, fields = self.identity(e.path) if e.path else (self.job_label, None, None, {})
            rows.append((SOURCE_RANKLOG, KIND_RANK_GAP, fit_message(f"{e.kind}: {e.detail}"), None,
                         e.observed_ns, None, None, job, rank, local, None, 4,
                         {**fields, "reason": e.kind, "offset": e.offset,
                          "ino": e.file.ino if e.file else None, "detail": printable(e.detail)}))
        if rows:
            self.emit_rows(rows)

    def next_tick(self) -> float | None:
        """The clock time at which an open traceback goes quiet long enough to ship, or
        emitted positions are due for a commit."""
        due = [g.data[0] + self.traceback_flush_s for p in self._pending.values()
               for g in p.groups.open.values()]
        if self._emitted:
            due.append(self._commit_at)
        return min(due, default=None)

    def tick(self) -> float | None:
        """Ship the tracebacks that went quiet, commit what was emitted when due (COMMIT_S,
        COMMIT_BYTES); the next time to call again. The FollowLoop calls it once a wake,
        after that wake's polls."""
        now = self.clock()
        rows = ColumnsBuilder()
        commit: dict[str, tuple[Position, int]] = {}
        for path, p in list(self._pending.items()):
            quiet = [g for g in p.groups.open.values() if now - g.data[0] >= self.traceback_flush_s]
            for g in quiet:
                _release(p.groups.close(g.key))
            if quiet:
                self._drain(path, p, self.identity(path), rows, commit)
        self._ship(rows, commit)
        if now >= self._commit_at or self._emitted_bytes >= COMMIT_BYTES:
            self.commit()
        return self.next_tick()

    # -- grouping ----------------------------------------------------------------

    def _ship(self, rows: ColumnsBuilder, commit: dict[str, tuple[Position, int]]) -> None:
        """Emit ``rows``, the last of each path (its index in ``commit``) with the position
        it reaches; once the spool has them, their positions are to be committed."""
        if not len(rows):
            return
        where, extra = {}, {}
        for path, (pos, i) in commit.items():
            fp = self.tailer.fingerprint(pos.path, pos.file)
            if fp is not None:
                where[path] = (pos.file.dev, pos.file.ino, pos.offset, *fp)
                extra[i] = dict(zip(_POSITION, where[path]))
        rows.add_fields(extra)  # one pass over the runs for every path (per path: N² at N files)
        cols = rows.build()
        while True:
            try:
                self.emit_columns(cols)  # returns once the spool has them: only then commit
                break
            except IntakeFull as e:  # disk full: the rows wait here, the files keep the rest
                cols = cols.cut(e.accepted, cols.n)
                if not self._holding:
                    log.warning("ranklog: the spool's disk is full; reading waits until there "
                                "is room (nothing is lost) error=%s", e)
                self._holding = True
                if self.hold(HOLD_RETRY_S):
                    raise
        if self._holding:
            log.info("ranklog: the spool takes lines again")
            self._holding = False
        for path, (pos, _) in commit.items():
            self._emitted[path] = pos
            if path in where:
                self.spooled[printable(path)] = where[path]

    def commit(self) -> None:
        """Commit the positions of everything emitted (one state file write)."""
        self._emitted_bytes, self._commit_at = 0, self.clock() + self.commit_s
        if self._emitted:
            positions, self._emitted = self._emitted, {}
            try:
                self.tailer.commit(positions)
            except StateError as e:  # the spool has the positions too: only the catch-up grows
                log.warning("ranklog: positions not saved, kept in the spool error=%s", e)

    def _group(self, p: _Pending, entries: list[list]) -> None:
        now = self.clock()
        lines, feed = p.lines, p.groups.feed
        for entry in entries:
            text = entry[2]
            lines.append(entry)
            pre = peel(visible(text), srun_labels=True)  # as traceback.split_prefix peels
            # a CRI stream: stdout and stderr lines interleave, their tracebacks apart
            ended, g, opened = feed(pre, entry, key=f"{entry[6]}\0{pre.key}" if entry[6] else None)
            if ended is not None:
                _release(ended)
            if g is None:
                continue
            entry[4] = g
            if opened:
                g.data = [now, len(text) + 1]
                continue
            g.data[0] = now
            g.data[1] += len(text) + 1
            if g.data[1] > MAX_TRACEBACK_BYTES:
                _release(p.groups.close(g.key))

    def _close_all(self, p: _Pending) -> None:
        for g in p.groups.close_all():
            _release(g)

    def _drain(self, path: str, p: _Pending, ident: tuple, rows: ColumnsBuilder,
               commit: dict[str, tuple[Position, int]]) -> None:
        """Emit the longest run of pending lines, from the first, that holds only whole,
        closed tracebacks and lines of their own; commit to its end."""
        lines, cut = p.lines, 0
        left: dict[int, int] = {}  # a group seen -> its lines still to come
        to_come = 0  # their sum: the run can end here when none are
        for i, ln in enumerate(lines):
            g = ln[4]
            if g is not None:
                if not g.closed:
                    break
                n = left.get(id(g))
                if n is None:
                    n = len(g.items)
                    to_come += n
                left[id(g)] = n - 1
                to_come -= 1
            if not to_come:
                cut = i + 1
        if not cut:
            return
        job, rank, local, fields = ident
        for ln in lines[:cut]:
            g = ln[4]
            f = {**fields, "stream": ln[6]} if ln[6] else fields
            if g is None:
                rows.row((SOURCE_RANKLOG, KIND_RANK_LINE, ln[2], ln[5], ln[3], None, None,
                          job, rank, local, None, 6, f))
            elif ln is g.items[0]:
                text = "\n".join(x[2] for x in g.items)
                dump = g.kind == STACKS
                rows.row((SOURCE_RANKLOG, KIND_RANK_STACKS if dump else KIND_RANK_TRACEBACK, fit_message(text),
                          ln[5], ln[3], None, None, job, rank, local, None, 4 if dump else 3,
                          {**f, "tool": "faulthandler"} if dump else f))
        end = lines[cut - 1][1]
        if path in self._cri:  # joined lines end out of order: commit no further than an open one starts
            j = self._joiners.get(path)
            held = [x[0] for x in lines[cut:]] + ([j[1].held_start()] if j and j[0] == p.file else [])
            end = min([max(x[1] for x in lines[:cut])] + [h for h in held if h is not None])
        commit[path] = Position(path, p.file, end), len(rows) - 1
        del lines[:cut]
        if not lines:
            del self._pending[path]


def _release(g: Group) -> None:
    """``g`` is complete: the blank lines it held are lines of their own again."""
    for entry in g.held:
        entry[4] = None
    g.held = []


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.isdigit() else None


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
    """Follows rank log files; see the module docstring. Options = ``[sources.ranklog]``."""

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
            if "ino" in f and r[i_kind] in _LINE_KINDS:
                pos = tuple(f.get(k) for k in _POSITION)
                if isinstance(f.get("path"), str) and list(map(type, pos)) == _POSITION_TYPES:
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
