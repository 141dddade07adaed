"""The verdict rules on hand-built Events (texts are real lines from tests/data)."""

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.events import KIND_KERNEL, KIND_STREAM, KIND_TRACEBACK, Event, Frame
from firstfault.analysis.report import Inputs, build_report

CAT = load_catalog()
S = 1_000_000_000
T0 = 1_796_205_000 * S

GLOO_CLOSED = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
               "closed by peer [127.0.0.1]:21920. This is typically caused by a remote worker crashing.")
GLOO_TIMEOUT = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                "Timed out waiting 20000ms for recv operation to complete")
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
CUDA_ERR = "RuntimeError: CUDA error: unspecified launch failure"
OOM_KILL = ("Memory cgroup out of memory: Killed process 26216 (python3.11) total-vm:1979768kB, anon-rss:1053432kB, "
            "file-rss:101796kB, shmem-rss:0kB, UID:0 pgtables:2644kB oom_score_adj:0")


def ev(text, rank=None, t=0.0, unc=0.001, **kw):
    kw.setdefault("source", "ranklog")
    return Event(text=text, rank=rank, occurred_ns=T0 + int(t * S), clock="line", uncertainty_ns=int(unc * S),
                 stream=kw.pop("stream", f"r{rank}"), **kw)


def tb(msg, rank, t, frames=(("/w/train.py", 5, "<module>"),), **kw):
    return ev(f"Traceback (most recent call last):\n{msg}", rank, t, kind=KIND_TRACEBACK,
              frames=tuple(Frame(*f) for f in frames), fields={"message": msg}, **kw)


def report(events, **kw):
    return build_report(events, CAT, Inputs(**kw))


def test_cascade_never_wins_even_when_earlier():
    rep = report([tb(GLOO_CLOSED, 0, 1.0), tb("ValueError: bad batch", 1, 5.0)])
    ff = rep["first_failure"]
    assert ff["rank"] == 1 and ff["signature"] == "python.exception" and ff["category"] == "user-code"
    assert rep["ranks"]["0"]["first_error"]["role"] == "cascade"
    assert rep["blame"] == "code"


def test_ranks_grouped_by_fingerprint_numbers_ignored():
    evs = [tb(f"ValueError: label {100 + r} out of range", r, 1.0 + r / 100) for r in range(4)]
    rep = report(evs)
    assert rep["first_failure"]["ranks_sharing"] == [0, 1, 2, 3]
    assert len(rep["distinct_failures"]) == 1 and rep["distinct_failures"][0]["count"] == 4


def test_tie_within_clock_uncertainty_is_reported():
    rep = report([tb("ValueError: a", 0, 1.0, unc=2), tb("KeyError: 'b'", 3, 1.5, unc=2)])
    ff = rep["first_failure"]
    assert ff["within_clock_uncertainty"] and ff["tied_with"] == [3] and ff["confidence"] == "medium"
    apart = report([tb("ValueError: a", 0, 1.0), tb("KeyError: 'b'", 3, 9.0)])["first_failure"]
    assert not apart["within_clock_uncertainty"]


def test_xid_before_cuda_error_on_that_node_is_hardware():
    evs = [
        ev(XID79, None, 1.0, source="kernel", kind=KIND_KERNEL, node="gpu-07", stream="k"),
        tb(CUDA_ERR, 5, 2.0, node="gpu-07"),
        tb(GLOO_CLOSED, 4, 3.0, node="gpu-06"),
    ]
    rep = report(evs)
    ff = rep["first_failure"]
    assert ff["signature"] == "nvidia.xid" and ff["category"] == "hardware" and rep["blame"] == "hardware"
    assert ff["node"] == "gpu-07"


def test_application_xid_is_the_users():
    xid13 = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"
    rep = report([ev(xid13, None, 1.0, source="kernel", kind=KIND_KERNEL, node="gpu-07", stream="k")])
    assert rep["first_failure"]["category"] == "user-code" and rep["blame"] == "code"


def test_oom_kill_tied_to_the_one_sigkilled_rank_without_pid_map():
    launcher = ("E1202 11:31:15.400000 26100 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
                "(exitcode: -9) local_rank: 1 (pid: 999) of binary: /usr/bin/python3")
    evs = [
        ev(OOM_KILL, None, 1.0, source="kernel", kind=KIND_KERNEL, stream="k"),
        tb(GLOO_CLOSED, 0, 1.2),
        ev(launcher, None, 2.0, source="launcher", stream="launcher"),
    ]
    rep = report(evs)
    ff = rep["first_failure"]
    assert ff["rank"] == 1 and ff["signature"] == "kernel.memcg_oom_kill"
    assert "only rank" in ff["evidence"][0]["linked_by"] and ff["confidence"] == "medium"


def test_kernel_events_outside_the_job_are_not_its():
    old = ev(OOM_KILL, None, -7200.0, source="kernel", kind=KIND_KERNEL, stream="k")
    summary = Event(text="", source="ranklog", kind=KIND_STREAM, rank=0, stream="r0",
                    fields={"first_ns": T0, "last_ns": T0 + 60 * S, "lines": 10})
    rep = report([old, summary, tb("ValueError: x", 0, 30.0)])
    assert rep["first_failure"]["signature"] == "python.exception"
    assert [d["signature"] for d in rep["distinct_failures"]] == ["python.exception"]


def test_hang_rank_whose_progress_stopped_first():
    prog = "[2026-12-02 11:31:13,721] [INFO] [timer.py:264:stop] epoch=0/micro_step={s}/global_step={s}, RunningAvgSamplesPerSec=1.0"
    evs = [ev(prog.format(s=9), 0, 9.0), ev(prog.format(s=9), 1, 9.0), ev(prog.format(s=4), 2, 4.0),
           tb(GLOO_TIMEOUT, 0, 40.0), tb(GLOO_TIMEOUT, 1, 40.0), tb(GLOO_TIMEOUT, 2, 40.0)]
    rep = report(evs)
    ff = rep["first_failure"]
    assert ff["inferred"] and ff["rank"] == 2 and ff["confidence"] == "low"
    assert "progress" in ff["inferred_from"][0]
    assert rep["ranks"]["2"]["last_progress"]["step"] == 4


def test_nothing_found_and_missing_ranks_are_said():
    rep = report([ev("[2026-12-02 11:31:13,721] [INFO] [x.py:1:f] all good", 0, 1.0)], world_size=2,
                 rank_nodes={0: None})
    assert rep["first_failure"] is None and rep["blame"] == "unknown"
    assert rep["partial"] and {"rank": 1, "reason": "no log of this rank was given"} in rep["gaps"]


def test_phase_from_frames_wins_over_hints():
    frames = (("/w/train.py", 9, "<module>"), ("/site-packages/deepspeed/runtime/engine.py", 3600, "save_checkpoint"),
              ("/site-packages/torch/serialization.py", 900, "save"))
    rep = report([tb("OSError: [Errno 28] No space left on device", 0, 1.0, frames=frames)])
    ff = rep["first_failure"]
    assert ff["signature"] == "storage.enospc" and ff["phase"] == "checkpoint-save" and rep["blame"] == "infrastructure"
