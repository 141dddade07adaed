"""THE wire format between agent and collector, protocol version 1.

This docstring is the specification. The collector imports only this module from
the agent; both sides encode and decode with it, and the frozen frames in
tests/data/wire/ hold the bytes to this text. Pure: no sockets, no clocks.

Frame
    ``[length: uint32, big-endian][body: one msgpack map of length bytes]``.
    ``length`` counts the body only and is at most MAX_FRAME_BYTES (8 MiB); a
    receiver rejects a larger prefix before it reads the body. The body is one
    map with str keys, ``"type"`` naming the message. Strings are UTF-8 msgpack
    str; ints fit int64; floats are float64; no bin or ext values.

Limits (checked on encode and on decode; the msgpack Unpacker enforces the
str/array/map bounds while parsing, so nothing oversized is ever built)
    MAX_FRAME_BYTES 8 MiB     MAX_BATCH_RECORDS 10000    MAX_MAP_LEN 64 entries
    MAX_MESSAGE_BYTES 64 KiB (Record.message; longer text is cut by the agent)
    MAX_NAME_BYTES 256 (node, stream, source, kind, job, boot_id, token, agent
    name/version, error code, field keys; never empty except token)
    MAX_TEXT_BYTES 1024 (str field values, error reason)   MAX_FIELDS 32
    MAX_CONTAINERS 10064 maps and arrays in one frame body (a batch needs its columns,
    a map of fields per record and a few more): decoding stops at the next one, so a
    "msgpack bomb" (8 MiB of nested empty maps would be 8 million dicts, ~600 MB) costs
    little; its scalars take at most ~20x the frame's bytes

Session (one TCP connection, TLS optional, per agent stream)
    agent     -> hello    version:int, node:str, stream:str, token:str (may be
                          empty on loopback), agent_ns:int (agent wall clock, ns
                          since the Unix epoch), agent_name:str, agent_version:str
    collector -> welcome  version:int, high_seq:int|nil (every record of this
                          (node, stream) with seq <= high_seq is stored; nil: none),
                          collector_ns:int, max_frame_bytes:int,
                          max_batch_records:int (this session's limits, <= the above)
    agent     -> batch    node:str, stream:str (must equal the hello's),
                          count:int (1..10000), seq:int (first seq; record i has
                          seq + i) or [int] (count strictly increasing seqs),
                          cols:{column: [count values]} (below)
    collector -> ack      seq:int: every record with seq <= it is stored durably;
                          the agent may drop them from its spool
    either    -> ping     t1:int (sender clock, ns)
    other     -> pong     t1:int (echoed), t2:int (receipt), t3:int (reply), on
                          the responder's clock, ns. The pinger stamps t4 on
                          receipt; clock_offset(t1, t2, t3, t4) gives, as NTP does,
                          offset = ((t2 - t1) + (t3 - t4)) / 2 (responder minus
                          pinger, floored to whole ns) and delay = (t4 - t1) -
                          (t3 - t2) (round trip minus the responder's hold);
                          the offset is off by at most delay / 2.
                          The collector pings; the agent answers at once.
    either    -> error    code:str (ERR_*), reason:str; the sender then closes.
    After hello/welcome the agent resends from its spool every record after
    high_seq, then streams batches; seqs rise across batches of a stream.

Record (one observation; batch columns in this order, ``node``, ``stream`` and
``seq`` come from the batch header)
    node, stream, seq   origin node, agent stream id (new per spool), 0..2**63-1.
                        (node, stream, seq) is the idempotency key: a collector
                        stores a key once, ignores resends and still acks them.
    source:str          one of SOURCES (others decode too)
    kind:str            ``domain.event``, one of KINDS (others decode too)
    message:str         the text as read; a whole traceback is one record
    occurred_ns:int|nil when it happened: the line's own stamp or the kmsg time
                        converted to wall clock (ns since epoch); nil if unknown
    observed_ns:int     when the agent saw it, agent wall clock, ns since epoch
    boot_id:str|nil, mono_ns:int|nil   node boot id and monotonic ns since boot
                        (kmsg's own stamp), where the source has them, so the
                        collector can rebuild or check occurred_ns
    job:str|nil, rank:int|nil, local_rank:int|nil, pid:int|nil   identity if known
    severity:int        syslog level 0 (emerg) .. 7 (debug); 6 (info) by default
    fields:map          at most 32 str keys -> int (int64) | float | bool | nil |
                        str; units in key names (``rss_bytes``, ``xid``)
    All ints above except fields' are >= 0.

Versioning
    hello and welcome carry ``version``. A collector that does not speak the
    hello's version sends ``error`` (code ERR_VERSION, reason naming the versions
    it speaks) and closes; an agent may reconnect with an older one it speaks.
    decode raises VersionError (code ERR_VERSION) for any version but
    PROTOCOL_VERSION. Within a version changes are additive only: receivers
    ignore unknown message keys and batch columns, and new kinds, sources and
    field keys need no new version. A new message type, a new required key, or a
    changed type or meaning needs a new version.

Errors
    Every problem raises WireError (``code`` says which ERR_* to send back);
    FrameError for framing (oversize prefix, bad msgpack, non-map, missing or
    unknown type), VersionError for versions. After any of them while decoding,
    send ``error`` with that code and close the connection.

Example: ``Ack(41)`` is ``{"type": "ack", "seq": 41}``, framed as the 19 bytes
``00 00 00 0f 82 a4 74 79 70 65 a3 61 63 6b a3 73 65 71 29``. A batch body
(nil written as None):
    {"type": "batch", "node": "gpu-07", "stream": "3f2a9c", "count": 1, "seq": 812,
     "cols": {"source": ["ranklog"], "kind": ["rank.line"], "message": ["[2026-12-02
     10:11:59,782] [INFO] [logging.py:123:log_dist] [Rank 0] [Torch] Checkpoint
     global_step10 is about to be saved!"], "occurred_ns": [1796206319782000000],
     "observed_ns": [1796206319790113000], "boot_id": [None], "mono_ns": [None],
     "job": ["12345"], "rank": [0], "local_rank": [0], "pid": [24211],
     "severity": [6], "fields": [{}]}}
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from operator import attrgetter, is_
from typing import Any, Callable, ClassVar

import msgpack

PROTOCOL_VERSION = 1

MAX_FRAME_BYTES = 8 * 1024 * 1024
MAX_BATCH_RECORDS = 10_000
MAX_MESSAGE_BYTES = 64 * 1024
MAX_NAME_BYTES = 256
MAX_TEXT_BYTES = 1024
MAX_FIELDS = 32
MAX_MAP_LEN = 64
MAX_CONTAINERS = MAX_BATCH_RECORDS + 64
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

SOURCE_RANKLOG, SOURCE_KMSG, SOURCE_JOURNAL = "ranklog", "kmsg", "journal"
SOURCE_CGROUP, SOURCE_PROCS, SOURCE_NVML, SOURCE_AGENT = "cgroup", "procs", "nvml", "agent"
SOURCE_MARKS, SOURCE_STACKS, SOURCE_FLIGHTREC = "marks", "stacks", "flightrec"
SOURCES = frozenset({SOURCE_RANKLOG, SOURCE_KMSG, SOURCE_JOURNAL, SOURCE_CGROUP,
                     SOURCE_PROCS, SOURCE_NVML, SOURCE_MARKS, SOURCE_AGENT,
                     SOURCE_STACKS, SOURCE_FLIGHTREC})

KIND_RANK_LINE, KIND_RANK_TRACEBACK = "rank.line", "rank.traceback"
KIND_KERNEL_LINE, KIND_KERNEL_GAP = "kernel.line", "kernel.gap"
KIND_CGROUP_MEMORY, KIND_CGROUP_OOM = "cgroup.memory", "cgroup.oom"
KIND_GPU_XID, KIND_GPU_ECC, KIND_GPU_MEMORY = "gpu.xid", "gpu.ecc", "gpu.memory"
KIND_PROC_START, KIND_PROC_EXIT = "proc.start", "proc.exit"
KIND_JOB_MARK = "job.mark"
KIND_AGENT_STATUS, KIND_AGENT_GAP = "agent.status", "agent.gap"
# A rank's stacks at one moment: message = a py-spy dump (source stacks) or a faulthandler
# dump a rank printed (source ranklog); fields ``tool``, ``trigger``. A Flight Recorder dump
# a rank wrote: message = its compact JSON (firstfault/analysis/frdump.py ``to_message``).
KIND_RANK_STACKS, KIND_RANK_FLIGHT_RECORDER = "rank.stacks", "rank.flight_recorder"
KINDS = frozenset({KIND_RANK_LINE, KIND_RANK_TRACEBACK, KIND_KERNEL_LINE, KIND_KERNEL_GAP,
                   KIND_CGROUP_MEMORY, KIND_CGROUP_OOM, KIND_GPU_XID, KIND_GPU_ECC,
                   KIND_GPU_MEMORY, KIND_PROC_START, KIND_PROC_EXIT, KIND_JOB_MARK,
                   KIND_AGENT_STATUS, KIND_AGENT_GAP, KIND_RANK_STACKS, KIND_RANK_FLIGHT_RECORDER})

SEVERITY_NAMES = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")

ERR_VERSION = "version"  # hello's protocol version not spoken
ERR_AUTH = "auth"  # bad or missing token
ERR_MALFORMED = "malformed"  # bad msgpack, missing keys, wrong types
ERR_TOO_LARGE = "too_large"  # a frame, string or batch over a limit
ERR_PROTOCOL = "protocol"  # a valid message at the wrong time (batch before hello)
ERR_SHUTDOWN = "shutdown"  # the peer is stopping; reconnect later
ERR_INTERNAL = "internal"  # the peer failed (e.g. its store); reconnect later


class WireError(Exception):
    """Base error of the wire format; ``code`` is the ERR_* to send back."""

    def __init__(self, message: str, code: str = ERR_MALFORMED) -> None:
        super().__init__(message)
        self.code = code


class FrameError(WireError):
    """The byte stream is not a frame of a known message: close the connection."""


class VersionError(WireError):
    """A hello or welcome names a protocol version other than PROTOCOL_VERSION."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ERR_VERSION)


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One observation; see the module docstring for fields and units."""

    node: str
    stream: str
    seq: int
    source: str
    kind: str
    message: str
    occurred_ns: int | None = None
    observed_ns: int
    boot_id: str | None = None
    mono_ns: int | None = None
    job: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    severity: int = 6
    fields: dict[str, int | float | str | bool | None] = field(default_factory=dict)


# --- value checks: a predicate and the words an error message uses ------------

Check = tuple[Callable[[Any], bool], str]


def _fits(s: str, limit: int) -> bool:
    """Whether str ``s`` is at most ``limit`` UTF-8 bytes (encodes only long ones)."""
    return len(s) <= limit // 4 or (
        len(s) <= limit and len(s.encode("utf-8", "surrogatepass")) <= limit)


def _int(lo: int, hi: int, nullable: bool = False) -> Check:
    def ok(v: Any) -> bool:  # type() is int: a bool is not an int here
        return (type(v) is int and lo <= v <= hi) or (nullable and v is None)
    top = "2**63-1" if hi == _INT64_MAX else hi
    return ok, f"an int in {lo}..{top}" + (" or nil" if nullable else "")


def _str(limit: int, min_len: int = 1, nullable: bool = False) -> Check:
    def ok(v: Any) -> bool:
        return (type(v) is str and len(v) >= min_len and _fits(v, limit)) or (
            nullable and v is None)
    what = f"a {'non-empty ' if min_len else ''}str of at most {limit} UTF-8 bytes"
    return ok, what + (" or nil" if nullable else "")


_UINT, _OPT_UINT = _int(0, _INT64_MAX), _int(0, _INT64_MAX, nullable=True)
_NAME, _OPT_NAME = _str(MAX_NAME_BYTES), _str(MAX_NAME_BYTES, nullable=True)
_TEXT = _str(MAX_TEXT_BYTES, min_len=0)
_FIELD_TYPES = (int, str, float, bool, type(None))
_FIELD_TYPE_SET = frozenset(_FIELD_TYPES)


def _fields_ok(v: Any) -> bool:
    if type(v) is not dict or len(v) > MAX_FIELDS:
        return False
    for key, x in v.items():
        t = type(x)
        if (not _NAME[0](key) or t not in _FIELD_TYPES
                or (t is str and not _fits(x, MAX_TEXT_BYTES))
                or (t is int and not _INT64_MIN <= x <= _INT64_MAX)):
            return False
    return True


# The batch columns, in wire order; Record has the same names.
_COLUMNS: tuple[tuple[str, Check], ...] = (
    ("source", _NAME), ("kind", _NAME), ("message", _str(MAX_MESSAGE_BYTES, min_len=0)),
    ("occurred_ns", _OPT_UINT), ("observed_ns", _UINT), ("boot_id", _OPT_NAME),
    ("mono_ns", _OPT_UINT), ("job", _OPT_NAME), ("rank", _OPT_UINT),
    ("local_rank", _OPT_UINT), ("pid", _OPT_UINT),
    ("severity", (_int(0, 7)[0], "an int in 0..7 (syslog level)")),
    ("fields", (_fields_ok, f"a map of at most {MAX_FIELDS} names to int64, float, "
                f"bool, nil or str (at most {MAX_TEXT_BYTES} bytes)")),
)
_COLUMN_NAMES = tuple(name for name, _ in _COLUMNS)
COLUMNS = _COLUMN_NAMES  # a record's batch columns, in wire order
_NONE = type(None)


def _fast_ints(lo: int, hi: int, nullable: bool) -> Callable[[list], bool]:
    allowed = {int, _NONE} if nullable else {int}

    def ok(col: list) -> bool:
        types = set(map(type, col))  # type() is int: a bool is not an int here
        if types == {int}:
            return lo <= min(col) and max(col) <= hi
        if not types <= allowed:
            return False
        vals = set(col)
        vals.discard(None)
        return not vals or (lo <= min(vals) and max(vals) <= hi)
    return ok


def _fast_names(nullable: bool) -> Callable[[list], bool]:
    allowed = {str, _NONE} if nullable else {str}

    def ok(col: list) -> bool:
        try:
            vals = set(col)  # few distinct values: source, kind, job, boot_id
        except TypeError:  # an unhashable value: a list or a map
            return False
        # a str or None equals no value of another type, so the distinct values show
        # every type the column holds
        if not set(map(type, vals)) <= allowed:
            return False
        vals.discard(None)
        return all(v and _fits(v, MAX_NAME_BYTES) for v in vals)
    return ok


def _fast_message(col: list) -> bool:
    return set(map(type, col)) == {str} and max(map(len, col)) <= MAX_MESSAGE_BYTES // 4


def _fast_fields(col: list) -> bool:
    if set(map(type, col)) != {dict}:
        return False
    if not any(col):
        return True  # all empty
    if max(map(len, col)) > MAX_FIELDS or not all(map(_NAME[0], set(chain.from_iterable(col)))):
        return False
    values = list(chain.from_iterable(map(dict.values, col)))
    types = set(map(type, values))
    if not types <= _FIELD_TYPE_SET:
        return False
    kinds = list(map(type, values)) if len(types) > 1 else None
    if int in types:
        ints = values if kinds is None else list(compress(values, map(is_, kinds, repeat(int))))
        if min(ints) < _INT64_MIN or max(ints) > _INT64_MAX:
            return False
    if str not in types:
        return True
    strs = values if kinds is None else compress(values, map(is_, kinds, repeat(str)))
    return max(map(len, strs)) <= MAX_TEXT_BYTES // 4


# Whole-column checks through C builtins (~0.3 µs a record instead of ~3): each is
# True only if every value passes its _COLUMNS check, and may be False when they all
# do (a long message); on False the per-value check runs and names the bad value.
_FAST_CHECKS: dict[str, Callable[[list], bool]] = {
    "source": _fast_names(False), "kind": _fast_names(False), "message": _fast_message,
    "occurred_ns": _fast_ints(0, _INT64_MAX, True), "observed_ns": _fast_ints(0, _INT64_MAX, False),
    "boot_id": _fast_names(True), "mono_ns": _fast_ints(0, _INT64_MAX, True),
    "job": _fast_names(True), "rank": _fast_ints(0, _INT64_MAX, True),
    "local_rank": _fast_ints(0, _INT64_MAX, True), "pid": _fast_ints(0, _INT64_MAX, True),
    "severity": _fast_ints(0, 7, False), "fields": _fast_fields,
}
assert tuple(_FAST_CHECKS) == _COLUMN_NAMES
_CHECKS = dict(_COLUMNS)
_record_row = attrgetter(*_COLUMN_NAMES)
_MISSING = object()


def _show(v: Any) -> str:
    """A short description of a bad value for an error message."""
    text = repr(v)
    return f"{type(v).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _get(m: dict, key: str, check: Check, where: str) -> Any:
    v = m.get(key, _MISSING)
    if v is _MISSING:
        raise WireError(f"{where}: missing key {key!r}")
    if not check[0](v):
        raise WireError(f"{where}.{key}: expected {check[1]}, got {_show(v)}")
    return v


# --- messages ------------------------------------------------------------------

class _Message:
    """Wire map = ``{"type": TYPE}`` plus the dataclass fields, each checked."""

    __slots__ = ()
    TYPE: ClassVar[str]
    CHECKS: ClassVar[dict[str, Check]]  # field -> check, in wire order

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {"type": self.TYPE}
        for key, (ok, what) in self.CHECKS.items():
            v = m[key] = getattr(self, key)
            if not ok(v):
                raise WireError(f"{self.TYPE}.{key}: expected {what}, got {_show(v)}")
        return m

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Any:
        values = {}
        for key, check in cls.CHECKS.items():  # version first: nothing else is known
            values[key] = _get(m, key, check, cls.TYPE)
            if key == "version" and values[key] != PROTOCOL_VERSION:
                raise VersionError(f"{cls.TYPE}: protocol version {values[key]} is not "
                                   f"supported; this peer speaks {PROTOCOL_VERSION}")
        return cls(**values)


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(_Message):
    TYPE: ClassVar[str] = "hello"
    CHECKS: ClassVar[dict[str, Check]] = {
        "version": _UINT, "node": _NAME, "stream": _NAME,
        "token": _str(MAX_NAME_BYTES, min_len=0), "agent_ns": _UINT,
        "agent_name": _NAME, "agent_version": _NAME}
    version: int = PROTOCOL_VERSION
    node: str
    stream: str
    token: str
    agent_ns: int
    agent_name: str
    agent_version: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome(_Message):
    TYPE: ClassVar[str] = "welcome"
    CHECKS: ClassVar[dict[str, Check]] = {
        "version": _UINT, "high_seq": _OPT_UINT, "collector_ns": _UINT,
        "max_frame_bytes": _int(1, MAX_FRAME_BYTES),
        "max_batch_records": _int(1, MAX_BATCH_RECORDS)}
    version: int = PROTOCOL_VERSION
    high_seq: int | None
    collector_ns: int
    max_frame_bytes: int = MAX_FRAME_BYTES
    max_batch_records: int = MAX_BATCH_RECORDS


@dataclass(frozen=True, slots=True)
class Ack(_Message):
    TYPE: ClassVar[str] = "ack"
    CHECKS: ClassVar[dict[str, Check]] = {"seq": _UINT}
    seq: int


@dataclass(frozen=True, slots=True)
class Ping(_Message):
    TYPE: ClassVar[str] = "ping"
    CHECKS: ClassVar[dict[str, Check]] = {"t1": _UINT}
    t1: int


@dataclass(frozen=True, slots=True)
class Pong(_Message):
    TYPE: ClassVar[str] = "pong"
    CHECKS: ClassVar[dict[str, Check]] = {"t1": _UINT, "t2": _UINT, "t3": _UINT}
    t1: int
    t2: int
    t3: int


@dataclass(frozen=True, slots=True)
class Error(_Message):
    """The ``error`` message (not an exception): why the sender is closing."""

    TYPE: ClassVar[str] = "error"
    CHECKS: ClassVar[dict[str, Check]] = {"code": _NAME, "reason": _TEXT}
    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class Batch:
    """Records of one (node, stream), sent as columns (module docstring)."""

    TYPE: ClassVar[str] = "batch"
    records: tuple[Record, ...]

    def to_wire(self) -> dict[str, Any]:
        recs = self.records
        if not recs:
            raise WireError("batch: a batch needs at least one record")
        node, stream = recs[0].node, recs[0].stream
        if any(r.node != node or r.stream != stream for r in recs):
            raise WireError("batch: all records of a batch must share node and stream")
        seqs = [r.seq for r in recs]
        contiguous = (all(map(_UINT[0], seqs)) and seqs[-1] - seqs[0] == len(seqs) - 1
                      and _increasing(seqs))
        cols = dict(zip(_COLUMN_NAMES, map(list, zip(*map(_record_row, recs)))))
        m = {"type": "batch", "node": node, "stream": stream, "count": len(recs),
             "seq": seqs[0] if contiguous else seqs, "cols": cols}
        _check_batch(m)  # the receiver's checks, so a bad record fails at its source
        return m

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Batch:
        node, stream, seqs, columns = _check_batch(m)
        return cls(tuple(
            Record(node=node, stream=stream, seq=s, source=src, kind=kind, message=msg,
                   occurred_ns=occ, observed_ns=obs, boot_id=boot, mono_ns=mono, job=job,
                   rank=rank, local_rank=lrank, pid=pid, severity=sev, fields=flds)
            for s, src, kind, msg, occ, obs, boot, mono, job, rank, lrank, pid, sev, flds
            in zip(seqs, *columns)))


@dataclass(frozen=True, slots=True)
class BatchColumns:
    """A ``batch`` checked exactly as Batch is, kept as columns: the collector's fast
    path (building a Record costs several µs, more than storing its row).

    ``seqs`` is a range (contiguous seqs) or a list; ``cols`` maps every column of
    the module docstring, in wire order, to its ``len(seqs)`` values (unknown
    columns are dropped).
    """

    TYPE: ClassVar[str] = "batch"
    node: str
    stream: str
    seqs: range | list[int]
    cols: dict[str, list[Any]]

    def __len__(self) -> int:
        return len(self.seqs)

    @classmethod
    def from_wire(cls, m: dict[str, Any], packed: dict[str, bytes] | None = None) -> BatchColumns:
        """``packed``: each column's bytes as received (see PackedColumns), when known."""
        node, stream, seqs, columns = _check_batch(m)
        cols = dict(zip(_COLUMN_NAMES, columns)) if packed is None else PackedColumns(
            zip(_COLUMN_NAMES, columns))
        if packed is not None:
            cols.packed = [packed[name] for name in _COLUMN_NAMES]
        return cls(node, stream, seqs, cols)

    def records(self) -> list[Record]:
        node, stream = self.node, self.stream
        return [Record(node=node, stream=stream, seq=s, source=src, kind=kind, message=msg,
                       occurred_ns=occ, observed_ns=obs, boot_id=boot, mono_ns=mono,
                       job=job, rank=rank, local_rank=lrank, pid=pid, severity=sev,
                       fields=flds)
                for s, src, kind, msg, occ, obs, boot, mono, job, rank, lrank, pid, sev,
                flds in zip(self.seqs, *self.cols.values())]


