"""A followed path's files across rotation, truncation and restarts (firstfault/agent/tail/
tailer.py's docstring is the specification: "Rotation rules"): ``resolve`` finds a path's
saved files again after a restart, at the path or rotated beside it; ``recheck`` notices a
content truncated or rewritten in place (copytruncate: its copy beside the path,
``find_copy``) and goes on with the new content.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from firstfault.agent.tail.file import OPEN_FLAGS, FileReader, PathFiles, TailedFile, fingerprint
from firstfault.agent.tail.lines import LOST, ROTATED, TRUNCATED, FileKey, LineBatch

log = logging.getLogger("firstfault.agent.tail")

OnChange = Callable[[PathFiles, str, "TailedFile | None", int, str], None]


class Rotation:
    """Rotation and truncation of the files a FileReader reads. ``on_change(paths, kind,
    file, offset, detail)`` and ``on_error(paths, file, what, exc)`` report (the Tailer's);
    ``new_key(dev, ino)`` names a new content."""

    def __init__(self, reader: FileReader, on_change: OnChange,
                 on_error: Callable[[PathFiles, TailedFile | None, str, OSError], None],
                 new_key: Callable[[int, int], FileKey]) -> None:
        self.reader, self.on_change, self.on_error, self.new_key = reader, on_change, on_error, new_key

    def resolve(self, ps: PathFiles, st: os.stat_result | None) -> bool:
        """After a restart: find the saved files of a path (at it, or rotated beside it)."""
        ps.resolved = True
        found: dict[int, str] = {}
        if st is not None:
            found[st.st_ino] = ps.path
        wanted = {f.key.ino for f in ps.files if f.restored} - set(found)
        if wanted:
            try:
                with os.scandir(os.path.dirname(ps.path) or ".") as it:
                    for entry in it:
                        ino = entry.inode()
                        if ino in wanted and ino not in found:
                            found[ino] = entry.path
            except OSError as exc:
                log.warning("tail cannot scan for rotated files path=%s: %s", ps.path, exc)
        keep = []
        for f in ps.files:
            if not f.restored:
                keep.append(f)
                continue
            where = found.get(f.key.ino)
            if where is None:
                why = "not found at the path or beside it"
            elif not f.fp_len and where != ps.path:  # no first bytes to tell it from a stranger
                why = f"was empty when last seen, so {where} may be another file"
            else:
                why = self.reopen(f, where)
            if why and f.fp_len:  # copytruncate while stopped: the content lives on in its copy
                copy = find_copy(ps.path, f.key.ino, f.fp_len, f.fp, f.committed)
                if copy is not None and not self.reopen(f, copy, same_inode=False):
                    where, why = copy, ""
            if why:
                self.on_change(ps, LOST, f, f.committed,
                            f"saved file {f.key.dev}:{f.key.ino} {why}: its bytes after the "
                            f"committed offset {f.committed} are lost")
                continue
            f.at_path = where == ps.path
            keep.append(f)
            if not f.at_path:
                self.on_change(ps, ROTATED, f, f.committed,
                            f"rotated while stopped, now {where}: draining from the committed offset")
        for f in keep[:-1]:  # only the newest file of a stream can be the one at the path
            f.at_path = False
        ps.files = keep
        return True

    def reopen(self, f: TailedFile, where: str, same_inode: bool = True) -> str:
        try:
            fd = os.open(where, OPEN_FLAGS)
        except OSError as exc:
            return f"cannot be opened ({exc.strerror})"
        ahead = f.ahead
        try:
            st = os.fstat(fd)
            n = max(f.fp_len, ahead[1] if ahead else 0)
            head = os.pread(fd, n, 0) if n else b""
        except OSError as exc:
            os.close(fd)
            return f"cannot be read ({exc.strerror})"
        if same_inode and st.st_ino != f.key.ino:
            why = "was replaced"
        elif len(head) < f.fp_len or fingerprint(head[:f.fp_len]) != f.fp:
            why = "has other first bytes (truncated, rewritten or a reused inode)"
        elif st.st_size < f.committed:
            why = f"is shorter ({st.st_size}) than the committed offset"
        else:
            f.fd, f.restored, f.last_growth, f.ahead = fd, False, self.reader.clock(), None
            if (st.st_dev, st.st_ino) != f.key[:2]:  # devices renumbered at boot; a copy
                f.key = FileKey(st.st_dev, st.st_ino, f.key.serial)
            if ahead is not None:
                offset, fp_len, fp = ahead
                if offset <= st.st_size and len(head) >= fp_len and fingerprint(head[:fp_len]) == fp:
                    log.info("tail file=%d:%d committed offset %d -> %d (taken after the last "
                             "commit)", st.st_dev, st.st_ino, f.committed, offset)
                    f.read = f.line_start = f.committed = offset
                else:
                    log.info("tail file=%d:%d advance to %d ignored: not this content",
                             st.st_dev, st.st_ino, offset)
            return ""
        os.close(fd)
        return why

    # -- a content truncated in place ---------------------------------------------

    def recheck(self, ps: PathFiles, i: int, now_ns: int, out: list[LineBatch],
                 size: int | None = None) -> tuple[TailedFile | None, bool]:
        """(file, truncated): ps.files[i] if it still holds the content being read, else
        (truncated, or rewritten in place) its new content, read from 0 -- or, when a copy
        of the old content lies beside the path (``find_copy``), the old content read on
        from the copy, the new one right after it; None: unknown."""
        f = ps.files[i]
        known = f.fp_len
        try:
            if size is None:  # (given: the path's stat, when it names this inode)
                size = os.fstat(f.fd).st_size
            if size >= f.read and self.reader.check_fingerprint(f):
                return f, not known and f.fp_len > 0  # first bytes seen: save them
        except OSError as exc:
            self.on_error(ps, f, "fstat", exc)
            return None, False
        copy = find_copy(ps.path, f.key.ino, f.fp_len, f.fp, f.read,
                         (f.line_start, f.pending)) if f.fp_len else None
        try:
            copy_fd = os.open(copy, OPEN_FLAGS) if copy is not None else None
        except OSError:
            copy_fd = None
        if copy_fd is None:
            self.reader.flush(ps, f, now_ns, out)  # the partial line held in memory is all that is left
        if copy_fd is None:
            self.on_change(ps, TRUNCATED, f, f.read,
                        f"size {size} < offset {f.read} or first bytes changed: reading from 0")
        else:  # nothing lost: as a rotation
            self.on_change(ps, ROTATED, f, f.read, f"copytruncate (size {size} < offset {f.read} "
                        f"or first bytes changed): the rest is read from its copy {copy}")
        new = TailedFile(self.new_key(f.key.dev, f.key.ino), f.fd, at_path=f.at_path, now=self.reader.clock())
        # the descriptor now reads the new content; the old one is in the copy, or gone
        f.fd, f.at_path, f.gone = copy_fd, False, copy_fd is None
        ps.files.insert(i + 1, new)
        try:
            self.reader.check_fingerprint(new)
        except OSError as exc:
            self.on_error(ps, new, "read", exc)
        return (new if copy_fd is None else f), True


def find_copy(path: str, ino: int, fp_len: int, fp: str, min_size: int,
              tail: tuple[int, bytes] = (0, b"")) -> str | None:
    """A copy of a content of ``path`` (logrotate ``copytruncate``: ``rank3.log.1``,
    ``rank3.log-20261202``): a regular file beside it whose name starts with the path's,
    another inode, at least ``min_size`` bytes, whose first ``fp_len`` bytes hash to ``fp``
    and that holds ``tail`` (offset, bytes: a partial line in memory); newest first, the 16
    newest candidates looked at."""
    folder, base = os.path.split(path)
    found = []
    try:
        with os.scandir(folder or ".") as it:
            for e in it:
                if e.name != base and e.name.startswith(base) and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    if st.st_ino != ino and st.st_size >= min_size:
                        found.append((st.st_mtime_ns, e.path))
    except OSError as exc:
        log.warning("tail cannot scan for a copy of path=%s: %s", path, exc)
        return None
    for _, where in sorted(found, reverse=True)[:16]:
        try:
            with open(where, "rb") as fh:
                head = fh.read(fp_len)
                fh.seek(tail[0])
                same_tail = fh.read(len(tail[1])) == tail[1]
        except OSError:
            continue
        if len(head) == fp_len and fingerprint(head) == fp and same_tail:
            return where
    return None
