"""``firstfault analyze`` and ``firstfault checkpoint`` on what nobody should write, with
hypothesis: random and mutated logs (real captures cut, spliced and flipped), huge lines,
NUL bytes, invalid UTF-8, deep and endless tracebacks, a gzip bomb; damaged checkpoint zip
files. Each gives a report or a clear problem, never an exception, and in bounded time and
memory. (Crashes found here become the named regression tests at the end.)"""

from __future__ import annotations

import gzip
import random
import resource
import shutil
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firstfault.offline import logfiles
from firstfault.offline.checkpoint_files import inspect_checkpoint_dir
from firstfault.offline.commands import report_from_logs
from firstfault.reports import FORMATS, render

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = sorted(p for p in (DATA / "real").rglob("*.log") if p.stat().st_size < 200_000)
SEEDS = [p.read_bytes() for p in REAL[:12]]
FUZZ = settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                        HealthCheck.too_slow])


@st.composite
def mutated_log(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "cut", "splice", "dup", "bytes"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[i] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[i:i + draw(st.integers(1, 4000))]
        elif op == "splice":
            data[i:i] = draw(st.sampled_from(SEEDS))[:draw(st.integers(1, 3000))]
        elif op == "dup":
            data[i:i] = data[i:i + draw(st.integers(1, 2000))]
        else:
            data[i:i] = draw(st.binary(max_size=64))
    return bytes(data)


def _analyze(tmp_path: Path, name: str, data: bytes) -> dict | None:
    path = tmp_path / name
    path.write_bytes(data)
    rep, gaps, problem = report_from_logs([str(path)])
    assert (rep is None) == (problem is not None)
    if rep is not None:
        for fmt in FORMATS:
            assert render(rep, fmt)
    return rep


@FUZZ
@given(mutated_log())
def test_mutated_real_logs(tmp_path_factory, data):
    _analyze(tmp_path_factory.mktemp("m"), "rank0.log", data)


@FUZZ
@given(st.lists(st.one_of(st.text(max_size=200), st.sampled_from([
    "[rank0]: Traceback (most recent call last):", '  File "/x.py", line 1, in <module>',
    "RuntimeError: CUDA out of memory.", "\x00", "\udcff", "[rank1]:", "\r", "\x1b[2J"])),
    max_size=200))
def test_random_lines(tmp_path_factory, lines):
    data = "\n".join(lines).encode("utf-8", "surrogateescape")
    _analyze(tmp_path_factory.mktemp("r"), "rank0.log", data)


def test_huge_lines_nul_bytes_and_invalid_utf8(tmp_path):
    tb = (b"[rank0]: Traceback (most recent call last):\n"
          b'[rank0]:   File "/job/train.py", line 7, in <module>\n')
    huge = b"[rank0]: " + b"x" * (64 << 20) + b"\n"  # a 64 MiB line
    rep = _analyze(tmp_path, "huge.log", huge + tb + b"[rank0]: ValueError: after a huge line\n")
    assert rep["first_failure"]["rank"] == 0
    rep = _analyze(tmp_path, "utf8.log", tb + b"[rank0]: ValueError: \xff\xfe\xc3(\xed\xa0\x80 bad bytes\n")
    assert "bad bytes" in rep["first_failure"]["summary"]
    later = b"ok line\n" * 2000 + b"\0\0\0" + tb + b"[rank0]: ValueError: after NULs\n"
    rep = _analyze(tmp_path, "nul.log", later)
    assert rep is not None  # NULs past the first 8 KiB: read as text
    rep, gaps, problem = report_from_logs([str(tmp_path / "huge.log"), _write(tmp_path, "bin.log", ELF_HEAD)])
    assert {"file": str(tmp_path / "bin.log"), "reason": "binary, not a log"} in gaps


# an ELF64 file's first bytes (e_ident, e_type, e_machine, ...): binary on the whole sample; a lone
# leading NUL is a copytruncate hole, read past (tests/offline/test_nul_hole.py)
ELF_HEAD = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x03\0>\0\x01\0\0\0" + b"\0" * 40


def _write(tmp_path: Path, name: str, data: bytes) -> str:
    (tmp_path / name).write_bytes(data)
    return str(tmp_path / name)


def test_deep_and_endless_tracebacks(tmp_path):
    head = b"[rank0]: Traceback (most recent call last):\n"
    frames = b"".join(b'[rank0]:   File "/job/m%d.py", line %d, in f%d\n[rank0]:     f()\n' % (i, i, i)
                      for i in range(20_000))  # a RecursionError's 20,000 frames
    rep = _analyze(tmp_path, "deep.log", head + frames + b"[rank0]: RecursionError: maximum recursion depth exceeded\n")
    assert rep["first_failure"]["rank"] == 0
    rep = _analyze(tmp_path, "endless.log", head + frames * 3)  # never ends
    assert rep is not None


def test_a_gzip_bomb_is_read_only_so_far(tmp_path, monkeypatch):
    monkeypatch.setattr(logfiles, "MIN_GZ_LIMIT", 1 << 20)  # a small bomb says the same
    bomb = tmp_path / "rank0.log.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        for _ in range(64):  # 64 MiB of one log line, ~64 KiB compressed
            f.write(b"[rank0]: step 1 loss 2.31 lr 1e-4 this line repeats\n" * ((1 << 20) // 53 + 1))
    before, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    rep, gaps, problem = report_from_logs([str(bomb)])
    assert time.monotonic() - t0 < 60  # stopped, not read to its 64 MiB end
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 << 10  # KiB
    (gap,) = [g for g in gaps if g["file"] == str(bomb)]
    assert "a gzip bomb? read stopped there" in gap["reason"] and "200x" in gap["reason"]
    limit = 200 * bomb.stat().st_size
    assert f"past {limit:,} bytes" in gap["reason"] and limit < 64 << 20  # not read to its end


# --- the checkpoint reader on damaged zip files ---------------------------------------------

CKPT = DATA / "checkpoints" / "zero2"


@FUZZ
@given(st.data())
def test_damaged_checkpoint_files(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("ck") / "ckpt"
    shutil.copytree(CKPT, root)
    files = sorted(p for p in root.rglob("*.pt"))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    for p in rng.sample(files, rng.randint(1, len(files))):
        b = bytearray(p.read_bytes())
        op = rng.choice(["flip", "truncate", "zero", "garbage", "empty"])
        if op == "flip":
            for _ in range(rng.randint(1, 20)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == "truncate":
            del b[rng.randrange(len(b)):]
        elif op == "zero":
            i = rng.randrange(len(b))
            b[i:i + 4096] = bytes(len(b[i:i + 4096]))
        elif op == "garbage":
            b = bytearray(rng.randbytes(rng.randint(1, 5000)))
        else:
            b = bytearray()
        p.write_bytes(bytes(b))
    disk = inspect_checkpoint_dir(str(root))
    assert disk is not None
