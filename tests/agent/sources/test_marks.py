"""marks: `firstfault mark` writes, the source ships each mark once and deletes it; bad files
are rejected aside without stopping it."""

from __future__ import annotations

import json
import os

import pytest

from firstfault.agent.sources.marks import MAX_MARK_BYTES, MarkError, MarksSource, marks_dir, parse_mark, write_mark
from firstfault.cli import main as cli_main
from firstfault.wire import KIND_AGENT_STATUS, KIND_JOB_MARK

GOOD = {"version": 1, "event": "start", "job": "4242", "step": None, "nodes": "gpu-[01-04,07]",
        "at_ns": 1_796_212_800_123_456_789}


def _bytes(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def test_parse_a_mark():
    m = parse_mark(_bytes(step="0"))
    assert (m.event, m.job, m.step, m.nodes, m.at_ns) == ("start", "4242", "0", "gpu-[01-04,07]",
                                                          1_796_212_800_123_456_789)


@pytest.mark.parametrize("data, error", [
    (b"{not json", "not UTF-8 JSON"),
    (b"\xff\xfe", "not UTF-8 JSON"),
    (b"[1, 2]", "JSON object"),
    (_bytes(version=2), "version must be 1"),
    (_bytes(event="begin"), "event must be one of start, end"),
    (_bytes(job=""), "job must be a non-empty string"),
    (_bytes(job=42), "job must be a non-empty string"),
    (_bytes(job="a/b"), "not allowed"),
    (_bytes(job="x" * 257), "longer than 256 bytes"),
    (_bytes(nodes="n" * 1025), "longer than 1024 bytes"),
    (_bytes(at_ns=-1), "at_ns must be"),
    (_bytes(at_ns=1.5), "at_ns must be"),
    (_bytes(owner="root"), "unknown keys ['owner']"),
    (b" " * (MAX_MARK_BYTES + 1), "larger than"),
])
def test_parse_rejects_what_is_no_mark(data, error):
    with pytest.raises(MarkError, match=error.replace("[", r"\[").replace("]", r"\]")):
        parse_mark(data)


def test_write_mark_leaves_one_complete_file_and_refuses_bad_values(tmp_path):
    path = write_mark(str(tmp_path), "end", "77", step="batch", nodes="n1", now_ns=5)
    assert os.listdir(marks_dir(str(tmp_path))) == [os.path.basename(path)]
    assert os.path.basename(path).startswith("5-") and path.endswith("-end.json")
    assert parse_mark(open(path, "rb").read()) == ("end", "77", "batch", "n1", 5)
    with pytest.raises(MarkError, match="job"):
        write_mark(str(tmp_path), "start", "has space")
    assert len(os.listdir(marks_dir(str(tmp_path)))) == 1


def test_a_mark_written_before_the_agent_starts_is_shipped_at_start_and_deleted(tmp_path, sink, running):
    write_mark(str(tmp_path), "start", "4242", nodes="gpu-[01-02]", now_ns=1_000)
    with running(MarksSource(state_dir=str(tmp_path), rescan_s=60), sink):
        d = sink.wait_for(lambda d: d.kind == KIND_JOB_MARK)
    assert (d.source, d.job, d.occurred_ns) == ("marks", "4242", 1_000)
    assert d.message == "job 4242 start on gpu-[01-02]"
    assert d.fields["event"] == "start" and d.fields["nodes"] == "gpu-[01-02]"
    assert d.fields["uid"] == os.geteuid() and d.fields["step"] is None
    assert os.listdir(marks_dir(str(tmp_path))) == []


def test_marks_written_while_running_arrive_once_in_order(tmp_path, sink, running):
    # rescan_s is long: only inotify can bring these in during the test
    with running(MarksSource(state_dir=str(tmp_path), rescan_s=600), sink):
        sink.wait_for(lambda d: d.fields.get("state") == "running")
        write_mark(str(tmp_path), "start", "9", now_ns=1)
        write_mark(str(tmp_path), "end", "9", now_ns=2)
        sink.wait_for(lambda d: d.kind == KIND_JOB_MARK and d.fields["event"] == "end")
    marks = sink.of(KIND_JOB_MARK)
    assert [(d.job, d.fields["event"]) for d in marks] == [("9", "start"), ("9", "end")]
    assert os.listdir(marks_dir(str(tmp_path))) == []


def test_a_malformed_file_is_rejected_aside_and_the_source_goes_on(tmp_path, sink, running):
    directory = tmp_path / "marks"
    directory.mkdir()
    (directory / "1-1-start.json").write_bytes(b'{"version": 1, "event": "start", "job": ')
    secret = tmp_path / "secret"
    secret.write_text("root:$6$hash")
    os.symlink(secret, directory / "2-1-start.json")
    (directory / ".3-1-start.json.tmp").write_bytes(b"{half")  # a writer still busy: not touched
    with running(MarksSource(state_dir=str(tmp_path), rescan_s=600), sink):
        sink.wait_for(lambda d: d.fields.get("state") == "rejected" and d.fields["file"] == "2-1-start.json")
        write_mark(str(tmp_path), "start", "after", now_ns=10)
        sink.wait_for(lambda d: d.kind == KIND_JOB_MARK)
    rejected = [d for d in sink.of(KIND_AGENT_STATUS) if d.fields.get("state") == "rejected"]
    assert [(d.fields["file"], d.source, d.severity) for d in rejected] == [
        ("1-1-start.json", "agent", 4), ("2-1-start.json", "agent", 4)]
    assert "not UTF-8 JSON" in rejected[0].fields["error"]
    assert rejected[1].fields["error"] == "a symbolic link, not a mark"
    assert not any("hash" in d.message for d in sink.drafts)
    assert [d.job for d in sink.of(KIND_JOB_MARK)] == ["after"]
    assert sorted(os.listdir(directory / "rejected")) == ["1-1-start.json", "2-1-start.json"]
    assert secret.read_text() == "root:$6$hash"
    assert sorted(os.listdir(directory)) == [".3-1-start.json.tmp", "rejected"]


def test_a_mark_is_kept_when_the_spool_refuses_it(tmp_path, running):
    write_mark(str(tmp_path), "start", "5", now_ns=1)

    def failing(d):
        raise OSError(28, "No space left on device")

    source = MarksSource(state_dir=str(tmp_path), rescan_s=600)
    with pytest.raises(OSError):
        source.scan(marks_dir(str(tmp_path)), failing)
    assert len(os.listdir(marks_dir(str(tmp_path)))) == 1


def test_options_are_checked():
    with pytest.raises(ValueError, match="rescan_s"):
        MarksSource(state_dir="/x", rescan_s=0)


# --- the command ---------------------------------------------------------------

def test_firstfault_mark_writes_a_mark_the_source_reads(tmp_path, capsys):
    assert cli_main(["mark", "start", "--job", "4242", "--step", "0", "--nodes", "gpu-[01-04]",
                     "--state-dir", str(tmp_path)]) == 0
    path = capsys.readouterr().out.strip()
    assert os.path.dirname(path) == marks_dir(str(tmp_path))
    m = parse_mark(open(path, "rb").read())
    assert (m.event, m.job, m.step, m.nodes) == ("start", "4242", "0", "gpu-[01-04]")


def test_firstfault_mark_exit_codes(tmp_path, capsys):
    assert cli_main(["mark", "start", "--job", "a b", "--state-dir", str(tmp_path)]) == 2
    assert "job 'a b' has a character that is not allowed" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli_main(["mark", "end", "--job", "1", "--state-dir", str(blocker)]) == 1
    assert "cannot write the mark under" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli_main(["mark", "start", "--state-dir", str(tmp_path)])
    assert e.value.code == 2


def test_the_agent_watches_the_marks_directory_that_firstfault_mark_writes(tmp_path, sink, running):
    from firstfault.agent.config import load_config
    from firstfault.agent.daemon import build_sources

    cfg = load_config(None, {(None, "collectors"): "127.0.0.1:7140", (None, "state_dir"): str(tmp_path)})
    built, _ = build_sources(cfg, create_dirs=True)
    source = next(s for s in built if s.name == "marks")
    write_mark(str(tmp_path), "start", "wired", now_ns=3)  # as `firstfault mark --state-dir` does
    with running(source, sink):
        assert sink.wait_for(lambda d: d.kind == KIND_JOB_MARK).job == "wired"
