"""verdict.py's rules one by one, on small Findings built from real lines (the catalog matches them)."""

from dataclasses import replace

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.events import KIND_KERNEL, Event, Frame
from firstfault.analysis.failure_phase import phase_of
from firstfault.analysis.findings import Finding, exit_of, fingerprint
from firstfault.analysis.identify import link_identity, link_kernel
from firstfault.analysis.judge import judge_signals
from firstfault.analysis.rankstate import rank_firsts
from firstfault.analysis.verdict import confidence, distinct_failures

CAT = load_catalog()
S = 1_000_000_000
T0 = 1_796_205_000 * S

AGENT = "E1202 10:12:00.462000 2611 torch/distributed/elastic/multiprocessing/api.py:1002] "
SIGKILL = AGENT + "failed (exitcode: -9) local_rank: 1 (pid: 4271) of binary: /usr/bin/python3"
SIGABRT = AGENT + "failed (exitcode: -6) local_rank: 0 (pid: 4270) of binary: /usr/bin/python3"
OOM_KILL = ("Memory cgroup out of memory: Killed process 4271 (python3.11) total-vm:1979768kB, anon-rss:1053432kB, "
            "file-rss:101796kB, shmem-rss:0kB, UID:0 pgtables:2644kB oom_score_adj:0")
GLOO_TIMEOUT = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                "Timed out waiting 20000ms for recv operation to complete")
GLOO_CLOSED = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
               "closed by peer [127.0.0.1]:21920. This is typically caused by a remote worker crashing.")


def finding(text, rank=None, t=0.0, unc=0.001, frames=(), **kw) -> Finding:
    kw.setdefault("source", "ranklog")
    ev = Event(text=text, rank=rank, occurred_ns=T0 + int(t * S), clock="line", uncertainty_ns=int(unc * S),
               stream=kw.pop("stream", f"s{rank}"), frames=tuple(Frame(*f) for f in frames), **kw)
    m = CAT.match(text)
    assert m is not None, text
    return Finding(ev, m)


def test_exit_of_reads_codes_and_names_signals():
    assert exit_of(finding(SIGKILL)) == {"code": -9, "signal": "SIGKILL"}
    assert exit_of(finding("  traceback : Signal 6 (SIGABRT) received by PID 4270")) == {"code": None,
                                                                                          "signal": "SIGABRT"}
    assert exit_of(finding("  exitcode  : 1 (pid: 1886)")) == {"code": 1, "signal": None}
    assert exit_of(finding(GLOO_CLOSED)) is None


def test_link_identity_from_groups_local_ranks_and_pids():
    kill = finding(SIGKILL, source="launcher")
    sig = finding("  traceback : Signal 9 (SIGKILL) received by PID 4271", source="launcher")
    (kill, sig), pids = link_identity([kill, sig], single_node=True)
    assert pids == {4271: 1} and kill.ev.rank == 1 and sig.ev.rank == 1  # a line naming only a pid
    other = finding(SIGKILL, source="launcher")
    (other,), pids = link_identity([other], single_node=False)
    assert pids == {} and other.ev.rank is None  # local != global


def test_link_kernel_by_pid_and_by_the_one_sigkilled_rank():
    kill, oom = finding(SIGKILL, 1, 2.0, source="launcher"), finding(OOM_KILL, None, 1.0, source="kernel",
                                                                     kind=KIND_KERNEL)
    kill, oom = link_kernel([kill, oom], {4271: 1}, {1: "gpu-7"})
    assert oom.ev.rank == 1 and oom.links == ["pid 4271 is rank 1"] and oom.ev.node == "gpu-7"
    kill2 = finding("torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL",
                    1, 2.0, source="launcher")  # no pid named
    oom2 = finding(OOM_KILL, None, 1.0, source="kernel", kind=KIND_KERNEL)
    kill2, oom2 = link_kernel([kill2, oom2], {}, {1: None})
    assert oom2.ev.rank == 1 and "only rank that died by SIGKILL" in oom2.links[0]


