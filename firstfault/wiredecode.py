"""Frames in, messages out: decoding what a peer sent, bounded (firstfault/wire.py is the spec).

The ingest port reads untrusted bytes, so every limit of the spec is enforced while
decoding, not after: strings, arrays and maps by msgpack's own limits
(``_UNPACK_LIMITS``), the maps and arrays of a whole body by MAX_CONTAINERS (a msgpack
bomb stops early), a frame's length before its body is buffered. ``FrameDecoder`` turns a
byte stream into messages; with ``batch_columns`` a batch keeps each column's bytes
(wire.PackedColumns) for a store that keeps them as they came.
"""

from __future__ import annotations

from typing import Any, Iterator

import msgpack

from firstfault.wire import (
    ERR_MALFORMED,
    ERR_TOO_LARGE,
    FRAME_PREFIX,
    MAX_BATCH_RECORDS,
    MAX_CONTAINERS,
    MAX_FRAME_BYTES,
    MAX_MAP_LEN,
    MAX_MESSAGE_BYTES,
    Batch,
    BatchColumns,
    FrameError,
    Message,
    Record,
    decode_message,
)

_UNPACK_LIMITS = dict(raw=False, strict_map_key=True, max_str_len=MAX_MESSAGE_BYTES,
                      max_bin_len=0, max_ext_len=0, max_array_len=MAX_BATCH_RECORDS,
                      max_map_len=MAX_MAP_LEN)


class _TooManyContainers(ValueError):
    pass


def _counted() -> dict[str, Any]:
    """The hooks that count every map and array as it is built and stop past MAX_CONTAINERS."""
    left = MAX_CONTAINERS

    def count(x: Any) -> Any:
        nonlocal left
        left -= 1
        if left < 0:
            raise _TooManyContainers(f"more than {MAX_CONTAINERS} maps and arrays exceeds max_containers")
        return x
    return dict(object_hook=count, list_hook=count)


def _unpack(body: bytes | bytearray) -> Any:
    try:
        return msgpack.unpackb(body, **_counted(), **_UNPACK_LIMITS)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        # Oversized str/array/map ("N exceeds max_str_len(M)"), bad UTF-8,
        # truncation, trailing bytes, nesting too deep.
        code = ERR_TOO_LARGE if "exceeds max_" in str(e) else ERR_MALFORMED
        raise FrameError(f"malformed frame body ({len(body)} bytes): {e}", code) from e


def _unpack_columns(body: bytes) -> tuple[Any, dict[str, bytes] | None]:
    """(_unpack(body), the bytes of each value of its ``cols`` map) for a body that is
    a map holding a ``cols`` map; anything else, or anything wrong, goes to _unpack
    (which says what is wrong) with None for the bytes. Same values, same limits
    (MAX_CONTAINERS too: a bomb in a column stops as early)."""
    u = msgpack.Unpacker(**_counted(), **_UNPACK_LIMITS)
    u.feed(body)
    m: dict[str, Any] = {}
    packed: dict[str, bytes] = {}
    try:
        for _ in range(_map_header(u)):
            key = _map_key(u)
            if key != "cols":
                m[key] = u.unpack()
                continue
            cols = {}
            for _ in range(_map_header(u)):
                name = _map_key(u)
                start = u.tell()
                cols[name] = u.unpack()
                packed[name] = body[start:u.tell()]
            m[key] = cols
        if u.tell() != len(body):
            raise ValueError
    except (ValueError, TypeError, msgpack.UnpackException):
        return _unpack(body), None
    return m, packed


def _map_header(u: msgpack.Unpacker) -> int:
    n = u.read_map_header()
    if n > MAX_MAP_LEN:
        raise ValueError(f"a map of {n} entries")
    return n


def _map_key(u: msgpack.Unpacker) -> str:
    key = u.unpack()
    if type(key) is not str:
        raise ValueError("a map key that is not a str")
    return key


class FrameDecoder:
    """Turns a byte stream into messages; after any WireError, close the stream.

    ``for msg in decoder.feed(chunk): ...`` buffers ``chunk`` at once and yields
    every message it completes, in order; a length prefix over
    ``max_frame_bytes`` raises FrameError before its body is buffered. With
    ``batch_columns`` batches come as BatchColumns (no Record objects built).
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES, *,
                 batch_columns: bool = False) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.batch_columns = batch_columns
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes buffered that do not yet make a whole frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> Iterator[Message]:
        self._buf += data
        self._check_prefix()  # reject an oversize prefix even if never iterated
        return self._messages()

    def _check_prefix(self) -> int | None:
        if len(self._buf) < 4:
            return None
        (n,) = FRAME_PREFIX.unpack_from(self._buf)
        if n > self.max_frame_bytes:
            raise FrameError(f"frame length {n} exceeds the limit of "
                             f"{self.max_frame_bytes} bytes", ERR_TOO_LARGE)
        return n

    def _messages(self) -> Iterator[Message]:
        while (n := self._check_prefix()) is not None and len(self._buf) >= 4 + n:
            body = bytes(self._buf[4:4 + n])
            del self._buf[:4 + n]
            if self.batch_columns:
                m, packed = _unpack_columns(body)
                yield decode_message(m, batch_columns=True, packed=packed)
            else:
                yield decode_message(_unpack(body))


def decode_batch(frame: bytes) -> list[Record]:
    """The records of exactly one whole framed ``batch`` message."""
    return list(_one_batch(frame, False).records)


def decode_batch_columns(frame: bytes) -> BatchColumns:
    """The columns of exactly one whole framed ``batch`` message (see BatchColumns)."""
    return _one_batch(frame, True)


def _one_batch(frame: bytes, batch_columns: bool) -> Any:
    decoder = FrameDecoder(batch_columns=batch_columns)
    msgs = list(decoder.feed(frame))
    if len(msgs) != 1 or decoder.pending or not isinstance(msgs[0], BatchColumns if batch_columns else Batch):
        raise FrameError(f"expected exactly one whole batch frame, got {len(msgs)} "
                         f"message(s) and {decoder.pending} trailing bytes")
    return msgs[0]
