"""What a report reads: the one predicate the scanner and the collector's store share. Pure.

A report (report.py over scan.py's or records.py's Events) looks at a line only when
it holds a needle (``Reads.words``: the catalog's, the context's, the memory view's,
and the lines that open a traceback or stack dump, scan.OPENING_NEEDLES); of the
progress lines (signatures with the trait "progress": DeepSpeed's and the training
loop's own), whose needles are ``Reads.progress``, it keeps only the latest of each
(stream, rank). ``reads_of(catalog)`` says it once; ``scan_needles`` is the offline
scanner's automaton for it, and ``ReportMarker`` the same rule over the records a
collector stores: at insert the store asks ``ReportMarker.mark`` which records of a
block (one agent stream and one job, in (time, seq) order:
firstfault/collector/store/blocks.py) a report reads, and keeps them aside;
``firstfault report`` then reads only those (store.base.needed_records).

What is marked, for the report to be the one all records give:
    * every record that is not a ``ranklog`` ``rank.line`` (tracebacks, kernel
      lines, exits, gaps, samples);
    * every rank line holding a needle other than the progress-only needles
      (those of the progress signature that no other signature, context or
      traceback rule has), or holding one with no rank or no occurred time;
    * of the other rank lines holding a progress-only needle, per (fields
      ``path``, rank), the latest in block order whose text the catalog matches
      as progress (findings keeps the latest by occurred time, later in order on
      ties: within a block that is the last; across blocks it reads them all);
    * the block's last record: the report notes which nodes sent records of the
      job (query.py), and a block keeps its last record longest (prune drops the
      oldest first);
    * the last record of each rank in the block: the report knows every rank that
      logged, and its node, even one that printed nothing but plain lines;
    * of DeepSpeed's throughput lines (``MemAllocated=``, memory.timer_figure) with a
      pid and an occurred time, per (``path``, pid, second of that time: memory.BUCKET_NS),
      the block's last memory.LAST_PER_BUCKET and those no later one of the block equals
      or beats in memory (the block's seen.Staircase): the memory view keeps the
      staircase of each (stream, pid, second) of all blocks, which is made of the
      blocks' (prune drops a block's oldest records first, and the staircase of what
      stays is made of the one that was). Every other
      line holding ``MemAllocated=`` is marked, as is one without pid or time (its time or
      pid then comes from the text) or of several lines.

``name`` changes whenever what would be marked changes (the needles, the
progress patterns, memory.BUCKET_NS and LAST_PER_BUCKET, MARKS_VERSION): the store
reads blocks marked under another name in full. Cost: one Aho-Corasick pass over the
block's text (without the progress needles, which most lines hold), a few catalog
matches per block, and a regex match per throughput line (bench/store.py).
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, count, repeat
from operator import add, and_, eq, is_not, not_
from typing import Any

import ahocorasick_rs

from firstfault.analysis.catalog import Catalog
from firstfault.analysis.context import NEEDLES as CONTEXT_NEEDLES
from firstfault.analysis.memlines import NEEDLES as MEMORY_NEEDLES
from firstfault.analysis.memory import BUCKET_NS, LAST_PER_BUCKET, TIMER, TIMER_NEEDLE, timer_key_of
from firstfault.analysis.records import rank_text
from firstfault.analysis.scan import OPENING_NEEDLES, Needles

MARKS_VERSION = 3  # bump when the rules above change
_SEP = "\x00"  # between messages in one scan; no needle holds it, so no hit spans two


@dataclass(frozen=True, slots=True)
class Reads:
    """What a report reads of a stream's lines (the module's doc)."""

    words: tuple[str, ...]  # sorted: a line holding one is read (one of ``progress`` alone: see there)
    progress: tuple[str, ...]  # sorted: needles only progress lines hold; the latest such line is read
    progress_patterns: tuple[str, ...]  # what makes a line holding one a progress line (the catalog's)


def needles(catalog: Catalog) -> list[str]:
    """Every literal string of the catalog, the context and the memory view that makes a line worth reading."""
    return [n for s in catalog.signatures for n in s.needles] + list(CONTEXT_NEEDLES) + list(MEMORY_NEEDLES)


def _other_needles(catalog: Catalog) -> set[str]:
    """The needles of the signatures other than progress."""
    return {n for s in catalog.signatures if "progress" not in s.traits for n in s.needles}


def progress_needles(catalog: Catalog) -> list[str]:
    """The needles only progress lines hold (no other signature's, no context's)."""
    others = _other_needles(catalog) | set(CONTEXT_NEEDLES)
    return sorted({n for s in catalog.signatures if "progress" in s.traits for n in s.needles} - others)


def reads_of(catalog: Catalog) -> Reads:
    """What a report read with ``catalog`` reads."""
    progress = set(progress_needles(catalog)) - set(OPENING_NEEDLES)
    return Reads(words=tuple(sorted(set(needles(catalog)) | set(OPENING_NEEDLES))), progress=tuple(sorted(progress)),
                 progress_patterns=tuple(p.pattern for s in catalog.signatures if "progress" in s.traits
                                         for p in s.patterns))


def scan_needles(catalog: Catalog) -> Needles:
    """The scanner's needles for ``catalog``, progress lines told apart (scan.Needles)."""
    r = reads_of(catalog)
    return Needles(r.words, r.progress, r.progress_patterns, sorted(_other_needles(catalog)))


