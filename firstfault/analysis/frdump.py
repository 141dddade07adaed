"""Read PyTorch Flight Recorder dumps: pickle or JSON bytes -> FRDump. Pure.

With ``TORCH_FR_BUFFER_SIZE`` (older: ``TORCH_NCCL_TRACE_BUFFER_SIZE``) set, every
process group records its last collectives in a ring buffer; NCCL writes it to
``<TORCH_FR_DUMP_TEMP_FILE><rank>`` on a watchdog timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``;
prefix also ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, default
``~/.cache/torch/comm_lib_trace_rank_``), and ``torch._C._distributed_c10d._dump_fr_trace()``
/ ``_dump_fr_trace_json()`` return it on demand. PyTorch 2.13 records gloo's CPU
collectives too (tests/data/flight_recorder holds real dumps written here). A dump,
as torch 2.13 writes it (pickle protocol 2; the JSON form has the same keys, lists for
tuples, 0 for missing times and strings for the status numbers)::

    {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
     "pg_status": {"0": {"last_enqueued_collective": 3, "last_started_collective": -1,
                         "last_completed_collective": 2}},
     "entries": [{"record_id": 2, "pg_id": 0, "process_group": ("0", "default_pg"),
                  "collective_seq_id": 3, "p2p_seq_id": 0, "op_id": 3,
                  "profiling_name": "gloo:all_reduce", "input_sizes": [[4]], "input_dtypes": ["Float"],
                  "output_sizes": [[4]], "output_dtypes": ["Float"], "state": "scheduled",
                  "retired": False, "is_p2p": False, "time_created_ns": 1796278284543627348,
                  "frames": [{"name": "all_reduce", "filename": ".../distributed_c10d.py", "line": 3245}, ...]}]}

The pickle is read by a restricted unpickler that never imports or calls anything: its
opcodes are first checked against PLAIN_OPCODES (those that build dict, list, tuple,
str, bytes, numbers, bool, None), so a pickle naming any global (``os.system``, a class
to rebuild, an EXT code) is refused with FRFormatError before anything is built (the
extension-code check matters: CPython's unpickler takes a cached extension without
asking ``find_class``); the unpickler's ``find_class`` and ``persistent_load`` refuse
everything as a second wall, and the result is checked to be plain data. ``pg_config`` ranks are
read as a list of ints, never evaluated. Known issue: gloo's dumps leave ``pg_config``
empty (name "", ranks "[]"): group membership then comes from the entries
(firstfault/analysis/flight_recorder.py).

``to_message``/``from_message``: the compact JSON an agent ships in a
``rank.flight_recorder`` record (at most MAX_MESSAGE_BYTES: the newest entries that
fit, ``entries_total`` says how many there were).
"""

from __future__ import annotations

import json
import pickle
import pickletools
import re
from dataclasses import dataclass, field

from firstfault.wire import MAX_MESSAGE_BYTES

MAX_DUMP_BYTES = 256 << 20  # a dump larger than this is refused unread
MAX_FRAMES = 8  # frames kept per entry (innermost first, as torch writes them)
MAX_DEPTH = 32
_RANKS = re.compile(r"\[\s*(?:\d+\s*(?:,\s*\d+\s*)*)?\]")
_PLAIN = (str, int, float, bool, type(None), bytes)
# The opcodes that build plain data (every protocol); any other (GLOBAL, STACK_GLOBAL,
# EXT1/2/4, REDUCE, BUILD, INST, OBJ, NEWOBJ*, PERSID, BINPERSID, NEXT_BUFFER, sets,
# bytearrays) refuses the whole pickle before it is unpickled.
PLAIN_OPCODES = frozenset("""PROTO FRAME STOP MARK POP POP_MARK DUP PUT BINPUT LONG_BINPUT MEMOIZE GET BINGET
    LONG_BINGET INT BININT BININT1 BININT2 LONG LONG1 LONG4 NONE NEWTRUE NEWFALSE FLOAT BINFLOAT STRING
    BINSTRING SHORT_BINSTRING UNICODE BINUNICODE SHORT_BINUNICODE BINUNICODE8 BINBYTES SHORT_BINBYTES
    BINBYTES8 EMPTY_LIST APPEND APPENDS LIST EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_DICT DICT
    SETITEM SETITEMS""".split())


