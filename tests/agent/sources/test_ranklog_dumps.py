"""ranklog: faulthandler dumps become one rank.stacks record; the watch hook sees every chunk."""

from pathlib import Path

import pytest

from firstfault.agent.tail import to_text
from firstfault.wire import KIND_RANK_LINE, KIND_RANK_STACKS, KIND_RANK_TRACEBACK
from tests.agent.sources.test_ranklog import ship_files
from tests.agent.tail.tailmodel import write

FORMATS = Path(__file__).resolve().parents[2] / "data" / "formats"


def every_line(records):
    return [ln for r in records for ln in r.message.split("\n")
            if r.kind in (KIND_RANK_LINE, KIND_RANK_TRACEBACK, KIND_RANK_STACKS)]


def lines(path):
    return [to_text(x) for x in path.read_bytes().split(b"\n")[:-1]]


@pytest.mark.parametrize("name,head", [("faulthandler-segfault", "Fatal Python error: Segmentation fault"),
                                       ("faulthandler-abort", "Fatal Python error: Aborted"),
                                       ("faulthandler-dump-traceback-later", "Timeout (0:00:00.300000)!"),
                                       ("faulthandler-dump-traceback", None)])
def test_a_faulthandler_dump_is_one_stacks_record(name, head):
    path = FORMATS / f"{name}.log"
    rows = ship_files([path])
    want = lines(path)
    assert every_line(rows.records) == want
    dumps = rows.of(KIND_RANK_STACKS)
    assert len(dumps) == 1
    d = dumps[0]
    assert d.fields["tool"] == "faulthandler" and d.severity == 4
    body = d.message.split("\n")
    assert body[0].startswith(("Thread 0x", "Current thread 0x")) and body[-1].startswith("  File ")
    assert sum(ln.endswith("(most recent call first):") for ln in body) == \
        sum(ln.endswith("(most recent call first):") for ln in want)
    if head:
        assert rows.records[0].kind == KIND_RANK_LINE and rows.records[0].message == head


def test_a_dump_with_a_rank_prefix_and_lines_after_it(tmp_path):
    log = tmp_path / "console.log"
    src = lines(FORMATS / "faulthandler-register-sigusr1.log")
    write(log, "".join(f"[default1]:{ln}\n" for ln in src).encode() + b"[default0]:rank 0 step 3\n"
          + b"[default1]:after the dump\n")
    rows = ship_files([log])
    (d,) = rows.of(KIND_RANK_STACKS)
    assert all(ln.startswith("[default1]:") for ln in d.message.split("\n"))
    assert rows.records[-1].message == "[default1]:after the dump"


def test_watch_sees_every_chunk_with_its_identity(tmp_path):
    log = tmp_path / "rank3.log"
    write(log, b"one\nRuntimeError: Timed out waiting 4000ms for recv operation to complete\n")
    seen = []
    ship_files([log], watch=lambda ident, text, at: seen.append((ident[0], text, at)))
    assert seen and b"Timed out waiting" in b"".join(x[1] for x in seen)
    assert all(isinstance(x[2], int) for x in seen)