def test_link_kernel_leaves_another_jobs_kill_before_this_job_as_context():
    oom = finding(OOM_KILL, None, -600.0, source="kernel", kind=KIND_KERNEL, node="gpu-7")
    (oom,) = link_kernel([oom], {1234: 0}, {0: "gpu-7"}, started={"gpu-7": T0})
    assert oom.role == "context" and oom.ev.rank is None and "another job's" in oom.links[0]


def test_an_oom_kill_of_a_pid_that_is_none_of_the_ranks_is_another_processs():
    kill = finding(SIGKILL, 1, 2.0, source="launcher")
    foreign = finding(OOM_KILL.replace("4271", "7131"), None, 1.0, source="kernel", kind=KIND_KERNEL)
    kill, foreign = link_kernel([kill, foreign], {4270: 0, 4271: 1}, {0: None, 1: None})
    assert foreign.role == "context" and foreign.ev.rank is None and "none of the job's ranks" in foreign.links[0]


def test_fingerprint_blanks_numbers_and_keeps_messages_only_for_generic_exceptions():
    a, b = finding("ValueError: label 103 out of range", 0), finding("ValueError: label 7 out of range", 1)
    assert fingerprint(a) == fingerprint(b) == "python.exception|ValueError: label # out of range"
    assert fingerprint(finding(GLOO_TIMEOUT, 0)) == "gloo.timeout|"


def test_a_rank_first_is_its_earliest_root_else_its_earliest_cascade():
    early_casc, late_root = finding(GLOO_CLOSED, 0, 1.0), finding("KeyError: 'x'", 0, 5.0)
    only_casc = finding(GLOO_TIMEOUT, 1, 2.0)
    firsts = rank_firsts([early_casc, only_casc, late_root])
    assert firsts == {0: late_root, 1: only_casc}


def test_distinct_failures_group_by_fingerprint_in_time_order_and_keep_rankless_roots():
    r2, r3 = finding("ValueError: bad 1", 2, 3.0), finding("ValueError: bad 2", 3, 3.1)
    kern = finding(OOM_KILL, None, 1.0, source="kernel", kind=KIND_KERNEL)
    findings = [kern, r2, r3]
    groups = distinct_failures(findings, rank_firsts(findings), {fingerprint(r2): 5})
    assert [g.findings[0] for g in groups] == [kern, r2]
    assert groups[1].ranks == [2, 3] and groups[1].count == 5 and groups[0].ranks == []


def test_phase_from_frames_then_one_hint_then_a_save_then_the_waiting_ranks():
    frames = (("/w/train.py", 1, "main"), ("/ds/runtime/engine.py", 2, "backward"))
    assert phase_of(finding("ValueError: x", 0, frames=frames), None, []) == ("backward", "frames")
    assert phase_of(finding("Exception: Current loss scale already at minimum - cannot decrease scale anymore. "
                            "Exiting run.", 0), None, []) == ("optimizer-step", "signature")
    kill = finding(SIGKILL, 1, 5.0)
    assert phase_of(kill, T0 + 4 * S, []) == ("checkpoint-save", "checkpoint save under way")
    waiting = finding(GLOO_CLOSED, 0, 6.0, frames=(("/ds/runtime/zero/stage_1_and_2.py", 3, "step"),))
    assert phase_of(kill, None, [waiting]) == ("optimizer-step", "stacks of the ranks waiting for it")
    assert phase_of(kill, None, []) == ("unknown", "no evidence")


def test_confidence_is_high_only_for_a_specific_signature_on_a_known_rank_untied_and_uncapped():
    oom = finding("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1", 1)
    assert confidence(oom, False) == "high"
    assert confidence(oom, True) == "medium"
    assert confidence(finding("ValueError: x", 1), False) == "medium"  # generic
    assert confidence(finding("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"), False) == "medium"
    oom = replace(oom, cap="low")
    assert confidence(oom, False) == "low"


