"""The one line machine (firstfault/analysis/assembly.py): which lines are one traceback or dump.

The agent's ranklog feeds it every line of a chunk where one may open (RANK_LOG); the offline
scanner feeds it only the lines a needle or an open group makes it read (READER). On every
capture in tests/data/formats, tests/data/real and tests/data/fragments both ways must find the
same tracebacks, line for line: the machine fed directly, and ranklog over the real tailer
(the agent keeps launcher prefixes and what a glued header follows; the analysis drops both:
compared without them). Those two checks were test_traceback_agreement.py's when there were
two machines.
"""

from collections import Counter
from pathlib import Path

import pytest

from firstfault.analysis import traceback as tb
from firstfault.analysis.assembly import RANK_LOG, READER, STACKS, TRACEBACK, Assembly
from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.events import KIND_TRACEBACK
from firstfault.analysis.parse import looks_srun_labelled
from firstfault.analysis.prefixes import Peeled, peel
from firstfault.analysis.reads import scan_needles
from firstfault.analysis.scan import StreamInfo, scan_stream
from firstfault.wire import KIND_RANK_TRACEBACK
from tests.agent.sources.test_ranklog import ship_files

DATA = Path(__file__).resolve().parents[1] / "data"
NEEDLES = scan_needles(load_catalog())


def _logs() -> list[Path]:
    found = sorted(DATA.glob("formats/*.log")) + sorted(DATA.glob("fragments/*.log"))
    found += sorted(p for p in (DATA / "real").rglob("*.log") if p.is_file())
    return found


LOGS = _logs()


def feed_all(lines: list[str], opener=RANK_LOG) -> list:
    """Every line fed as ranklog feeds it: prefix split off, visible; the groups in the order they ended."""
    asm, done = Assembly(opener), []
    for i, line in enumerate(lines):
        ended, _, _ = asm.feed(peel(tb.visible(line), srun_labels=True), i)
        if ended is not None:
            done.append(ended)
    return done + asm.close_all()


def machine_tracebacks(path: Path) -> Counter:
    """The tracebacks as ranklog ships them, compared as the analysis keeps them: each line
    without its launcher prefix, the first from where the traceback opens in it."""
    lines = path.read_bytes().decode("utf-8", "replace").removesuffix("\n").split("\n")  # the tailer's lines
    out = Counter()
    for g in feed_all(lines):
        if g.kind != TRACEBACK:
            continue
        texts = [tb.visible(tb.split_prefix(lines[i])[1]) for i in g.items]
        texts[0] = texts[0][g.at:]
        out[tuple(texts)] += 1
    return out


def agent_tracebacks(path: Path) -> Counter:
    out = Counter()
    for r in ship_files([path]).of(KIND_RANK_TRACEBACK):
        lines = [tb.visible(tb.split_prefix(ln)[1]) for ln in r.message.split("\n")]
        lines[0] = lines[0][tb.opening(lines[0]):]
        out[tuple(lines)] += 1
    return out


def scanned_tracebacks(path: Path) -> Counter:
    data = path.read_bytes()
    head = data[:8192].decode("utf-8", "replace").splitlines()
    info = StreamInfo(stream=str(path), srun_labels=looks_srun_labelled(head))
    return Counter(tuple(ev.text.split("\n")) for ev in scan_stream([data], info, NEEDLES)
                   if ev.kind == KIND_TRACEBACK)


def test_there_is_something_to_compare():
    assert len(LOGS) >= 40
    assert sum(sum(scanned_tracebacks(p).values()) for p in LOGS) >= 60


def test_the_scanner_finds_the_tracebacks_the_machine_groups():
    differ = [str(p.relative_to(DATA)) for p in LOGS if machine_tracebacks(p) != scanned_tracebacks(p)]
    assert differ == []


@pytest.mark.parametrize("path", LOGS, ids=[str(p.relative_to(DATA)) for p in LOGS])
def test_agent_and_analysis_agree(path):
    assert agent_tracebacks(path) == scanned_tracebacks(path)


def test_interleaved_keys_stay_apart():
    lines = ["[rank1]: Traceback (most recent call last):",
             '[rank0]: step 5 done',
             '[rank1]:   File "/w/train.py", line 3, in main',
             "[rank0]: Traceback (most recent call last):",
             "[rank1]:     boom()",
             '[rank0]:   File "/w/train.py", line 9, in step',
             "[rank1]: ValueError: bad",
             "[rank0]: RuntimeError: peer gone",
             "[rank1]: [2026-12-02 10:11:59,782] [INFO] after",
             "[rank0]: [2026-12-02 10:11:59,782] [INFO] after"]
    groups = feed_all(lines)
    assert [(g.key, g.items) for g in groups] == [("rank1", [0, 2, 4, 6]), ("rank0", [3, 5, 7])]
    assert all(g.closed and g.kind == TRACEBACK for g in groups)
    assert [(g.first.rank, g.first.text) for g in groups] == [(1, lines[0][9:]), (0, lines[3][9:])]


