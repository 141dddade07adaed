"""A copytruncate hole: after ``truncate -s 0`` a writer without O_APPEND goes on at its
old offset, so the file starts with NULs and the log follows. The hole is skipped and the
rest read; a file is binary only when its whole sample looks so, not for any NUL."""

from __future__ import annotations

import gzip

import pytest

from firstfault.offline.commands import report_from_logs
from firstfault.offline.logfiles import looks_binary

OOM = ("[2026-12-02 10:11:59,782] [INFO] [logging.py:123:log_dist] [Rank 1] step=3 loss=2.1\n"
       "[rank1]: Traceback (most recent call last):\n"
       '[rank1]:   File "/work/train.py", line 88, in <module>\n'
       "[rank1]:     loss.backward()\n"
       "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. "
       "GPU 1 has a total capacity of 79.10 GiB of which 1.02 GiB is free.\n")


@pytest.mark.parametrize("hole", [1, 8192, 65536, 3 << 20], ids=["1B", "8KiB", "64KiB", "3MiB"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_the_oom_after_a_hole_is_found(tmp_path, hole, gz):
    data = b"\0" * hole + OOM.encode()
    path = tmp_path / ("rank1.log.gz" if gz else "rank1.log")
    path.write_bytes(gzip.compress(data) if gz else data)
    rep, gaps, problem = report_from_logs([str(path)])
    assert problem is None and gaps == []
    assert rep["first_failure"]["category"] == "gpu-memory" and rep["first_failure"]["rank"] == 1


def test_a_real_truncate_and_write_at_the_old_offset(tmp_path):
    path = tmp_path / "train.log"
    with open(path, "wb") as w:  # no O_APPEND
        w.write(b"[2026-12-02 10:00:00,000] [INFO] first run of lines\n" * 2000)
        w.flush()
        with open(path, "r+b") as t:
            t.truncate(0)  # what logrotate's copytruncate does
        w.write(OOM.encode())  # at the old offset: the hole before it reads as NULs
    assert path.read_bytes()[:4] == b"\0\0\0\0"
    rep, _, problem = report_from_logs([str(path)])
    assert problem is None and rep["first_failure"]["category"] == "gpu-memory"


def test_binary_is_judged_on_the_whole_sample():
    assert looks_binary(b"\0ELF")
    assert looks_binary(b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x03\0>\0\x01\0\0\0" + bytes(range(256)) * 8)
    assert looks_binary(b"PK\x03\x04\x14\0\0\0\x08\0" + bytes(range(32)) * 40)
    assert not looks_binary(OOM.encode())
    assert not looks_binary(OOM.encode().replace(b"step=3", b"step=\x003"))  # one stray NUL
    assert not looks_binary("ранг 1: ошибка \x1b[31mCUDA\x1b[0m\n".encode() * 20)


def test_a_stray_nul_inside_the_head_does_not_hide_the_log(tmp_path):
    path = tmp_path / "rank1.log"
    path.write_bytes(OOM.encode().replace(b"step=3", b"step=\x003"))
    rep, gaps, problem = report_from_logs([str(path)])
    assert problem is None and gaps == [] and rep["first_failure"]["category"] == "gpu-memory"
