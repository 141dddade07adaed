"""journal: real journal files, written by systemd-journal-remote from the real kernel records
of tests/data/kernel (journal-input.export, made from the .kmsg captures), read by the source
through systemd-python: the records equal kmsg's, a restart resumes by cursor, and the source
says it is unavailable without systemd-python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from firstfault.agent.clock import BootWall, boot_wall, read_boot_id
from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.sources.journal import JournalSource
from firstfault.agent.sources.kmsg import KmsgStream
from tests.agent.sources.conftest import DATA, Sink
from tests.agent.sources.test_kmsg import kmsg_records

KERNEL = DATA / "kernel"
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
WINDOWS = ["boot", "memcg-oom", "nvrm", "segfault", "misc"]  # the export's order
BOOT_ID = "cb326fee-93b4-44ca-a3d3-73cf19686857"

needs_journal = pytest.mark.skipif(
    not os.path.exists(JOURNAL_REMOTE), reason="needs systemd-journal-remote (apt-get install systemd-journal-remote)")
pytestmark = needs_journal


@pytest.fixture(autouse=True)
def systemd_python():
    pytest.importorskip("systemd.journal", reason="needs systemd-python (pip install systemd-python)")


def export_entries() -> list[bytes]:
    """The 120 entries of journal-input.export (each starts with its __REALTIME_TIMESTAMP line)."""
    data = (KERNEL / "journal-input.export").read_bytes()
    parts = data.rstrip(b"\n").split(b"\n\n__REALTIME_TIMESTAMP=")
    entries = [parts[0] + b"\n"] + [b"__REALTIME_TIMESTAMP=" + p + b"\n" for p in parts[1:]]
    assert len(entries) == 120
    return entries


def write_journal(directory, name: str, entries: list[bytes]) -> None:
    """A .journal file made by systemd-journal-remote from export-format entries."""
    directory.mkdir(exist_ok=True)
    subprocess.run([JOURNAL_REMOTE, f"--output={directory / name}.journal", "-"],
                   input=b"\n".join(entries) + b"\n", check=True, capture_output=True)


def kmsg_drafts() -> list:
    """The drafts kmsg makes of the same records, on the capture's boot wall time (µs, as stored)."""
    meta = json.loads((KERNEL / "capture-meta.json").read_text())
    boot = BootWall(ns=meta["boot_wall_ns"] // 1000 * 1000, error_ns=0, at_boottime_ns=0)
    out = []
    for w in WINDOWS:
        for raw in kmsg_records(f"{w}.kmsg"):
            seq = int(raw.split(b",")[1])
            out += KmsgStream(BOOT_ID, seq - 1).feed(raw, boot, observed_ns=1)
    return out


def unescape(text: str) -> str:
    raw = text.encode()
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i:i + 2] == b"\\x":
            out.append(int(raw[i + 2:i + 4], 16))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "backslashreplace")


def lines(sink: Sink) -> list:
    return sink.of("kernel.line")


def wait_lines(sink: Sink, n: int) -> None:
    sink.wait_for(lambda d: len(lines(sink)) >= n, timeout=15)


def test_records_equal_what_kmsg_ships_of_the_same_kernel_records(tmp_path, sink, running):
    write_journal(tmp_path / "j", "all", export_entries())
    with running(JournalSource(directory=str(tmp_path / "j"), start_at="head", state_dir=str(tmp_path)), sink):
        wait_lines(sink, 120)
    got, want = lines(sink), kmsg_drafts()
    assert len(got) == len(want) == 120
    for j, k in zip(got, want):
        assert j.source == "journal" and j.kind == "kernel.line" and j.boot_id == BOOT_ID
        assert j.message == unescape(k.message)  # journald undid the kernel's \xNN escapes
        assert (j.mono_ns, j.occurred_ns, j.severity) == (k.mono_ns, k.occurred_ns, k.severity)
        for key in ("facility", "level", "subsystem", "device"):
            assert j.fields.get(key) == k.fields.get(key), key
        assert "seq" not in j.fields and j.fields["cursor"].startswith("s=")
        assert 0 < j.fields["clock_error_ns"] < 1_000_000
    kill = next(d for d in got if "Killed process 8333" in d.message)
    assert kill.message.startswith("Memory cgroup out of memory: Killed process 8333 (python3)")
    assert (kill.severity, kill.mono_ns) == (3, 923449922000)
    xid = next(d for d in got if "): 79, " in d.message)
    assert xid.message == "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    assert xid.fields["facility"] == 1  # root wrote it to /dev/kmsg (tests/data/kernel/README.md)
    assert [s.fields["state"] for s in sink.of("agent.status")] == ["running", "stopped"]


