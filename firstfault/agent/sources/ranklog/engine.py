"""The ranklog source's engine, without threads or inotify: the Tailer's batches of lines ->
wire rows in the spool, tracebacks and stack dumps grouped (the analysis' assembly machine),
a CRI log's partial records joined, positions committed once the spool has the rows. The
behaviour is specified in the package docstring (firstfault/agent/sources/ranklog/)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from firstfault.agent.sources.base import Emit, IntakeFull, emit_columns, emit_many, printable
from firstfault.agent.sources.ranklog.identity import PathIdentity
from firstfault.agent.spool.columns import ColumnsBuilder, as_text
from firstfault.agent.tail import (
    ERROR,
    LOST,
    STATE_RESET,
    TRUNCATED,
    FileChange,
    LineBatch,
    Position,
    StateError,
    Tailer,
    cut_line,
)
from firstfault.analysis.assembly import RANK_LOG, STACKS, Assembly, Group
from firstfault.analysis.prefixes import peel
from firstfault.analysis.stacks import DUMP_MARK
from firstfault.analysis.traceback import may_open, visible
from firstfault.common.crilog import CriJoiner
from firstfault.wire import (
    KIND_RANK_LINE,
    KIND_RANK_STACKS,
    KIND_RANK_TRACEBACK,
    MAX_MESSAGE_BYTES,
    SOURCE_RANKLOG,
)

log = logging.getLogger("firstfault.agent.sources.ranklog")

KIND_RANK_GAP = "rank.gap"  # not (yet) in wire.KINDS; new kinds decode as-is
GAP_EVENTS = (LOST, TRUNCATED, ERROR, STATE_RESET)
MAX_TRACEBACK_BYTES = 4 * MAX_MESSAGE_BYTES  # a traceback held longer is shipped as it is
COMMIT_S = 0.25  # positions are committed at most this often while lines flow...
COMMIT_BYTES = 1 << 20  # ...or once this many bytes of lines were read since the last
HOLD_RETRY_S = 0.5  # the spool's disk full: rows offered again this often
_DUMP_MARK = DUMP_MARK.encode()
LINE_KINDS = (KIND_RANK_LINE, KIND_RANK_TRACEBACK, KIND_RANK_STACKS)
# ``watch(identity, lines, observed_ns)``: told of every line, once a wake per job (bytes
# joined by newlines; the identity of the job's first file in the wake, observed_ns of the
# wake's first chunk), in the ranklog thread (the stacks source's trigger: it must return at once)
Watch = Callable[[tuple, bytes, int], None]
POSITION = ("dev", "ino", "end_offset", "fp_len", "fp")  # Tailer.advance's arguments
POSITION_TYPES = [int, int, int, int, str]


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


def _plain(batches: list[LineBatch]) -> tuple[bytes, bool]:
    """(the chunks' lines joined by newlines, whether decode_lines would keep every chunk's
    bytes and mark none): one check for a wake instead of one a chunk. Exact: the
    needles hold no newline, and chunks of complete UTF-8 joined by newlines are UTF-8."""
    whole = b"\n".join([b.text for b in batches])
    if may_open(whole) or _DUMP_MARK in whole:
        return whole, False
    if whole.isascii():
        return whole, True
    try:
        whole.decode()
    except UnicodeDecodeError:
        return whole, False
    return whole, True


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
        """``watch``: told of every line, once a wake per job (the stacks source's trigger); ``hold(seconds)``
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
        self.paths = PathIdentity(tailer.fields, job_label, pod_owner)
        self._pending: dict[str, _Pending] = {}
        self._joiners: dict[str, list] = {}  # CRI path -> [file, CriJoiner, stop of its last batch]
        self._emitted: dict[str, Position] = {}  # emitted, not yet committed
        self._printed: dict[str, str] = {}  # path -> printable(path), the key of ``spooled``
        self._emitted_bytes, self._commit_at = 0, self.clock() + commit_s

    def identity(self, path: str) -> tuple:
        """(job, rank, local_rank, fields) of a path (identity.PathIdentity)."""
        return self.paths.of(path)

    # -- what the FollowLoop hands over --------------------------------------------

    def batches(self, batches: list[LineBatch]) -> None:
        rows = ColumnsBuilder()
        commit: dict[str, tuple[Position, int]] = {}
        whole, plain = _plain(batches)
        told: dict | None = {} if self.watch is not None else None  # job -> [first ident, texts]
        for b in batches:
            self._emitted_bytes += b.stop - b.start
            ident = self.identity(b.path)
            if told is not None:
                t = told.get(ident[0])
                if t is None:
                    told[ident[0]] = [ident, [b.text]]
                else:
                    t[1].append(b.text)
            if b.path in self.paths.cri:
                self._cri_batch(b, ident, rows, commit)
                continue
            p = self._pending.get(b.path)
            if p is not None and p.file != b.file:  # rotated or truncated: its tracebacks end
                self._close_all(p)
                self._drain(b.path, p, ident, rows, commit)
                p = self._pending.get(b.path)
            if plain and p is None:  # decode_lines of this chunk: its bytes, nothing marked
                rows.lines(b.data, b.observed_ns, *ident, joined=b.text)
                commit[b.path] = b.position, len(rows) - 1
                continue
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
        if told:  # once a wake per job (the watchers look for their needles in all of it)
            at = batches[0].observed_ns
            for ident, texts in told.values():
                self.watch(ident, whole if len(texts) == len(batches) else b"\n".join(texts), at)
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
        if self._pending:  # (most wakes hold no line back: nothing to build)
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
        if not self._pending:
            return self._commit_at if self._emitted else None
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
                extra[i] = dict(zip(POSITION, where[path]))
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
                name = self._printed.get(path)
                if name is None:
                    if len(self._printed) >= 4096:
                        self._printed.clear()
                    name = self._printed[path] = printable(path)
                self.spooled[name] = where[path]

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
        if path in self.paths.cri:  # joined lines end out of order: commit no further than an open one starts
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