class PackedColumns(dict):
    """A batch's columns (name -> values, as BatchColumns.cols) that also keeps
    ``packed``: each column's msgpack bytes exactly as the frame carried them (array
    header and values; COLUMNS order), so a store can keep them without packing the
    values again (firstfault/collector/store/blocks.py). The values were checked."""

    __slots__ = ("packed",)
    packed: list[bytes]


_COUNT = _int(1, MAX_BATCH_RECORDS)
_SEQ: Check = (lambda v: _UINT[0](v) or type(v) is list, "an int in 0..2**63-1 or a list")
_MAP: Check = (lambda v: type(v) is dict, "a map")


def _check_batch(m: dict[str, Any]) -> tuple[str, str, Any, list[list[Any]]]:
    """(node, stream, seqs, columns in _COLUMNS order) of a valid batch map."""
    node, stream = _get(m, "node", _NAME, "batch"), _get(m, "stream", _NAME, "batch")
    n = _get(m, "count", _COUNT, "batch")
    seq = _get(m, "seq", _SEQ, "batch")
    if type(seq) is int:
        if seq + n - 1 > _INT64_MAX:
            raise WireError(f"batch.seq: {seq} + count {n} passes 2**63-1")
        seqs: Any = range(seq, seq + n)
    elif len(seq) != n or not all(map(_UINT[0], seq)) or not _increasing(seq):
        raise WireError(f"batch.seq: expected {n} strictly increasing ints in "
                        f"0..2**63-1, got {_show(seq)}")
    else:
        seqs = seq
    cols = _get(m, "cols", _MAP, "batch")
    columns = []
    for name in _COLUMN_NAMES:
        col = cols.get(name)
        if type(col) is not list or len(col) != n:
            raise WireError(f"batch column {name!r}: expected a list of {n} values, "
                            f"got {_show(col)}")
        check_column(name, col)
        columns.append(col)
    return node, stream, seqs, columns