class FRFormatError(ValueError):
    """Not a Flight Recorder dump we can read safely (or not one at all)."""


@dataclass(frozen=True, slots=True)
class FRFrame:
    file: str
    line: int
    func: str


@dataclass(frozen=True, slots=True)
class Entry:
    """One recorded collective (or point-to-point op) of one rank."""

    pg: str  # the process group's name (``process_group[0]``)
    desc: str  # its description (``default_pg``, a user's ``group_desc``)
    seq: int  # collective_seq_id: the n-th collective of this group on this rank
    p2p_seq: int
    op: str  # profiling_name, e.g. "nccl:all_reduce", "gloo:broadcast"
    record_id: int
    state: str  # scheduled | started | completed
    retired: bool  # the work finished (done or failed)
    is_p2p: bool
    input_sizes: tuple = ()
    output_sizes: tuple = ()
    input_dtypes: tuple = ()
    output_dtypes: tuple = ()
    created_ns: int | None = None
    frames: tuple[FRFrame, ...] = ()

    @property
    def op_name(self) -> str:
        """The op without its backend: ``all_reduce``."""
        return self.op.split(":", 1)[-1]

    @property
    def finished(self) -> bool:
        return self.retired or self.state == "completed"


@dataclass(slots=True)
class FRDump:
    version: str
    entries: list[Entry]
    groups: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # name -> (desc, ranks)
    status: dict[str, dict[str, int]] = field(default_factory=dict)  # pg name -> last_* collective ids
    entries_total: int = 0  # in the dump as written (entries may hold only the newest)
    fmt: str = "pickle"  # pickle | json


class _Reader:
    """The file interface an Unpickler reads from, over bytes in memory."""

    def __init__(self, data: bytes) -> None:
        self._data, self._pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._pos + n
        out, self._pos = self._data[self._pos:end], min(end, len(self._data))
        return out

    def readline(self) -> bytes:
        end = self._data.find(b"\n", self._pos)
        return self.read(-1 if end < 0 else end + 1 - self._pos)


class _Refusing(pickle.Unpickler):
    """An unpickler that can build nothing but plain containers and scalars."""

    def find_class(self, module: str, name: str):  # GLOBAL, STACK_GLOBAL, EXT*
        raise FRFormatError(f"refused: the pickle names {module}.{name}; a Flight Recorder dump "
                            "holds plain data only")

    def persistent_load(self, pid):
        raise FRFormatError("refused: the pickle holds a persistent id")


def load_plain_pickle(data: bytes):
    """The object in ``data``, built from plain containers only; FRFormatError otherwise."""
    if len(data) > MAX_DUMP_BYTES:
        raise FRFormatError(f"{len(data)} bytes: larger than {MAX_DUMP_BYTES}")
    try:
        for op, arg, pos in pickletools.genops(data):
            if op.name not in PLAIN_OPCODES:
                what = f" {arg}" if isinstance(arg, str) and op.name == "GLOBAL" else ""
                raise FRFormatError(f"refused: opcode {op.name}{what} at byte {pos}; a Flight Recorder "
                                    "dump holds plain data only")
            if op.name == "STOP":
                break
        obj = _Refusing(_Reader(data), buffers=()).load()
    except FRFormatError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, KeyError,
            IndexError, RecursionError, MemoryError, OverflowError, UnicodeDecodeError) as e:
        raise FRFormatError(f"not a readable pickle: {type(e).__name__}: {e}") from None
    _check_plain(obj, 0)
    return obj