def test_a_sigkill_without_kernel_evidence_is_likely_host_memory_at_low_confidence():
    kill = finding(SIGKILL, 1, 5.0, source="launcher")
    (kill,) = judge_signals([kill], {}, {1: "gpu-7"})
    assert kill.category == "host-memory" and kill.cap == "low" and "dmesg -T" in kill.links[0]


def test_a_sigkill_the_nodes_kernel_log_covers_without_an_oom_kill_stays_unknown():
    kill = finding(SIGKILL, 1, 5.0, source="launcher", node="gpu-7")
    (kill,) = judge_signals([kill], {"gpu-7": (T0, T0 + 10 * S)}, {1: "gpu-7"})
    assert kill.category == "unknown" and kill.cap == "medium" and "holds no OOM kill" in kill.links[0]
    late = finding(SIGKILL, 1, 500.0, source="launcher", node="gpu-7")  # the log ends long before the kill
    (late,) = judge_signals([late], {"gpu-7": (T0, T0 + 10 * S)}, {1: "gpu-7"})
    assert late.category == "host-memory"


def test_a_sigkill_the_kernel_explains_is_left_to_the_kernels_finding():
    kill, oom = finding(SIGKILL, 1, 5.0, source="launcher"), finding(OOM_KILL, 1, 4.0, source="kernel")
    kill, oom = judge_signals([kill, oom], {}, {1: None})
    assert kill.category == "unknown" and kill.cap is None and kill.links == []


def test_sigabrt_after_a_collective_timeout_is_a_cascade_and_before_any_it_is_a_root():
    timeout, abort = finding(GLOO_TIMEOUT, 0, 1.0), finding(SIGABRT, 0, 2.0, source="launcher")
    timeout, abort = judge_signals([timeout, abort], {}, {})
    assert abort.role == "cascade" and abort.category == "cascade" and "after a collective timeout" in abort.links[0]
    other_rank = finding(SIGABRT.replace("local_rank: 0", "local_rank: 2"), 2, 2.0, source="launcher")
    _, other_rank = judge_signals([timeout, other_rank], {}, {})
    assert other_rank.role == "cascade"  # another rank timed out before it
    first = finding("Fatal Python error: Aborted", 3, 0.5)
    first, _ = judge_signals([first, timeout], {}, {})
    assert first.role == "root" and first.cap == "medium"  # nothing had timed out yet: the abort is the failure


NCCL_TIMEOUT = ("[rank1]:[E1202 10:11:59.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation "
                "timeout: WorkNCCL(SeqNum=80, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for "
                "600451 milliseconds before timing out.")


def test_sigabrt_printed_below_an_untimed_watchdog_timeout_in_one_paste_is_a_cascade():
    # a paste: the watchdog line has no time the reader trusts, torchrun's exit line comes below it
    timeout = replace(finding(NCCL_TIMEOUT, None, stream="paste", seq=3), ev=replace(
        finding(NCCL_TIMEOUT, None, stream="paste", seq=3).ev, occurred_ns=None))
    abort = finding(SIGABRT, 0, 2.0, source="launcher", stream="paste", seq=9)
    _, abort = judge_signals([timeout, abort], {}, {})
    assert abort.role == "cascade" and abort.category == "cascade"
    # not-example: the same abort printed ABOVE the timeout in that paste stays a root (capped)
    above = finding(SIGABRT, 0, 2.0, source="launcher", stream="paste", seq=1)
    _, above = judge_signals([timeout, above], {}, {})
    assert above.role == "root" and above.cap == "medium"
    # and a timeout in another, untimed stream orders nothing
    elsewhere = replace(timeout, ev=replace(timeout.ev, stream="other"))
    _, alone = judge_signals([elsewhere, above], {}, {})
    assert alone.role == "root"