def check_column(name: str, col: list | tuple) -> None:
    """WireError naming the first value of batch column ``name`` it does not allow."""
    if not _FAST_CHECKS[name](col):
        ok, what = _CHECKS[name]
        if not all(map(ok, col)):
            i = next(i for i, v in enumerate(col) if not ok(v))
            raise WireError(f"batch record {i} column {name!r}: expected {what}, "
                            f"got {_show(col[i])}")


def _increasing(seqs: list[int]) -> bool:
    return all(a < b for a, b in zip(seqs, seqs[1:]))


Message = Hello | Welcome | Batch | Ack | Ping | Pong | Error
_TYPES: dict[str, Any] = {c.TYPE: c for c in (Hello, Welcome, Batch, Ack, Ping, Pong, Error)}


# --- frames --------------------------------------------------------------------

FRAME_PREFIX = struct.Struct(">I")  # a frame's body length


def encode_message(msg: Message) -> bytes:
    """One whole frame (length prefix + msgpack map) for ``msg``; WireError if invalid."""
    wire = msg.to_wire()
    try:
        body = msgpack.packb(wire)
    except (TypeError, ValueError, OverflowError) as e:  # lone surrogates, huge ints
        raise WireError(f"{msg.TYPE}: cannot encode: {e}") from e
    if len(body) > MAX_FRAME_BYTES:
        raise WireError(f"{msg.TYPE}: frame of {len(body)} bytes exceeds MAX_FRAME_BYTES "
                        f"({MAX_FRAME_BYTES}); send fewer records per batch", ERR_TOO_LARGE)
    return FRAME_PREFIX.pack(len(body)) + body