def _check_plain(obj, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise FRFormatError("nested too deep")
    if isinstance(obj, _PLAIN) and type(obj) in _PLAIN:
        return
    if type(obj) in (list, tuple):
        for x in obj:
            _check_plain(x, depth + 1)
    elif type(obj) is dict:
        for k, v in obj.items():
            _check_plain(k, depth + 1)
            _check_plain(v, depth + 1)
    else:
        raise FRFormatError(f"refused: the pickle built a {type(obj).__name__}")


def parse_dump(data: bytes) -> FRDump:
    """A dump file's bytes (pickle or JSON) -> FRDump; FRFormatError if it is none."""
    head = data[:1]
    if head == b"\x80":
        return _from_doc(load_plain_pickle(data), "pickle")
    if data.lstrip()[:1] == b"{":
        if len(data) > MAX_DUMP_BYTES:
            raise FRFormatError(f"{len(data)} bytes: larger than {MAX_DUMP_BYTES}")
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise FRFormatError(f"not JSON: {e}") from None
        return _from_doc(doc, "json")
    raise FRFormatError("neither a pickle nor JSON")


def looks_like_dump(head: bytes) -> bool:
    """A cheap test on a file's first bytes: a pickle of a dict, or JSON naming FR keys."""
    if head[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"):
        return b"entries" in head or b"version" in head or b"pg_config" in head
    return head.lstrip()[:1] == b"{" and b'"entries"' in head and (b'"pg_config"' in head or b'"version"' in head)


def _int(v, default: int | None = None) -> int | None:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
        return int(v)
    return default


def _str(v) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v if isinstance(v, str) else "" if v is None else str(v)


def _sizes(v) -> tuple:
    if not isinstance(v, (list, tuple)):
        return ()
    return tuple(tuple(x for x in s if isinstance(x, int) and not isinstance(x, bool))
                 if isinstance(s, (list, tuple)) else () for s in v)


def _frames(v) -> tuple[FRFrame, ...]:
    out = []
    for f in v if isinstance(v, (list, tuple)) else ():
        if isinstance(f, dict):
            out.append(FRFrame(_str(f.get("filename") or f.get("file")), _int(f.get("line"), 0),
                               _str(f.get("name") or f.get("func"))))
        if len(out) >= MAX_FRAMES:
            break
    return tuple(out)


def _entry(e: dict) -> Entry | None:
    if not isinstance(e, dict):
        return None
    pg = e.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:  # torch: (name, desc)
        name, desc = _str(pg[0]), _str(pg[1]) if len(pg) > 1 else ""
    else:  # ours (to_message): pg, desc
        name, desc = _str(e.get("pg", e.get("pg_id"))), _str(e.get("desc"))
    seq = _int(e.get("collective_seq_id", e.get("seq")))
    if seq is None:
        return None
    created = _int(e.get("time_created_ns", e.get("created_ns")))
    return Entry(pg=name, desc=desc, seq=seq,
                 p2p_seq=_int(e.get("p2p_seq_id", e.get("p2p_seq")), 0),
                 op=_str(e.get("profiling_name", e.get("op"))), record_id=_int(e.get("record_id"), 0),
                 state=_str(e.get("state")), retired=bool(e.get("retired")), is_p2p=bool(e.get("is_p2p")),
                 input_sizes=_sizes(e.get("input_sizes")), output_sizes=_sizes(e.get("output_sizes")),
                 input_dtypes=tuple(_str(x) for x in e.get("input_dtypes") or () if isinstance(x, str)),
                 output_dtypes=tuple(_str(x) for x in e.get("output_dtypes") or () if isinstance(x, str)),
                 created_ns=created or None, frames=_frames(e.get("frames")))


def parse_ranks(text) -> tuple[int, ...]:
    """``"[0, 1, 2]"`` (how pg_config writes a group's ranks) -> (0, 1, 2); () if not that."""
    if isinstance(text, (list, tuple)):
        return tuple(x for x in text if isinstance(x, int) and not isinstance(x, bool))
    if isinstance(text, str) and _RANKS.fullmatch(text.strip()):
        return tuple(int(x) for x in re.findall(r"\d+", text))
    return ()


def _from_doc(doc, fmt: str) -> FRDump:
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), (list, tuple)):
        raise FRFormatError("no 'entries' list: not a Flight Recorder dump")
    raw = doc["entries"]
    entries = [x for x in (_entry(e) for e in raw) if x is not None]
    entries.sort(key=lambda x: x.record_id)
    groups: dict[str, tuple[str, tuple[int, ...]]] = {}
    cfg = doc.get("pg_config") if isinstance(doc.get("pg_config"), dict) else {}
    for key, g in cfg.items():
        if isinstance(g, dict):
            name = _str(g.get("name") or key)
            ranks = parse_ranks(g.get("ranks"))
            if name or ranks:
                groups[name] = (_str(g.get("desc")), ranks)
    ids = {}  # pg_id -> pg name, from the entries (pg_status is keyed by pg_id)
    for e in raw:
        if isinstance(e, dict) and (ent := _entry(e)) is not None:
            ids.setdefault(_str(e.get("pg_id", ent.pg)), ent.pg)
    status: dict[str, dict[str, int]] = {}
    st = doc.get("pg_status") if isinstance(doc.get("pg_status"), dict) else {}
    for pg_id, s in st.items():
        if isinstance(s, dict):
            status[ids.get(_str(pg_id), _str(pg_id))] = {
                k.removesuffix("_collective"): v for k in ("last_enqueued_collective", "last_started_collective",
                                                           "last_completed_collective")
                if (v := _int(s.get(k))) is not None}
    total = _int(doc.get("entries_total"), len(raw))
    return FRDump(version=_str(doc.get("version")), entries=entries, groups=groups, status=status,
                  entries_total=total, fmt=_str(doc.get("format")) or fmt)