def test_follows_new_files_and_resumes_by_cursor_without_loss_or_repeats(tmp_path, sink, running):
    entries, jdir = export_entries(), tmp_path / "j"
    a, b, c = entries[:100], entries[100:115], entries[115:]  # boot+memcg-oom, nvrm, segfault+misc
    other = a[0].replace(b"_TRANSPORT=kernel", b"_TRANSPORT=syslog").replace(
        b"SYSLOG_IDENTIFIER=kernel", b"SYSLOG_IDENTIFIER=ff-test")  # not the kernel's: never shipped
    write_journal(jdir, "a", a + [other])
    src = dict(directory=str(jdir), start_at="head", state_dir=str(tmp_path))
    with running(JournalSource(**src), sink):
        wait_lines(sink, 100)
        write_journal(jdir, "b", b)  # a new journal file while running
        wait_lines(sink, 115)
    cursor = json.loads((tmp_path / "journal.json").read_text())["cursor"]
    assert cursor == lines(sink)[-1].fields["cursor"]
    write_journal(jdir, "c", c)  # written while the source was down
    again = Sink()
    with running(JournalSource(**src), again):
        wait_lines(again, 5)
    messages = [d.message for d in lines(sink) + lines(again)]
    assert messages == [unescape(d.message) for d in kmsg_drafts()]  # every entry once, in order
    assert len(lines(again)) == 5 and again.of("kernel.gap") == []


def test_a_cursor_whose_entry_is_gone_gives_a_gap_first(tmp_path, sink, running):
    entries = export_entries()
    write_journal(tmp_path / "old", "a", entries[:100])
    with running(JournalSource(directory=str(tmp_path / "old"), start_at="head", state_dir=str(tmp_path)), sink):
        wait_lines(sink, 100)
    write_journal(tmp_path / "new", "c", entries[115:])  # the old file is gone, vacuumed
    again = Sink()
    with running(JournalSource(directory=str(tmp_path / "new"), state_dir=str(tmp_path)), again):
        wait_lines(again, 5)
    gap = again.drafts[1]  # after the "running" status, before any line
    assert gap.kind == "kernel.gap" and gap.fields["reason"] == "cursor_gone" and gap.severity == 4
    assert gap.fields["cursor"] == lines(sink)[-1].fields["cursor"]
    assert [d.message for d in lines(again)] == [unescape(d.message) for d in kmsg_drafts()[115:]]


def restamped(entry: bytes, realtime_us: int, monotonic_us: int, boot_id: str, message: str) -> bytes:
    """A real entry with other stamps, boot and text: the test's own entry."""
    out = []
    for line in entry.split(b"\n"):
        key = line.partition(b"=")[0]
        line = {b"__REALTIME_TIMESTAMP": b"%s=%d" % (key, realtime_us),
                b"__MONOTONIC_TIMESTAMP": b"%s=%d" % (key, monotonic_us),
                b"_SOURCE_MONOTONIC_TIMESTAMP": b"%s=%d" % (key, monotonic_us),
                b"_BOOT_ID": key + b"=" + boot_id.replace("-", "").encode(),
                b"MESSAGE": key + b"=" + message.encode()}.get(key, line)
        out.append(line)
    return b"\n".join(out)


def test_start_at_boot_skips_entries_from_before_this_boot(tmp_path, sink, running):
    first = export_entries()[0]
    booted_us = boot_wall().ns // 1000
    now_mono_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    before = restamped(first, booted_us - 3600 * 10**6, 283340, BOOT_ID, "firstfault-journal-test before boot")
    after = restamped(first, booted_us + now_mono_us, now_mono_us, read_boot_id(), "firstfault-journal-test now")
    write_journal(tmp_path / "j", "mixed", [before, after])
    with running(JournalSource(directory=str(tmp_path / "j"), state_dir=str(tmp_path)), sink):
        d = sink.wait_for(lambda d: d.kind == "kernel.line")
    assert [x.message for x in lines(sink)] == ["firstfault-journal-test now"]
    assert d.boot_id == read_boot_id() and abs(d.occurred_ns - (booted_us + now_mono_us) * 1000) < 10_000


def test_bad_start_at_is_refused():
    with pytest.raises(ValueError, match="journal: start_at must be one of boot, head, got 'tail'"):
        JournalSource(start_at="tail")


def test_unavailable_and_failing_without_systemd_python(monkeypatch, sink, running):
    assert JournalSource.unavailable(HostPaths()) is None
    monkeypatch.setitem(sys.modules, "systemd", None)  # the import now raises ImportError
    monkeypatch.setitem(sys.modules, "systemd.journal", None)
    why = JournalSource.unavailable(HostPaths())
    assert why.startswith("systemd-python is not installed") and "pip install systemd-python" in why
    with running(JournalSource(), sink, backoff_initial_s=10):
        d = sink.wait_for(lambda d: d.fields.get("state") == "failed")
    assert d.fields["error"].startswith("SourceError: systemd-python is not installed")