def decode_message(m: Any, *, batch_columns: bool = False,
                   packed: dict[str, bytes] | None = None) -> Message | BatchColumns:
    """The message for one decoded frame body (a map with a ``type``); with
    ``batch_columns`` a batch comes as BatchColumns instead of Batch (its columns a
    PackedColumns when ``packed`` has every column's bytes: wiredecode.py)."""
    if type(m) is not dict:
        raise FrameError(f"frame body must be a map, got {_show(m)}")
    if "type" not in m:
        raise FrameError("frame body has no 'type'")
    cls = _TYPES.get(m["type"]) if type(m["type"]) is str else None
    if cls is None:
        raise FrameError(f"unknown message type {_show(m['type'])}; this peer knows "
                         f"{', '.join(_TYPES)} (protocol {PROTOCOL_VERSION})")
    if batch_columns and cls is Batch:
        whole = packed is not None and all(name in packed for name in _COLUMN_NAMES)
        return BatchColumns.from_wire(m, packed if whole else None)
    return cls.from_wire(m)


def encode_batch(records: list[Record] | tuple[Record, ...]) -> bytes:
    """One framed ``batch`` message carrying ``records`` (one node and stream)."""
    return encode_message(Batch(tuple(records)))


def encode_packed_columns(node: str, stream: str, seqs: range | list[int],
                          columns: list[bytes]) -> bytes:
    """One framed ``batch`` message (the agent's shipper) from each column's values
    already packed back to back (``columns[i]``: the msgpack of column i's len(seqs)
    values, no array header): the spool's entries hold them so, checked when they
    were appended, so only the frame is checked here."""
    n = len(seqs)
    if not n or len(columns) != len(_COLUMN_NAMES):
        raise WireError(f"batch: {n} records and {len(columns)} columns")
    seq = seqs.start if type(seqs) is range else list(seqs)
    head = msgpack.packb({"type": "batch", "node": node, "stream": stream, "count": n, "seq": seq})
    array = array_header(n)
    parts = [b"\x86", head[1:], _COLS_KEY]  # head is a map of 5: one more key, "cols"
    for key, col in zip(_PACKED_NAMES, columns):
        parts += (key, array, col)
    body = b"".join(parts)
    if len(body) > MAX_FRAME_BYTES:
        raise WireError(f"batch: frame of {len(body)} bytes exceeds MAX_FRAME_BYTES "
                        f"({MAX_FRAME_BYTES}); send fewer records per batch", ERR_TOO_LARGE)
    return FRAME_PREFIX.pack(len(body)) + body


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` values."""
    return (bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16
            else b"\xdd" + n.to_bytes(4, "big"))


_COLS_KEY = msgpack.packb("cols") + bytes([0x80 | len(_COLUMN_NAMES)])
_PACKED_NAMES = tuple(map(msgpack.packb, _COLUMN_NAMES))


def clock_offset(t1: int, t2: int, t3: int, t4: int) -> tuple[int, int]:
    """(offset_ns, delay_ns) of a ping/pong: responder clock minus pinger clock."""
    return ((t2 - t1) + (t3 - t4)) // 2, (t4 - t1) - (t3 - t2)
