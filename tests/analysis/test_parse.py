"""Line formats: launcher prefixes, rank labels and timestamps (shapes from FORMATS.md and tests/data)."""

from datetime import datetime, timezone

from firstfault.analysis.parse import looks_srun_labelled, parse_nccl_origin, parse_stamp, strip_prefixes


def _ns(*a) -> int:
    return int(datetime(*a, tzinfo=timezone.utc).timestamp()) * 1_000_000_000


def test_tee_and_rank_prefixes_stack():
    p = strip_prefixes("[default0]:[rank0]: RuntimeError: boom")
    assert (p.text, p.rank, p.local_rank) == ("RuntimeError: boom", 0, 0)
    p = strip_prefixes("[default1]:some output")
    assert (p.text, p.rank, p.local_rank) == ("some output", None, 1)
    p = strip_prefixes("[rank3]:   File \"x.py\", line 1, in f")
    assert p.rank == 3 and p.text == '  File "x.py", line 1, in f'


def test_plain_line_is_left_alone():
    line = "[2026-12-02 10:11:59,782] [INFO] [logging.py:123:log_dist] [Rank 0] hello"
    p = strip_prefixes(line)
    assert p.text == line and p.rank is None and p.local_rank is None


def test_srun_label_only_when_asked():
    assert strip_prefixes("12: hello").text == "12: hello"
    p = strip_prefixes("12: [rank12]: x", srun_labels=True)
    assert (p.text, p.rank, p.label) == ("x", 12, 12)
    assert looks_srun_labelled(["0: a", "1: b", " 2: c", "3: d"])
    assert not looks_srun_labelled(["hello", "1: b", "world", "x"])


def test_deepspeed_stamp():
    st = parse_stamp("[2026-12-02 10:11:59,782] [INFO] [logging.py:123:log_dist] [Rank 0] x", year=2000)
    assert st.ns == _ns(2026, 12, 2, 10, 11, 59) + 782_000_000
    assert st.uncertainty_ns == 1_000_000 and st.level == "INFO"


def test_glog_stamp_takes_year_from_caller():
    line = ("E1202 10:12:00.462000 4242 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
            "(exitcode: -9) local_rank: 1 (pid: 555) of binary: /usr/bin/python3")
    st = parse_stamp(line, year=2026)
    assert st.ns == _ns(2026, 12, 2, 10, 12, 0) + 462_000_000
    assert st.level == "ERROR" and st.pid == 4242 and st.uncertainty_ns == 1000


def test_iso_and_hf_stamps():
    st = parse_stamp("2026-12-02T10:00:00.5Z something", year=1)
    assert st.ns == _ns(2026, 12, 2, 10, 0, 0) + 500_000_000
    st = parse_stamp("2026-12-02 10:00:00,123 - INFO - x", year=1)
    assert st.ns == _ns(2026, 12, 2, 10, 0, 0) + 123_000_000
    st = parse_stamp("[INFO|trainer.py:2345] 2026-12-02 10:00:01,000 >> ***** Running training *****", year=1)
    assert st.ns == _ns(2026, 12, 2, 10, 0, 1) and st.level == "INFO"


def test_no_stamp_and_garbage():
    for text in ("", "Traceback (most recent call last):", "[rank1]: x", "I am not glog", "2026-13-45 99:99:99 x",
                 "[9999-99-99 99:99:99,1] [INFO] x", "\x00\xff"):
        assert parse_stamp(text, year=2026) is None


def test_nccl_origin():
    o = parse_nccl_origin("gpu-07:24215:24290 [1] NCCL INFO Channel 00/02 :    0   1")
    assert (o.host, o.pid, o.device) == ("gpu-07", 24215, 1)
    assert parse_nccl_origin("NCCL INFO x") is None


def test_c10_bracketed_stamp_with_and_without_thread_id():
    """PyTorch's C++ log lines (ProcessGroupNCCL, TCPStore) as they follow [rankN]: (tests/data/formats,
    torch/csrc c10 logging): the year comes from the caller, the thread id is there in some versions."""
    a = parse_stamp("[E1203 09:20:10.220000 4000 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 0] x",
                    year=2026)
    b = parse_stamp("[W1202 11:25:07.464507372 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed", year=2026)
    assert a.level == "ERROR" and a.pid == 4000 and a.ns == int(datetime(2026, 12, 3, 9, 20, 10, 220000, timezone.utc).timestamp() * 1e9)
    assert b.level == "WARNING" and b.pid is None and b.uncertainty_ns == 1
