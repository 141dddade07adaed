"""hang.py's inference on small built inputs: stacks, NCCL work status, silence, progress."""

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.events import KIND_STACK, Event, Frame
from firstfault.analysis.findings import Finding
from firstfault.analysis.hang import Work, stack_outlier, stopped_first, work_laggards

CAT = load_catalog()
S = 1_000_000_000
T0 = 1_796_205_000 * S
IN_ALLREDUCE = (Frame("/w/train.py", 209, "train_step"),
                Frame("/site-packages/torch/distributed/distributed_c10d.py", 3252, "all_reduce"))
IN_LOADER = (Frame("/w/train.py", 239, "main"), Frame("/w/train.py", 152, "__next__"))
WATCHDOG = ("[PG ID 0 PG GUID 0(default_pg) Rank {r}] Watchdog caught collective operation timeout: WorkNCCL("
            "SeqNum=880, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for "
            "600081 milliseconds before timing out.")
SIGTERM_SENT = ("W1203 06:29:24.670000 18322 site-packages/torch/distributed/elastic/multiprocessing/api.py:1028] "
                "Sending process 18346 closing signal SIGTERM")


def f(text, rank, t=0.0):
    return Finding(Event(text=text, source="ranklog", rank=rank, occurred_ns=T0 + int(t * S), clock="line",
                         uncertainty_ns=S // 1000), CAT.match(text))


def dump(frames, t=1.0):
    return Event(text="Current thread 0x1 (most recent call first):", source="ranklog", kind=KIND_STACK,
                 frames=frames, occurred_ns=T0 + int(t * S))


def progress(step, t):
    return Event(text=f"rank step {step} loss 1.0", source="ranklog", occurred_ns=T0 + int(t * S), clock="line",
                 uncertainty_ns=S // 1000)


def test_stack_outlier_needs_others_waiting_and_one_elsewhere():
    assert stack_outlier({0: IN_ALLREDUCE, 1: IN_LOADER, 2: IN_ALLREDUCE}) == (1, [0, 2])
    assert stack_outlier({1: IN_LOADER}, waiting=[0, 2]) == (1, [0, 2])  # others shown waiting by their timeouts
    assert stack_outlier({0: IN_LOADER, 1: IN_LOADER, 2: IN_ALLREDUCE})[0] is None  # two elsewhere: no one
    assert stack_outlier({0: IN_LOADER})[0] is None  # nobody waits


def test_work_laggards_are_ranks_that_never_enqueued_the_stuck_collective():
    work = [Work(r, "0", 880, 880, 879) for r in range(4)] + [Work(r, "0", None, 880, 879) for r in (4, 5, 7)]
    work.append(Work(6, "0", None, 879, 879))
    late, why = work_laggards(work)
    assert late == [6] and "below 880" in why and "0-3 timed out" in why
    assert work_laggards([Work(r, "0", 880, 880, 879) for r in range(4)]) == ([], "")


def test_stopped_first_prefers_stacks_then_work_then_silence_then_progress():
    timeouts = [f(WATCHDOG.format(r=r), r) for r in (0, 2)]
    inf = stopped_first(timeouts, range(3), {}, {1: dump(IN_LOADER)})
    assert (inf.rank, inf.confidence, inf.waiting) == (1, "medium", [0, 2]) and "in __next__" in inf.how[0]
    inf = stopped_first(timeouts, range(3), {}, work=[Work(0, "0", 880, 880, 879), Work(1, "0", None, 879, 879)])
    assert inf.rank == 1 and "never reached it" in inf.how[0]
    inf = stopped_first(timeouts, range(3), {})
    assert (inf.rank, inf.suspects, inf.confidence) == (1, [1], "medium")
    assert "(BROADCAST, sequence 880)" in inf.how[0]


def test_several_silent_ranks_are_suspects_and_progress_may_single_one_out():
    timeouts = [f(WATCHDOG.format(r=r), r) for r in range(4)]
    inf = stopped_first(timeouts, range(8), {})
    assert (inf.rank, inf.suspects, inf.confidence) == (None, [4, 5, 6, 7], "low")
    inf = stopped_first(timeouts, range(8), {5: progress(10, 1.0), 6: progress(12, 5.0)})
    assert (inf.rank, inf.suspects) == (5, [4, 5, 6, 7]) and "earliest" in inf.how[1]


def test_a_launchers_sigterm_is_no_sign_of_waiting():
    sent = f(SIGTERM_SENT, 1)  # rank 1 got SIGTERM from torchrun: it was not timing out
    inf = stopped_first([f(WATCHDOG.format(r=0), 0), sent], range(2), {})
    assert inf.rank == 1 and inf.confidence == "medium"


def test_nothing_stands_out():
    inf = stopped_first([f(WATCHDOG.format(r=r), r) for r in range(2)], range(2), {})
    assert inf.rank is None and inf.suspects == [] and inf.confidence == "low"


PEER_CLOSED = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:15546")
AFTER_STEP = (Frame("/w/train.py", 300, "main"), Frame("/w/train.py", 256, "train_step"),
              Frame("/w/train.py", 120, "after_step"))


def test_the_one_rank_without_a_timeout_whose_dump_is_outside_the_collective_is_the_suspect():
    """Rank 1 stopped after its optimizer step; rank 0 timed out in the loss all_reduce; rank 1 then lost
    its peer (a cascade of its own) and only it dumped its stack: still the suspect."""
    errors = [f(WATCHDOG.format(r=0), 0, 1.0), f(PEER_CLOSED, 1, 2.0)]
    inf = stopped_first(errors, [0, 1], {}, {1: dump(AFTER_STEP, 1.5)})
    assert (inf.rank, inf.confidence, inf.where) == (1, "medium", AFTER_STEP[-1])
    assert "reported no collective timeout" in inf.how[0]
    # with the same dump inside the collective, nothing singles it out
    assert stopped_first(errors, [0, 1], {}, {1: dump(IN_ALLREDUCE, 1.5)}).rank is None


def test_a_rank_that_timed_out_itself_is_no_laggard():
    """ProcessGroupNCCL's watchdog prints "Timeout at NCCL work: S, last enqueued NCCL work: E, last
    completed NCCL work: C" on the rank that timed out in S: that rank reached a collective and waits.
    Two runs pasted together (rank 0 stuck at 100015, rank 1 at 4013) single out no one."""
    work = [Work(0, "0", 100015, 100022, 100014), Work(1, "0", 4013, 4013, 4012)]
    assert work_laggards(work) == ([], "")
    timeouts = [f(WATCHDOG.format(r=r).replace("880", "100015" if r == 0 else "4013"), r) for r in (0, 1)]
    inf = stopped_first(timeouts, range(2), {}, work=work)
    assert inf.rank is None and inf.confidence == "low"
    # a rank that printed its status on the dump signal only (no timeout of its own) still lags
    assert work_laggards([Work(0, "0", 880, 880, 879), Work(1, "0", None, 879, 879)])[0] == [1]


def test_a_rank_known_only_by_its_number_is_a_suspect_never_the_rank():
    """World size unknown, only rank 1's lines, rank 0 printed nothing: rank 0 exists (ranks are numbered
    from 0) but a paste of one rank's lines may simply leave the others out, so its silence names no one."""
    timeouts = [f(WATCHDOG.format(r=1), 1)]
    inf = stopped_first(timeouts, range(2), {}, implied=[0])
    assert (inf.rank, inf.suspects, inf.confidence) == (None, [0], "low") and "missing from the text" in inf.how[-1]
    inf = stopped_first([f(WATCHDOG.format(r=r), r) for r in (2,)], range(3), {}, implied=[0, 1])
    assert (inf.rank, inf.suspects, inf.confidence) == (None, [0, 1], "low")
    # a gap between ranks whose lines were given is a rank that printed nothing
    inf = stopped_first([f(WATCHDOG.format(r=r), r) for r in (0, 2, 3)], range(4), {}, implied=[1])
    assert (inf.rank, inf.confidence) == (1, "medium")
    # the same silence of a rank whose lines were given (or with the world size known) still counts
    assert stopped_first(timeouts, range(2), {}).rank == 0


def test_the_only_rank_seen_is_not_called_the_one_not_waiting_when_it_waits():
    """One rank's watchdog timeout alone: that rank waited; nothing says who stopped."""
    inf = stopped_first([f(WATCHDOG.format(r=0), 0)], [0], {})
    assert inf.rank is None and inf.suspects == [] and inf.confidence == "low"


AGENT_EXIT = ("E1202 10:12:00.462000 2611 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: {code}) "
              "local_rank: {r} (pid: 427{r}) of binary: /usr/bin/python3")


def test_a_rank_its_watchdog_aborted_waited_and_one_killed_by_sigkill_did_not():
    from dataclasses import replace
    # judge.py turns a SIGABRT after a collective timeout into a cascade: the watchdog took that rank down
    timeout = f(WATCHDOG.format(r=0), None)  # a watchdog line no rank prefix names (a title, a copy)
    abort = f(AGENT_EXIT.format(code=-6, r=0), 0)
    abort = replace(abort, match=replace(abort.match, role="cascade", category="cascade"))
    inf = stopped_first([timeout, abort], range(2), {})
    assert inf.rank == 1  # rank 0 waited (its watchdog aborted it); rank 1 said nothing
    inf = stopped_first([timeout, abort], [0], {})
    assert inf.rank is None  # the one rank seen waited: no one stands out
    # not-example: a launcher's report of a SIGTERM it sent is still no sign of waiting
    sent = f(SIGTERM_SENT, 1)
    inf = stopped_first([f(WATCHDOG.format(r=0), 0), sent], range(2), {})
    assert inf.rank == 1
    # not-example: after a timeout ANOTHER named rank reported, an aborted rank stays the suspect
    named = f(WATCHDOG.format(r=0), 0)
    abort1 = f(AGENT_EXIT.format(code=-6, r=1), 1)
    abort1 = replace(abort1, match=replace(abort1.match, role="cascade", category="cascade"))
    assert stopped_first([named, abort1], range(2), {}).rank == 1


def _timed_out(rank, op, seq=3742816):
    # ProcessGroupNCCL's watchdog line of PyTorch 1.12-2.1 ("[Rank N] Watchdog caught ...")
    return f(f"[E ProcessGroupNCCL.cpp:737] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL("
             f"SeqNum={seq}, OpType={op}, Timeout(ms)=1800000) ran for 1801750 milliseconds before timing out.", rank)


def test_the_one_rank_in_another_collective_at_the_same_sequence_left_the_common_path():
    errors = [_timed_out(1, "_ALLGATHER_BASE"), _timed_out(0, "REDUCE"), _timed_out(5, "_ALLGATHER_BASE")]
    inf = stopped_first(errors, [0, 1, 5], {})
    assert (inf.rank, inf.confidence) == (0, "medium")
    assert "rank 0 timed out in REDUCE while rank(s) 1,5 timed out in _ALLGATHER_BASE" in inf.how[0]


def test_collectives_that_differ_without_a_majority_single_out_no_one():
    two = [_timed_out(0, "REDUCE"), _timed_out(1, "_ALLGATHER_BASE")]  # one against one: either may have strayed
    assert stopped_first(two, [0, 1], {}).rank is None
    three_ways = [_timed_out(0, "REDUCE"), _timed_out(1, "_ALLGATHER_BASE"), _timed_out(2, "ALLREDUCE")]
    assert stopped_first(three_ways, [0, 1, 2], {}).rank is None
    other_seqs = [_timed_out(0, "REDUCE", seq=7), _timed_out(1, "ALLREDUCE", seq=8), _timed_out(2, "ALLREDUCE", seq=8)]
    assert stopped_first(other_seqs, [0, 1, 2], {}).rank is None  # different sequence numbers: no comparison
