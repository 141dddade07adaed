"""Scan one log stream fast: only lines that can matter become Events.

Input is the stream's bytes in chunks (the caller does the reading); output is
an Event for every line that holds one of the catalog's needles (reads.py says
which), and one Event per assembled traceback or stack dump (assembly.py: the
machine the agent's ranklog runs too, here with the grammars that keep frames).
Most lines of a training log (progress, info) hold no needle; an Aho-Corasick
automaton over whole chunks finds the few that do, so Python touches only those
lines (bench/analyze.py measures the rate).

Time of a line without a timestamp of its own (a traceback, a gloo error): it
happened after the nearest earlier timestamped line of the stream and before
the nearest later one. ``fields["after_ns"]``/``fields["before_ns"]`` keep
those bounds; the timeline turns them into an occurred time and uncertainty. An
Event is made whole: one that waits for its later bound is held (and the Events
after it with it, to keep their order) until the stamp comes or the stream ends.

Invariants: bytes are decoded as UTF-8 with invalid bytes replaced; a line
longer than MAX_LINE_BYTES is cut with a marker; memory stays bounded by the
chunk size plus open tracebacks (traceback.MAX_LINES each) plus MAX_WAITING
held Events.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timezone, tzinfo

import ahocorasick_rs

from firstfault.analysis import traceback as tb
from firstfault.analysis.assembly import READER, TRACEBACK, Assembly, Group
from firstfault.analysis.events import KIND_LINE, KIND_STACK, KIND_STREAM, KIND_TRACEBACK, Event
from firstfault.analysis.parse import Stamp, parse_nccl_origin, parse_stamp, strip_prefixes
from firstfault.analysis.prefixes import Peeled

MAX_LINE_BYTES = 64 * 1024
_WINDOW = 16 * 1024  # how far back/forward to look for a neighbouring timestamp
MAX_WAITING = 100_000  # events held for a later timestamp; past it the oldest goes on with its earlier bound alone
PROGRESS_WINDOW = 64 * 1024  # how far back last_progress looks for a needle at a time
MAX_PREFIXES = 64  # launcher prefixes whose last progress line is kept in a stretch of a mixed stream
# a line that starts with a launcher prefix: ranks interleave in the stream (a launcher's console)
_PREFIXED = re.compile(rb"(?m)^(?: {0,5}\d{1,5}: )?\[(?:rank\d+|[A-Za-z_][\w.-]{0,62}?\d+)\]:")
OPENING_NEEDLES = ("Traceback (most recent call last)", "╭", 'File "', "│",  # tracebacks and fragments
                "Process ", " (most recent call first):", " (idle)", " (active)", " (active+gil)")  # stack dumps

_STAMPED = re.compile(
    rb"(?m)^(?:\s*\d+: )?(?:\[[A-Za-z_][\w.-]*?\d+\]:[ ]?)*"
    rb"(?:\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ |\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d|\[[A-Z]+\|[^\]]+\] \d{4}-)"
)


@dataclass(slots=True)
class StreamInfo:
    """What the caller knows about a stream before reading it."""

    stream: str  # a name for it: the file path, or node/stream
    source: str = "ranklog"
    node: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    job: str | None = None
    year: int = 1970
    tz: tzinfo = timezone.utc
    srun_labels: bool = False
    observed_ns: int | None = None  # when the stream was last written (file mtime)
    fields: dict = field(default_factory=dict)




class Needles:
    """The literal strings that make a line worth a look, as one automaton.

    Progress needles (``progress``: the ones only progress lines hold) are not in the automaton:
    progress comes on nearly every step, often on every rank, and only the last progress line
    before each other hit says something (the latest progress of a rank, the step a rank had
    reached when it failed). ``last_progress`` finds those with a few backward searches.
    """

    def __init__(self, needles: Sequence[str], progress: Sequence[str] = (),
                 progress_patterns: Sequence[str] = (), others: Sequence[str] | None = None) -> None:
        """``others``: the needles of lines read as something else than progress (the catalog's other
        signatures); None: every needle but ``progress``."""
        prog = set(progress) - set(OPENING_NEEDLES)
        words = sorted((set(needles) | set(OPENING_NEEDLES)) - prog)
        self.words = tuple(sorted(set(words) | prog))
        self.progress = tuple(w.encode() for w in sorted(prog))
        self._progress_rx = tuple(re.compile(p) for p in progress_patterns)
        other = set(words) if others is None else set(others) | set(OPENING_NEEDLES)
        self._other = tuple(w in other for w in words)  # by the automaton's word index
        # A DFA: the fastest of the library's automata on lines that hold no needle,
        # which are nearly all lines (bench/analyze.py).
        self._ac = ahocorasick_rs.BytesAhoCorasick(
            [w.encode() for w in words], implementation=ahocorasick_rs.Implementation.DFA
        )

    def positions(self, data: bytes) -> list[int]:
        return [start for _, start, _ in self._ac.find_matches_as_indexes(data)]

    def holds_progress(self, data: bytes) -> bool:
        return any(w in data for w in self.progress)

    def _progress_text(self, line: bytes) -> tuple[str, bool]:
        """(launcher prefix, whether the line is a progress line) of one line."""
        prefix, text = tb.split_prefix(line.decode("utf-8", "replace"))
        return prefix, any(rx.search(text) for rx in self._progress_rx)

    def is_progress(self, data: bytes, start: int) -> bool:
        """Whether the line that begins at ``start`` is read as a progress line: it is one, and holds
        no needle of another reading (an error printed on a bar's line, with no newline between)."""
        stop = data.find(b"\n", start)
        line = data[start:stop if stop >= 0 else len(data)]
        return (self.holds_progress(line) and self._progress_text(line)[1]
                and not any(self._other[i] for i, _, _ in self._ac.find_matches_as_indexes(line)))

    def last_progress(self, data: bytes, lo: int, hi: int, mixed: bool) -> list[int]:
        """Line starts of the last progress line that begins in data[lo:hi]; when ``mixed`` (ranks
        interleave in the stream), the last of each launcher prefix (at most MAX_PREFIXES)."""
        out: list[int] = []
        seen: set[str] = set()
        end = hi
        # Per needle: its last place found (-1: none) in data[floor:end], ``floor`` being how far down
        # it was searched. A needle is searched a window at a time, further down only while it could
        # beat the others' places, and again only once ``end`` passes its place: linear in the range
        # (not once a line), and a needle absent from a long stretch costs a window, not the stretch.
        last = dict.fromkeys(self.progress, -1)
        floor = dict.fromkeys(self.progress, hi)
        while end > lo:
            p = -1
            for w in self.progress:
                if last[w] >= end:  # passed: its place below ``end`` is not known yet
                    last[w], floor[w] = -1, end
                p = max(p, last[w])
            while todo := [w for w in self.progress if last[w] < 0 and floor[w] > max(lo, p + 1)]:
                for w in todo:  # a window each, in turns: one found bounds the others' search
                    a = max(lo, p + 1, floor[w] - PROGRESS_WINDOW)
                    last[w] = data.rfind(w, a, min(end, floor[w] + len(w) - 1))  # one across the floor too
                    floor[w] = a
                    p = max(p, last[w])
            if p < 0:
                break
            start = data.rfind(b"\n", 0, p) + 1
            if start < lo:
                break
            stop = data.find(b"\n", p)
            prefix, progress = self._progress_text(data[start:stop if stop >= 0 else len(data)])
            if prefix not in seen and progress:
                seen.add(prefix)
                out.append(start)
                if not mixed or len(seen) >= MAX_PREFIXES:
                    break
            end = start
        return out


class _Draft:
    """An Event being built: its constructor's arguments, until the Event is settled.

    An Event without a timestamp waits for the stream's next one (``before_ns``)
    and a traceback or stack dump for its last line; the scanner builds the frozen
    Event only then, so nothing changes an Event after it was made."""

    __slots__ = ("args", "fields", "waiting")

    def __init__(self, args: dict, fields: dict) -> None:
        self.args = args
        self.fields = fields
        self.waiting = False  # for a later timestamp (in _Scanner.pending)

    def event(self) -> Event:
        return Event(**self.args, fields=self.fields)


class _Scanner:
    def __init__(self, info: StreamInfo, needles: Needles) -> None:
        self.info = info
        self.needles = needles
        self.groups = Assembly(READER)  # open tracebacks and dumps, by launcher prefix (the agent's machine)
        self._last_stamp: Stamp | None = None  # the last timestamp read before the current position
        self._unread: tuple[bytes, int, int] | None = None  # (body, floor, pos): a stretch after it, not read yet
        self.lineno = 0  # lines before the start of the current body
        self.pending: list[_Draft] = []  # events waiting for a later timestamp (before_ns)
        self.ready: deque[_Draft] = deque()  # events in the order they are yielded, once none waits
        self.first_ns: int | None = None  # the stream's first timestamp
        self.mixed: bool | None = None  # ranks interleave in this stream (decided on its first lines)
        self.labels: set[str] = set()  # word labels (srun tasks, pdsh hosts) seen leading known lines

    # -- time ---------------------------------------------------------------
    def _stamp_of(self, text: str) -> Stamp | None:
        return parse_stamp(text, year=self.info.year, tz=self.info.tz)

    def _peeled_stamp(self, pre: Peeled) -> Stamp | None:
        """The line's own timestamp, else the one a collector or syslog put in front of it."""
        return self._stamp_of(pre.text) or (self._stamp_of(pre.stamp) if pre.stamp else None)

    def _stamp_at(self, body: bytes, start: int) -> Stamp | None:
        end = body.find(b"\n", start)
        line = body[start : end if end >= 0 else len(body)].decode("utf-8", "replace")
        return self._peeled_stamp(strip_prefixes(line, srun_labels=self.info.srun_labels, labels=self.labels))

    @property
    def last_stamp(self) -> Stamp | None:
        """The last timestamp before the current position."""
        self._read_unread()
        return self._last_stamp

    @last_stamp.setter
    def last_stamp(self, st: Stamp) -> None:
        self._unread = None  # a later stamp: the stretch before it no longer matters
        self._last_stamp = st

    def _stamp_before(self, body: bytes, pos: int, floor: int) -> None:
        """Note that body[floor:pos] (pos a line start) was passed over. Its last timestamp is read
        when last_stamp is asked for: the next hit line mostly has a stamp of its own, which makes it
        moot (a DeepSpeed log's per-step lines)."""
        self._read_unread()  # the stretch before: this one may hold no stamp to replace its
        self._unread = (body, floor, pos)

    def _read_unread(self) -> None:
        if self._unread is not None:
            body, floor, pos = self._unread
            self._unread = None
            self._read_stamp_before(body, pos, floor)

    def _read_stamp_before(self, body: bytes, pos: int, floor: int) -> None:
        """Update last_stamp with the last timestamped line in body[floor:pos] (pos a line start).

        Every stamp _STAMPED knows holds a colon, so only lines with one are tried, found
        backwards with rfind: the lines between two hits are read at memchr speed, not
        by a regex at every byte (bench/analyze.py)."""
        end = pos
        while end > floor:
            colon = body.rfind(b":", floor, end)
            if colon < 0:
                return
            start = body.rfind(b"\n", 0, colon) + 1
            if start < floor:
                return
            if _STAMPED.match(body, start, pos) and (st := self._stamp_at(body, start)):
                self._last_stamp = st
                return
            end = start  # no stamp, or one that is no date: the line before may hold one

    def _settle_pending(self, body: bytes, pos: int) -> None:
        """Give waiting events the first timestamp at or after pos as upper bound."""
        if not self.pending:
            return
        m = _STAMPED.search(body, pos, pos + _WINDOW)
        if m:
            st = self._stamp_at(body, m.start())
            if st:
                self._close_pending(st)

    def _close_pending(self, st: Stamp) -> None:
        for d in self.pending:
            d.fields["before_ns"] = st.ns
            d.waiting = False
        self.pending.clear()

    def _flush(self) -> Iterator[Event]:
        """The queued events up to the first that still waits for a timestamp, in order."""
        while self.ready and (not self.ready[0].waiting or len(self.ready) > MAX_WAITING):
            d = self.ready.popleft()
            if d.waiting:  # too many wait: this one goes on with its earlier bound alone
                d.waiting = False
                self.pending.remove(d)
            yield d.event()

    # -- events -------------------------------------------------------------
    def _event(self, pre: Peeled, text: str, lineno: int, kind: str = KIND_LINE, pid: int | None = None) -> _Draft:
        info = self.info
        args = dict(
            text=text,
            source=info.source,
            kind=kind,
            node=info.node or pre.node,
            rank=pre.rank if pre.rank is not None else info.rank,
            local_rank=pre.local_rank if pre.local_rank is not None else info.local_rank,
            pid=pid,
            job=info.job,
            observed_ns=info.observed_ns,
            origin=f"{info.stream}:{lineno}",
            stream=info.stream,
            seq=lineno,
        )
        fields: dict = {}
        if pre.prose:
            fields["prose"] = True
        if pre.rank is not None:
            fields["rank_from"] = "line prefix"
        elif info.rank is not None:
            fields["rank_from"] = "the file it was read from"
        d = _Draft(args, fields)
        st = self._stamp_of(text) or (self._stamp_of(pre.stamp) if pre.stamp else None)
        if st:
            args.update(occurred_ns=st.ns, clock="line", uncertainty_ns=st.uncertainty_ns, level=st.level)
            self._close_pending(st)
            self.last_stamp = st
        else:
            if self.last_stamp:
                fields["after_ns"] = self.last_stamp.ns
            d.waiting = True
            self.pending.append(d)
        nccl = parse_nccl_origin(text)
        if nccl:
            args["pid"] = pid or nccl.pid
            args["node"] = args["node"] or nccl.host
        return d

    def _finish(self, group: Group) -> None:
        """Queue a traceback or stack dump that ended, whole."""
        d = group.data
        res = group.grouping.result()
        d.args.update(text=res.text, frames=res.frames, exc_type=res.exc_type)
        d.fields["message"] = res.message
        if getattr(res, "fragment", False):  # pasted from a traceback's middle: its outer frames are not here
            d.fields["fragment"] = True
        self.ready.append(d)

    def _line(self, raw: bytes, lineno: int, hit: bool) -> None:
        """Handle one line: a needle hit, or any line while a traceback is open; a traceback escaped into
        one string of the line (traceback.escaped_lines) line by line, each behind the line's own prefixes."""
        if len(raw) > MAX_LINE_BYTES:
            raw = raw[:MAX_LINE_BYTES] + b" [line cut by firstfault]"
        if tb.ESCAPED_HEADER_B in raw:
            first, *rest = tb.escaped_lines(raw.decode("utf-8", "replace"))
            lead = self._one_line(first.encode(), lineno, hit).peeled
            for piece in rest:
                self._one_line((lead + piece).encode(), lineno, True)
            return
        self._one_line(raw, lineno, hit)

    def _one_line(self, raw: bytes, lineno: int, hit: bool) -> Peeled:
        line = tb.visible(raw.decode("utf-8", "replace"))  # what a reader sees: no \r redraws, no colours
        pre = strip_prefixes(line, srun_labels=self.info.srun_labels, labels=self.labels)
        self.labels.update(pre.labels)
        # tracebacks are followed per key (who printed the line), by the agent's machine
        ended, group, opened = self.groups.feed(pre)
        if ended is not None:
            self._finish(ended)
        if opened and group is not None:
            if group.kind == TRACEBACK:
                group.data = self._event(pre, pre.text[group.at:], lineno, KIND_TRACEBACK)
            else:
                group.data = self._event(pre, pre.text, lineno, KIND_STACK, group.grouping.pid)
            return pre
        if group is not None:
            return pre
        if hit or self.needles.positions(raw) or self.needles.holds_progress(raw):
            self.ready.append(self._event(pre, pre.text, lineno))
            return pre
        st = self._peeled_stamp(pre)
        if st:
            self._close_pending(st)
            self.last_stamp = st
        return pre

    def _superseded(self, body: bytes, lo: int, end: int) -> bool:
        """Whether the last progress line in body[lo:end] says nothing the line at ``end`` does not:
        that line is itself a progress line of the one rank an unmixed stream holds (a step that
        prints two, as DeepSpeed's engine and throughput lines), and no bar lies between, whose
        run the analysis keeps beside the latest (findings._keep)."""
        return (not self.mixed and end < len(body) and self.needles.is_progress(body, end)
                and body.find(b"%|", lo, end) < 0)

    def body(self, body: bytes) -> Iterator[Event]:
        """Handle whole lines (body ends with a newline)."""
        if self.first_ns is None:
            m = _STAMPED.search(body, 0, 4 * _WINDOW)
            st = self._stamp_at(body, m.start()) if m else None
            self.first_ns = st.ns if st else None
        hits = self.needles.positions(body)
        if self.needles.progress:
            if self.mixed is None:
                self.mixed = self.info.srun_labels or _PREFIXED.search(body, 0, 4 * _WINDOW) is not None
            # up to the line of each hit, not into it: that line is read as a hit, so the progress line
            # to add is the last one above it (a bar the same line's error was printed after, no newline)
            ends = [body.rfind(b"\n", 0, h) + 1 for h in hits] + [len(body)]
            picks = [p for a, b in zip([0, *hits], ends) if a < b and not self._superseded(body, a, b)
                     for p in self.needles.last_progress(body, a, b, self.mixed)]
            if picks:
                hits = sorted(hits + picks)
        n = len(body)
        pos = 0  # everything before pos has been handled
        lineno = self.lineno  # lines before pos
        hi = 0
        while pos < n:
            hit = not self.groups.open
            if hit:
                while hi < len(hits) and hits[hi] < pos:
                    hi += 1
                if hi == len(hits):
                    self._settle_pending(body, pos)
                    self._stamp_before(body, n, pos)
                    lineno += body.count(b"\n", pos)
                    break
                start = body.rfind(b"\n", pos, hits[hi]) + 1
                if start < pos:
                    start = pos
                self._settle_pending(body, pos)
                self._stamp_before(body, start, pos)
                lineno += body.count(b"\n", pos, start)
                pos = start
            end = body.find(b"\n", pos)
            if end < 0:
                end = n
            lineno += 1
            self._line(body[pos:end], lineno, hit)
            yield from self._flush()
            pos = end + 1
        self.lineno = lineno
        yield from self._flush()

    def end(self) -> Iterator[Event]:
        for group in self.groups.close_all():
            self._finish(group)
        for d in self.pending:  # after the stream's last stamp: the file's last write bounds them too
            if self.info.observed_ns is not None and d.fields.get("after_ns") is not None:
                d.fields.setdefault("before_ns", self.info.observed_ns)
            d.waiting = False
        self.pending.clear()  # with no stamp at all they get no occurred time: an mtime alone says nothing
        yield from self._flush()
        info = self.info
        yield Event(
            text="", source=info.source, kind=KIND_STREAM, node=info.node, rank=info.rank,
            local_rank=info.local_rank, job=info.job, observed_ns=info.observed_ns, stream=info.stream,
            origin=info.stream, seq=self.lineno,
            fields={"first_ns": self.first_ns, "last_ns": self.last_stamp.ns if self.last_stamp else None,
                    "lines": self.lineno},
        )


def scan_stream(chunks: Iterable[bytes], info: StreamInfo, needles: Needles) -> Iterator[Event]:
    """Events of one stream: lines holding a needle, and whole tracebacks.

    ``chunks`` are consecutive pieces of the stream (any sizes). Events come in
    stream order, except that a traceback is yielded when it ends; an Event without a
    timestamp (and those after it) once the stream's next timestamp bounds it.
    """
    sc = _Scanner(info, needles)
    carry = b""
    for chunk in chunks:
        buf = carry + chunk if carry else chunk
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf if len(buf) <= MAX_LINE_BYTES else buf[:MAX_LINE_BYTES]
            continue
        carry = buf[cut + 1 :]
        yield from sc.body(buf[: cut + 1])
    if carry:
        yield from sc.body(carry + b"\n")
    yield from sc.end()
