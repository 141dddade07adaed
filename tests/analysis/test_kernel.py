"""Kernel log parsers on real captures (tests/data/kernel/, see its README)."""

import json
from datetime import timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firstfault.analysis.events import KIND_KERNEL
from firstfault.analysis.kernel import (
    FORMATS,
    ParseStats,
    detect_kernel_format,
    parse_kernel_log,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "kernel"
META = json.loads((DATA / "capture-meta.json").read_text())
BOOT_WALL_NS = META["boot_wall_ns"]
S = 1_000_000_000
WINDOWS = {"boot": 20, "memcg-oom": 80, "nvrm": 15, "segfault": 2, "misc": 3}  # records
DMESG = {"dmesg": "dmesg", "dmesg-T": "dmesg-T", "dmesg-r": "dmesg", "dmesg-iso": "dmesg-iso"}
JOURNAL = {"short": "journal-short", "short-precise": "journal-short", "short-iso": "journal-short-iso",
           "short-iso-precise": "journal-short-iso", "json": "journal-json", "export": "journal-export"}
CASES = ([(f"{w}.kmsg", "kmsg", n) for w, n in WINDOWS.items()]
         + [(f"{w}.{s}", f, n) for w, n in WINDOWS.items() for s, f in DMESG.items()]
         + [(f"journal.{s}", f, 120) for s, f in JOURNAL.items()] + [("journal-input.export", "journal-export", 120)])


def lines(name):
    with open(DATA / name, "rb") as f:  # bytes lines: what the export format needs
        return list(f)


def parse(name, **kw):
    stats = ParseStats()
    events = list(parse_kernel_log(lines(name), stats=stats, stream=name, **kw))
    return events, stats


def kmsg_all(**kw):
    """Every captured record in journal order, from the .kmsg files."""
    return [e for w in ("boot", "memcg-oom", "nvrm", "segfault", "misc") for e in parse(f"{w}.kmsg", **kw)[0]]


@pytest.mark.parametrize("name,fmt,count", CASES)
def test_every_capture_parses_whole(name, fmt, count):
    events, stats = parse(name, boot_wall_ns=BOOT_WALL_NS, year=2026)
    assert (stats.fmt, stats.events, len(events), stats.bad_lines, stats.missing_seq) == (fmt, count, count, 0, 0)
    assert stats.lines == len(lines(name))
    assert all(e.source == "kernel" and e.kind == KIND_KERNEL and e.stream == name for e in events)
    assert all(e.occurred_ns is not None for e in events)


@pytest.mark.parametrize("name,fmt,count", CASES)
def test_detects_every_format_from_the_first_lines(name, fmt, count):
    assert detect_kernel_format(lines(name)[:5]) == fmt


def test_detect_says_none_for_what_is_no_kernel_log():
    assert detect_kernel_format([]) is None
    assert detect_kernel_format(["hello world", "", "Traceback (most recent call last):"]) is None


@pytest.mark.parametrize("window", WINDOWS)
def test_dmesg_texts_and_stamps_are_the_kmsg_records(window):
    kmsg, _ = parse(f"{window}.kmsg")
    for suffix in ("dmesg", "dmesg-r"):
        dmesg, _ = parse(f"{window}.{suffix}")
        assert [e.fields["mono_ns"] for e in dmesg] == [e.fields["mono_ns"] for e in kmsg]
        if window != "misc":  # dmesg re-escapes what kmsg escaped; checked below
            assert [e.text for e in dmesg] == [e.text for e in kmsg]


def test_memcg_oom_kill_as_the_kernel_printed_it():
    events, _ = parse("memcg-oom.kmsg")
    assert (events[0].fields["seq"], events[-1].fields["seq"]) == (340, 419)
    assert [e.seq for e in events] == list(range(340, 420))
    assert events[0].text == "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"
    assert events[0].level == "WARNING"
    assert events[-2].text.startswith("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
                                      "oom_memcg=/ff-kcap-8289,task_memcg=/ff-kcap-8289,task=python3,pid=8333,uid=0")
    kill = events[-1]
    assert kill.text == ("Memory cgroup out of memory: Killed process 8333 (python3) total-vm:75156kB, "
                         "anon-rss:65280kB, file-rss:6684kB, shmem-rss:0kB, UID:0 pgtables:184kB oom_score_adj:0")
    assert (kill.level, kill.fields["priority"], kill.fields["facility"]) == ("ERROR", 3, 0)
    assert kill.fields["mono_ns"] == 923_449_922_000
    assert events[3].text == " <TASK>"  # leading space kept: the message is not interpreted
    assert "oom_kill 1" in (DATA / "memcg-oom.oom_control").read_text()


def test_injected_nvrm_lines_keep_their_text_and_user_facility():
    events, _ = parse("nvrm.kmsg")
    texts = [e.text for e in events]
    assert "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus." in texts
    assert "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus." in texts
    assert texts[-1] == ("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, "
                         "Link 32 egress non-posted PRIV error (First)")
    assert sum(t.startswith("NVRM: Xid (PCI:0000:3b:00") for t in texts) == 11
    assert {(e.fields["facility"], e.level) for e in events} == {(1, "ERROR")}  # root wrote <3>: user.err
    assert [e.level for e in parse("nvrm.dmesg-r")[0]] == ["ERROR"] * 15


def test_segfault_line():
    events, _ = parse("segfault.dmesg-T")
    assert events[0].text.startswith("python3[8334]: segfault at 0 ip 00007f8c0ff74219 sp 00007ffcf464e388 error 4")


def test_monotonic_stamps_become_wall_time_only_with_boot_time():
    bare, _ = parse("memcg-oom.kmsg")
    assert all(e.occurred_ns is None and e.clock is None for e in bare)
    timed, _ = parse("memcg-oom.kmsg", boot_wall_ns=BOOT_WALL_NS, boot_uncertainty_ns=200_000_000)
    kill = timed[-1]
    assert kill.occurred_ns == BOOT_WALL_NS + 923_449_922_000
    assert (kill.clock, kill.uncertainty_ns, kill.fields["seq"]) == ("kmsg", 200_001_000, 419)
    dmesg, _ = parse("memcg-oom.dmesg", boot_wall_ns=BOOT_WALL_NS)
    assert [e.occurred_ns for e in dmesg] == [e.occurred_ns for e in timed]


@pytest.mark.parametrize("window", WINDOWS)
def test_dmesg_wall_times_agree_with_kmsg_plus_boot_time(window):
    kmsg, _ = parse(f"{window}.kmsg", boot_wall_ns=BOOT_WALL_NS)
    ctime, _ = parse(f"{window}.dmesg-T")
    iso, _ = parse(f"{window}.dmesg-iso")
    for k, t, i in zip(kmsg, ctime, iso, strict=True):
        # dmesg -T drops the fractions of both boot time and stamp: [printed, printed + 2 s)
        assert t.occurred_ns <= k.occurred_ns < t.occurred_ns + t.uncertainty_ns
        assert (t.clock, t.uncertainty_ns) == ("line", 2 * S)
        # --time-format iso keeps the stamp's µs, drops the boot time's fraction
        assert i.occurred_ns == BOOT_WALL_NS // S * S + k.fields["mono_ns"]
        assert i.occurred_ns <= k.occurred_ns < i.occurred_ns + i.uncertainty_ns
    if window == "memcg-oom":  # the whole-second -T time of the kill is more than 1 s early
        assert kmsg[-1].occurred_ns - ctime[-1].occurred_ns > S


def test_journal_times_hosts_and_fields():
    kmsg = kmsg_all(boot_wall_ns=BOOT_WALL_NS)
    for name in ("journal.json", "journal.export", "journal-input.export"):
        events, _ = parse(name, node="ignored")
        assert [e.text for e in events] == [e.text for e in kmsg]
        assert [e.fields["mono_ns"] for e in events] == [e.fields["mono_ns"] for e in kmsg]
        assert [e.level for e in events] == [e.level for e in kmsg]
        for j, k in zip(events, kmsg):  # realtime = boot µs + stamp, as capture_journal.py stored it
            assert (j.node, j.clock, j.observed_ns) == ("vm", "journal", j.occurred_ns)
            assert 0 <= k.occurred_ns - j.occurred_ns < 1000
        assert events[0].fields["SUBSYSTEM"] == "pci" and events[0].fields["DEVICE"] == "+pci:0000:00:01.0"
        assert events[0].fields["boot_id"] == META["boot_id"].replace("-", "")
    short, _ = parse("journal.short", year=2026)
    precise, _ = parse("journal.short-iso-precise")
    for s_, p in zip(short, precise):
        assert s_.occurred_ns == p.occurred_ns // S * S and s_.uncertainty_ns == S and p.uncertainty_ns == 1000
        assert (s_.node, s_.clock, s_.level) == ("vm", "journal", None)
    assert parse("journal.short-precise", year=2026)[0][-1].occurred_ns == precise[-1].occurred_ns
    assert parse("journal.short-iso")[0][-1].occurred_ns == short[-1].occurred_ns


def test_journal_short_without_year_has_no_time_and_december_rolls_over():
    events, _ = parse("journal.short")
    assert all(e.occurred_ns is None and e.clock is None for e in events)
    rows = [ln.decode() for ln in lines("journal.short")[:2]]
    derived = [rows[0], rows[1].replace("Dec 02", "Jan 01")]  # derived from a real line: a new year
    first, second = parse_kernel_log(derived, year=2026)
    assert second.occurred_ns - first.occurred_ns == 30 * 24 * 3600 * S  # Dec 02 2026 -> Jan 01 2027


def test_continuation_lines_belong_to_their_record():
    boot, _ = parse("boot.kmsg")
    assert boot[0].text == "virtio-pci 0000:00:01.0: enabling device (0000 -> 0002)"
    assert (boot[0].fields["SUBSYSTEM"], boot[0].fields["DEVICE"]) == ("pci", "+pci:0000:00:01.0")
    assert sum("SUBSYSTEM" in e.fields for e in boot) == 7
    two = "ff-kcap multi-line record: first line\nsecond line"
    for name in ("misc.kmsg", "misc.dmesg", "misc.dmesg-T", "misc.dmesg-r", "misc.dmesg-iso", "journal.short",
                 "journal.short-iso-precise", "journal.json", "journal.export"):
        assert two in [e.text for e in parse(name, year=2026)[0]], name


def test_text_encodings_as_each_tool_printed_them():
    kmsg = [e.text for e in parse("misc.kmsg")[0]]
    assert kmsg[1:] == ["ff-kcap non-UTF-8 byte \\xff and ESC \x1b[0m in one record",
                        "ff-kcap backslash C:\\path and tab\there"]
    assert [e.text for e in parse("journal.json")[0]][-2:] == kmsg[1:]
    assert [e.text for e in parse("misc.dmesg")[0]][1] == "ff-kcap non-UTF-8 byte \\xff and ESC \\x1b[0m in one record"
    assert [e.text for e in parse("journal.short", year=2026)[0]][-2] == "[47B blob data]"
    # util-linux 2.38 dmesg -r prints <facility|level>: user.info (14) as <7>
    assert {e.level for e in parse("misc.dmesg-r")[0]} == {"DEBUG"}


def test_node_comes_from_the_log_else_the_argument():
    assert {e.node for e in parse("nvrm.kmsg", node="gpu-07")[0]} == {"gpu-07"}
    assert {e.node for e in parse("nvrm.dmesg")[0]} == {None}
    assert {e.node for e in parse("journal.short-iso", node="gpu-07")[0]} == {"vm"}


def test_local_times_use_the_given_zone():
    utc, _ = parse("segfault.dmesg-T")
    berlin, _ = parse("segfault.dmesg-T", tz=timezone(timedelta(hours=1)))
    assert utc[0].occurred_ns - berlin[0].occurred_ns == 3600 * S


def test_origin_and_order():
    events, _ = parse("misc.dmesg")
    assert [e.origin for e in events] == ["misc.dmesg:1", "misc.dmesg:3", "misc.dmesg:4"]
    assert [e.seq for e in events] == [1, 2, 3]
    assert parse_kernel_log(["[    0.100000] x"]).__next__().origin == "kernel:1"


GARBAGE = ["garbage line", "", "\x00\x01\x02", " indented garbage", "{not json"]


@pytest.mark.parametrize("name", ["memcg-oom.kmsg", "memcg-oom.dmesg", "memcg-oom.dmesg-T", "nvrm.dmesg-iso",
                                  "journal.short", "journal.short-iso", "journal.json"])
def test_garbage_lines_are_counted_not_fatal(name):
    clean, _ = parse(name, year=2026)
    mixed = [ln.decode() for ln in lines(name)]
    mixed[1:1] = ["garbage line", ""]
    mixed.append("\x00\x01\x02 trailing garbage")
    stats = ParseStats()
    events = list(parse_kernel_log(mixed, stats=stats, year=2026))
    assert [e.text for e in events] == [e.text for e in clean]
    assert (stats.bad_lines, stats.bad_linenos) == (2, [2, len(mixed)])  # the blank line is not bad


def test_kmsg_dictionary_garbage_and_lost_records():
    recs = [ln.decode() for ln in lines("boot.kmsg")]
    stats = ParseStats()
    events = list(parse_kernel_log(recs[:1] + [" no equals sign"] + recs[4:], stats=stats))
    assert (stats.bad_lines, stats.missing_seq, len(events)) == (1, 1, 19)  # record 271 dropped


def test_export_garbage_and_a_cut_binary_value():
    data = (DATA / "journal.export").read_bytes()
    cut = data[:data.index(b"multi-line record") + 5]  # ends inside the binary MESSAGE
    stats = ParseStats()
    events = list(parse_kernel_log(cut.splitlines(keepends=True), stats=stats))
    # counted: the value cut short, and its entry, which has no MESSAGE
    assert (len(events), stats.bad_lines) == (117, 2)
    stats = ParseStats()
    bad = [b"__CURSOR=x\n", b"not a field!\n", b"LONELYNAME\n", b"\xff\xff\xff\xff\xff\xff\xff\xff\n",
           b"MESSAGE=kept\n", b"\n", b"_TRANSPORT=syslog\n", b"MESSAGE=not kernel\n", b"\n"]
    events = list(parse_kernel_log(bad, fmt="journal-export", stats=stats))
    assert [e.text for e in events] == ["kept"]
    assert (stats.bad_lines, stats.skipped) == (3, 1)


def test_export_is_read_from_any_split_at_newlines():
    data = (DATA / "journal.export").read_bytes()
    for items in (data.split(b"\n"), [data.decode("utf-8", "surrogateescape")]):
        stats = ParseStats()
        events = list(parse_kernel_log(items, stats=stats))
        assert (stats.fmt, len(events), stats.bad_lines) == ("journal-export", 120, 0)
        assert events[-2].text == "ff-kcap non-UTF-8 byte \\xff and ESC \x1b[0m in one record"


def test_kmsg_header_extras_become_fields():
    line = lines("nvrm.kmsg")[0].decode().replace(",-;", ",-,caller=T8335;", 1)  # CONFIG_PRINTK_CALLER shape
    event = next(parse_kernel_log([line]))
    assert (event.fields["caller"], event.fields["flags"], event.seq) == ("T8335", "-", 420)
    assert event.text.startswith("NVRM: GPU at PCI:0000:3b:00: ")


def test_json_skips_other_transports_and_decodes_byte_lists():
    rows = ['{"MESSAGE": [104, 105, 255], "_TRANSPORT": "kernel", "PRIORITY": "3"}',
            '{"MESSAGE": "from a daemon", "_TRANSPORT": "syslog"}', '{"no": "message"}', "[1, 2]"]
    stats = ParseStats()
    events = list(parse_kernel_log(rows, fmt="journal-json", stats=stats))
    assert [(e.text, e.level, e.occurred_ns) for e in events] == [("hi\\xff", "ERROR", None)]
    assert (stats.skipped, stats.bad_lines) == (1, 2)


def test_unknown_format_is_a_programming_error_and_undetectable_input_is_all_bad():
    with pytest.raises(ValueError, match="unknown kernel log format"):
        parse_kernel_log([], fmt="syslog")
    stats = ParseStats()
    assert list(parse_kernel_log(["what", "", "is this"], stats=stats)) == []
    assert (stats.fmt, stats.bad_lines, stats.lines) == (None, 2, 3)


def _prefixes():
    out = []
    for name, *_ in CASES:
        out += [ln[:40] for ln in lines(name)[:3]]
    return out + [b" SUBSYSTEM=", b"MESSAGE\n\x05\x00\x00\x00\x00\x00\x00\x00", b"-- Boot x --"]


PREFIXES = _prefixes()
LINE = st.one_of(st.text(), st.binary(), st.builds(lambda p, t: p + t.encode("utf-8", "surrogatepass"),
                                                   st.sampled_from(PREFIXES), st.text()))


@settings(max_examples=300, deadline=None)
@given(st.lists(LINE, max_size=30), st.sampled_from((None,) + FORMATS), st.booleans())
def test_random_text_never_raises(rows, fmt, as_text):
    if as_text:
        rows = [r.decode("utf-8", "surrogateescape") if isinstance(r, bytes) else r for r in rows]
    stats = ParseStats()
    events = list(parse_kernel_log(rows, fmt=fmt, stats=stats, year=2026, boot_wall_ns=BOOT_WALL_NS))
    assert stats.lines == len(rows) and stats.events == len(events)
    assert all(isinstance(e.text, str) for e in events)
    detect_kernel_format(rows)


# A log whose every line starts with an ISO time (a log collector's or kubectl --timestamps) holds a
# program's lines, not a journal's: after the time comes no host and program name.
@pytest.mark.parametrize("line", [
    "2026-02-18T10:48:25.681Z [rank7]:[E218 10:48:25.033625188 ProcessGroupNCCL.cpp:632] [Rank 7] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000)",
    "2026-02-18T10:28:25.497Z 2026-02-18 10:28:25,496 - root - INFO - Saving latest checkpoint",
])
def test_iso_stamped_program_lines_are_no_journal(line):
    assert detect_kernel_format([line]) is None


def test_a_journal_in_short_iso_is_still_one():
    assert detect_kernel_format(["2026-12-02T11:12:25+0000 gpu-07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1"]) \
        == "journal-short-iso"


def test_an_iso_stamped_paste_is_read_as_the_job_s_log():
    from tests.offline.scoring import first_failure_of
    watchdog = ("2026-02-18T10:48:25.681Z [rank7]:[E218 10:48:25.033625188 ProcessGroupNCCL.cpp:632] [Rank 7] "
                "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=8, "
                "NumelOut=8, Timeout(ms)=600000) ran for 600031 milliseconds before timing out.\n")
    got = first_failure_of(watchdog)
    assert got is not None and got["category"] == "cascade"