def test_a_chain_takes_its_blank_lines_and_a_plain_end_gives_them_back():
    chained = ["Traceback (most recent call last):", '  File "a.py", line 1, in f', "KeyError: 'x'", "",
               "During handling of the above exception, another exception occurred:", "",
               "Traceback (most recent call last):", '  File "a.py", line 2, in g', "ValueError: y", "",
               "", "next line"]
    [g] = feed_all(chained)
    assert g.items == list(range(9)) and g.held == [9, 10]  # the last blank lines are not its own


def test_the_line_that_ends_a_traceback_may_open_the_next():
    lines = ["Traceback (most recent call last):", '  File "a.py", line 1, in f', "KeyError: 'x'",
             "Traceback (most recent call last):", '  File "b.py", line 2, in g', "ValueError: y"]
    asm = Assembly()
    steps = [asm.feed(Peeled(text), i) for i, text in enumerate(lines)]
    ended, group, opened = steps[3]
    assert ended is not None and ended.items == [0, 1, 2] and ended.closed
    assert opened and group is asm.open[""] and group.items == [3, 4, 5]  # (fed on since)
    assert [s[2] for s in steps] == [True, False, False, True, False, False]


def test_a_header_glued_after_other_output_opens_where_it_starts():
    asm = Assembly()
    _, g, opened = asm.feed(Peeled("epoch 3: 100%|#####| 10/10Traceback (most recent call last):"), 0)
    assert opened and g.at == len("epoch 3: 100%|#####| 10/10")


def test_a_faulthandler_dump_is_grouped_by_both_openers_a_py_spy_dump_by_the_reader_only():
    dump = ["Thread 0x00007f063b8786c0 (most recent call first):", '  File "/w/fh.py", line 5 in worker', "",
            "Current thread 0x00007f063c5ddb80 (most recent call first):", '  File "/w/fh.py", line 9 in main',
            "done"]
    for opener in (RANK_LOG, READER):
        [g] = feed_all(dump, opener)
        assert g.kind == STACKS and g.items == [0, 1, 2, 3, 4]
    pyspy = ["Process 3794: /usr/bin/python -u hang.py", "Python v3.11.7 (/usr/bin/python3.11)", "",
             'Thread 3794 (idle): "MainThread"', "    load_next_batch (hang.py:15)"]
    assert feed_all(pyspy, RANK_LOG) == []
    [g] = feed_all(pyspy, READER)
    assert g.kind == STACKS and g.items == [0, 1, 2, 3, 4] and g.grouping.pid == 3794


def test_the_reader_assembles_frames_and_the_exception():
    asm = Assembly(READER)
    for text in ["Traceback (most recent call last):", '  File "a.py", line 1, in f', "    f()",
                 "KeyError: 'x'"]:
        asm.feed(Peeled(text))
    [g] = asm.close_all()
    res = g.grouping.result()
    assert (res.exc_type, res.message, [f.func for f in res.frames]) == ("KeyError", "KeyError: 'x'", ["f"])
    assert g.items == [] and asm.open == {}  # fed without handles: nothing kept


def test_a_traceback_glued_after_an_unknown_prefix_reads_its_later_lines_without_it():
    lead = "2023-04-29 06:01:12.{ms} [177/train/578 (pid 28936)] [09c561ee-a44c] "
    lines = [lead.format(ms=977) + "Traceback (most recent call last):",
             lead.format(ms=978) + '  File "/env/site-packages/torch/serialization.py", line 379, in save',
             lead.format(ms=978) + "    _save(obj, opened_zipfile, pickle_module, pickle_protocol)",
             lead.format(ms=1002) + "OSError: [Errno 28] No space left on device",
             lead.format(ms=1003) + "2023-04-29 06:01:13 INFO main failed"]
    asm = Assembly(READER)
    ended = [e for i, text in enumerate(lines) if (e := asm.feed(Peeled(text), i)[0]) is not None]
    [g] = ended + asm.close_all()
    res = g.grouping.result()
    assert g.items == [0, 1, 2, 3]  # the digits of the time may change from line to line
    assert (res.exc_type, [f.func for f in res.frames]) == ("OSError", ["save"])


def test_lines_without_the_glued_header_s_lead_are_read_as_they_are():
    asm = Assembly(READER)
    for text in ["  0%|          | 1/935 [00:01<20:34,  1.32s/it]Traceback (most recent call last):",
                 '  File "a.py", line 1, in f', "KeyError: 'x'"]:
        asm.feed(Peeled(text))
    [g] = asm.close_all()
    res = g.grouping.result()
    assert (res.exc_type, [f.func for f in res.frames]) == ("KeyError", ["f"])
