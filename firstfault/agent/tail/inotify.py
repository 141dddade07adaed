"""inotify(7) read directly: one non-blocking descriptor, every pending event in one read.

``Inotify()`` opens an instance (``inotify_init1(IN_NONBLOCK | IN_CLOEXEC)``
through ctypes); ``add_watch(path, mask) -> wd`` (the kernel returns the same wd
for a directory already watched: its mask is replaced), ``rm_watch(wd)`` (a watch
already gone is ignored), ``fileno()`` for select/poll, ``read() ->
list[InotifyEvent]`` (all that is queued, [] when nothing is), ``close()``.
``parse_events(buf)`` is the pure decoder of ``struct inotify_event`` records
(``int wd; uint32 mask, cookie, len; char name[len]``, the name NUL-padded).

Used by firstfault/agent/tail/follow.py instead of watchdog's observer, whose three threads and two
queues cost ~30 µs of Python per IN_MODIFY (bench/RESULTS.md, agent end to end).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from typing import NamedTuple

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_HEADER = struct.Struct("iIII")
_READ_BYTES = 64 * 1024  # a read returns whole events only (~2,000 here)
_RECORDS: dict[int, object] = {}  # an event's size -> iter_unpack cutting a buffer into them


class InotifyEvent(NamedTuple):
    wd: int  # -1 with IN_Q_OVERFLOW
    mask: int
    cookie: int
    name: str  # in the watched directory; "" for the directory itself


def parse_events(buf: bytes) -> list[InotifyEvent]:
    """The events in ``buf`` (what a read of an inotify descriptor returned), in order;
    an event identical to an earlier one in ``buf`` is left out (the kernel merges only
    consecutive ones: 8 files written in turn queue IN_MODIFY 8-periodically)."""
    out, seen = [], set()
    pos, size, unpack, hsize = 0, len(buf), _HEADER.unpack_from, _HEADER.size
    if size >= hsize:  # events of one size (a folder's files written in turn): cut in C
        step = hsize + unpack(buf, 0)[3]
        if size % step == 0:
            cut = _RECORDS.get(step)
            if cut is None:
                cut = _RECORDS[step] = struct.Struct(f"{step}s").iter_unpack
            distinct = dict.fromkeys(cut(buf))  # (record,) tuples: ~1/3 of slicing's cost
            if all(unpack(raw)[3] == step - hsize for raw, in distinct):
                return [InotifyEvent(*unpack(raw)[:3], os.fsdecode(raw[hsize:].rstrip(b"\0")))
                        for raw, in distinct]
    while pos + hsize <= size:
        n = unpack(buf, pos)[3]
        end = pos + hsize + n
        if end > size:
            raise ValueError(f"inotify event truncated: name of {n} bytes at {pos + hsize} of {size}")
        raw = buf[pos:end]
        if raw not in seen:
            seen.add(raw)
            wd, mask, cookie, _ = unpack(raw)
            out.append(InotifyEvent(wd, mask, cookie, os.fsdecode(raw[hsize:].rstrip(b"\0"))))
        pos = end
    if pos != size:
        raise ValueError(f"inotify read of {size} bytes ends inside an event header")
    return out


_libc = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc = lib
    return _libc


def _check(ret: int, what: str, path: str | None = None) -> int:
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}", path)
    return ret


class Inotify:
    """One inotify instance (see the module docstring)."""

    def __init__(self) -> None:
        self.fd = _check(_lib().inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")

    def fileno(self) -> int:
        return self.fd

    def add_watch(self, path: str, mask: int) -> int:
        return _check(_lib().inotify_add_watch(self.fd, os.fsencode(path), mask),
                      "inotify_add_watch", path)

    def rm_watch(self, wd: int) -> None:
        if _lib().inotify_rm_watch(self.fd, wd) < 0 and ctypes.get_errno() != errno.EINVAL:
            _check(-1, "inotify_rm_watch")  # EINVAL: the kernel dropped it (IN_IGNORED)

    def read(self) -> list[InotifyEvent]:
        """What is queued, up to _READ_BYTES of it (the descriptor stays readable while
        more is); [] when nothing is."""
        try:
            return parse_events(os.read(self.fd, _READ_BYTES))
        except BlockingIOError:
            return []

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