class ReportMarker:
    """The store's marker (store.base.Marker): the records of a block a report read with ``catalog``
    reads (``reads_of``)."""

    def __init__(self, catalog: Catalog) -> None:
        reads = reads_of(catalog)
        words = reads.words
        self._latest = reads.progress
        rare = [w for w in words if w not in self._latest and w != TIMER_NEEDLE]  # throughput lines: _mark_timers
        if any(_SEP in w for w in words):
            raise ValueError("a needle holds NUL: the marker can not scan joined messages")
        self._ac = ahocorasick_rs.BytesAhoCorasick(
            [w.encode() for w in rare], implementation=ahocorasick_rs.Implementation.DFA
        ) if rare else None
        self._catalog = catalog
        self._timer_keys: dict[tuple[str, str], int] = {}  # throughput lines' figures -> memory.timer_key
        spec = [MARKS_VERSION, rare, self._latest, list(reads.progress_patterns), TIMER_NEEDLE,
                BUCKET_NS, LAST_PER_BUCKET]
        self.name = "report-" + hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:16]

    def mark(self, *, source: Sequence[str], kind: Sequence[str], message: Sequence[str],
             occurred_ns: Sequence[int | None], rank: Sequence[int | None],
             fields: Sequence[dict], order: Sequence[int] | None = None,
             pid: Sequence[int | None] | None = None) -> list[int]:
        """The indices (ascending) of a block's records that a report needs. The
        block's records are the columns' values at ``order`` (indices, in block
        order), or all of them, in order, when it is None; others are never chosen.
        Without ``pid`` every throughput line is marked."""
        n = len(message)
        pos: Sequence[int] = range(n) if order is None else order
        if not len(pos):
            return []
        uniform = set(source) == {"ranklog"} and set(kind) == {"rank.line"}
        plain = [True] * n if uniform else list(map(
            and_, map(eq, source, repeat("ranklog")), map(eq, kind, repeat("rank.line"))))
        need = set() if uniform else set(compress(pos, map(not_, at(plain, pos))))
        need.add(pos[-1])
        last = dict(zip(at(rank, pos), pos))
        last.pop(None, None)
        need.update(last.values())
        joined = _SEP.join(message)
        hits = self._hits(message, joined)
        need.update(hits if order is None or not hits else hits.intersection(pos))
        if self._latest:
            self._mark_latest(need, plain, message, occurred_ns, rank, fields, pos)
        if TIMER_NEEDLE in joined:
            self._mark_timers(need, plain, message, occurred_ns, fields, _found(message, pos), pid)
        return sorted(need)

    def _mark_timers(self, need: set[int], plain: list[bool], message: Sequence[str], occurred: Sequence[int | None],
                     fields: Sequence[dict], found: list[int], pid: Sequence[int | None] | None) -> None:
        """Mark the lines holding TIMER_NEEDLE (``found``: their indices, in block order) that the
        memory view may keep (the module's doc)."""
        top: dict[tuple, list[int]] = {}  # (path, pid, second) -> [later lines, their highest key]
        keys = self._timer_keys
        if len(keys) > 10_000:
            keys.clear()
        for i in reversed(found):
            text = message[i]
            t = occurred[i]
            p = None if pid is None else pid[i]
            # the Event's text is the message less its launcher prefixes (records.rank_text), which
            # hold no "/global_step=": the memory view's TIMER finds the same figures in the message
            m = TIMER.search(text) if plain[i] and "\n" not in text else None
            if m is None or t is None or p is None:
                need.add(i)
                continue
            figs = m.group("ma", "max")
            key = keys.get(figs)
            if key is None:
                key = keys[figs] = timer_key_of(*figs)
            group = ((fields[i] or {}).get("path") or None, p, t // BUCKET_NS)
            seen = top.get(group)
            if seen is None:
                top[group] = [1, key]
                need.add(i)
                continue
            if seen[0] < LAST_PER_BUCKET or key > seen[1]:
                need.add(i)
            seen[0] += 1
            seen[1] = max(seen[1], key)

    def _hits(self, message: Sequence[str], joined: str) -> set[int]:
        """Indices of the messages (``joined``: them joined by _SEP) holding a needle other than
        the progress-only ones."""
        if self._ac is None or not message:
            return set()
        blob = joined.encode()
        positions = [start for _, start, _ in self._ac.find_matches_as_indexes(blob)]
        if not positions:
            return set()
        sizes = map(len, message)
        if len(blob) != sum(map(len, message)) + len(message) - 1:  # not all ASCII
            sizes = map(len, map(str.encode, message))
        ends = list(map(add, accumulate(sizes), count(1)))  # ends[i]: past message i and its NUL
        return {bisect_right(ends, p) for p in positions}

    def _mark_latest(self, need: set[int], plain: list[bool], message: Sequence[str],
                     occurred: Sequence[int | None], rank: Sequence[int | None],
                     fields: Sequence[dict], pos: Sequence[int]) -> None:
        """Mark the latest progress line of each (path, rank), the block's last first."""
        paths = _paths(fields) if any(fields) else [None] * len(message)
        ranks = set(compress(at(rank, pos), at(plain, pos)))
        ranks.discard(None)
        one = set(at(paths, pos))
        if len(one) == 1:  # one file (or none): a key per rank, no tuple per record
            path = one.pop()
            keys = {(path, r) for r in ranks}
        else:
            keys = set(compress(zip(at(paths, pos), at(rank, pos)), at(plain, pos)))
            keys = {k for k in keys if k[1] is not None}
        done: set[tuple] = set()
        latest = self._latest
        for i in reversed(pos):
            key = (paths[i], rank[i])
            if key in done or i in need or not plain[i]:
                continue  # (a line read anyway may be a key's latest: an earlier one is kept too)
            text = message[i]
            if not any(w in text for w in latest):
                continue
            if key[1] is None or occurred[i] is None:
                need.add(i)  # its rank or time comes from the text: the report reads it
                continue
            m = self._catalog.match(rank_text(text)[1])
            if m is None:
                continue  # holds the needle, is no progress line: nothing to a report
            need.add(i)
            if "progress" in m.signature.traits:
                done.add(key)
                if len(done) == len(keys):
                    break


def _paths(fields: Sequence[dict | None]) -> list[Any]:
    """Each record's ``path`` field, None where it has none or an empty one."""
    try:
        paths = list(map(dict.get, fields, repeat("path")))  # C-level: no step per record
    except TypeError:  # a record without a map of fields
        return [f.get("path") or None if f else None for f in fields]
    if all(compress(paths, map(is_not, paths, repeat(None)))):
        return paths
    return [p or None for p in paths]  # an empty path: none


def _found(message: Sequence[str], pos: Sequence[int]) -> list[int]:
    """The indices of the messages holding TIMER_NEEDLE, in the block order of ``pos``."""
    out = [i for i, m in enumerate(message) if TIMER_NEEDLE in m]
    if type(pos) is range:
        return out
    rank_of = {i: k for k, i in enumerate(pos)}
    return sorted((i for i in out if i in rank_of), key=rank_of.__getitem__)


def at(column: Sequence[Any], pos: Sequence[int]) -> Iterable[Any]:
    """The column's values at ``pos`` (a range: all of it, in order)."""
    return column if type(pos) is range else map(column.__getitem__, pos)