# --- the compact form an agent ships --------------------------------------------------

def _entry_doc(e: Entry, frames: bool) -> dict:
    d = {"pg": e.pg, "desc": e.desc, "seq": e.seq, "p2p_seq": e.p2p_seq, "op": e.op,
         "record_id": e.record_id, "state": e.state, "retired": e.retired, "is_p2p": e.is_p2p,
         "input_sizes": e.input_sizes, "output_sizes": e.output_sizes,
         "input_dtypes": e.input_dtypes, "output_dtypes": e.output_dtypes, "created_ns": e.created_ns}
    if frames and e.frames:
        d["frames"] = [{"file": f.file, "line": f.line, "func": f.func} for f in e.frames]
    return d


def to_message(dump: FRDump, limit: int = MAX_MESSAGE_BYTES) -> str:
    """The dump as compact JSON of at most ``limit`` UTF-8 bytes: the newest entries that
    fit, with their frames when all of them fit so, else without frames."""
    head = {"format": dump.fmt, "version": dump.version, "entries_total": dump.entries_total,
            "pg_config": {n: {"name": n, "desc": d, "ranks": list(r)} for n, (d, r) in dump.groups.items()},
            "pg_status": {n: {f"{k}_collective": v for k, v in s.items()} for n, s in dump.status.items()}}
    empty = json.dumps({**head, "entries": []}, separators=(",", ":"))
    docs = _newest(dump.entries, True, limit - len(empty.encode()))
    if len(docs) < len(dump.entries):
        docs = _newest(dump.entries, False, limit - len(empty.encode()))
    return empty[:-2] + ",".join(docs) + "]}"


def _newest(entries: list[Entry], frames: bool, room: int) -> list[str]:
    """JSON texts of the newest entries whose total (with separators) fits ``room`` bytes."""
    docs: list[str] = []
    for e in reversed(entries):
        text = json.dumps(_entry_doc(e, frames), separators=(",", ":"))
        room -= len(text.encode()) + 1
        if room < 0:
            break
        docs.append(text)
    return docs[::-1]


def from_message(text: str) -> FRDump:
    """A shipped ``rank.flight_recorder`` message -> FRDump; FRFormatError if unreadable."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise FRFormatError(f"not JSON: {e}") from None
    if isinstance(doc, dict):  # pg_status here is keyed by pg name already
        doc = dict(doc)
        st = doc.pop("pg_status", {})
        dump = _from_doc(doc, "json")
        if isinstance(st, dict):
            dump.status = {_str(n): {k.removesuffix("_collective"): v for k, v0 in s.items()
                                     if (v := _int(v0)) is not None} for n, s in st.items() if isinstance(s, dict)}
        return dump
    raise FRFormatError("not a JSON object")
