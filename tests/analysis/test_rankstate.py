"""rankstate.py (and identify.py): identity from folders and prefixes, progress and signs of life, on small built Findings."""

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.events import KIND_STACK, Event, Frame
from firstfault.analysis.findings import Finding
from firstfault.analysis.identify import identify
from firstfault.analysis.rankstate import collect, nccl_work, stack_dumps

CAT = load_catalog()
S = 1_000_000_000
T0 = 1_796_205_000 * S
W = "logs/r_x/attempt_0/{l}/{name}"


def f(text, rank=None, t=0.0, frames=(), **kw):
    kw.setdefault("source", "ranklog")
    ev = Event(text=text, rank=rank, occurred_ns=T0 + int(t * S), clock="line", frames=tuple(Frame(*x) for x in frames),
               **kw)
    return Finding(ev, CAT.match(text))


def test_a_worker_folders_error_json_takes_the_rank_its_own_lines_carry():
    log = f("ValueError: boom", 2, stream=W.format(l=0, name="stderr.log"), node="node1")
    err = f("ValueError: boom", None, stream=W.format(l=0, name="error.json"), node="node1")
    other = f("ValueError: other", None, stream="launcher.log", node="node1")
    ident = identify([log, err, other], {})
    (log, err, other), nodes = ident.findings, ident.rank_nodes
    assert err.ev.rank == 2 and other.ev.rank is None and nodes == {2: "node1"}


def test_on_one_node_a_tee_prefix_names_the_rank_and_torchruns_host_only_fills_gaps():
    line = f("Fatal Python error: Aborted", None, local_rank=1, stream="launcher.log")
    ident = identify([line], {})
    (line,), single = ident.findings, ident.single_node
    assert single and line.ev.rank == 1
    rank = f("  rank      : 0 (local_rank: 0)", stream="c", seq=5, node="node0")
    host = f("  host      : localhost", stream="c", seq=4, node="node0")
    nodes = identify([host, rank], {}).rank_nodes
    assert nodes[0] == "node0"  # the folder's node, not torchrun's "localhost"


def test_life_outside_a_save_and_inside_it():
    prog = f("[default0]:rank 0 step 4 loss 1.2", 0, 1.0)
    in_save = f("RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1", 0, 3.0,
                frames=(("/ds/runtime/engine.py", 1, "save_checkpoint"), ("/t/distributed_c10d.py", 2, "barrier")))
    outside = f("RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1", 1, 2.0,
                frames=(("/w/train.py", 1, "train_step"), ("/t/distributed_c10d.py", 2, "all_reduce")))
    dump = Event(text="Current thread 0x1 (most recent call first):", source="ranklog", kind=KIND_STACK,
                 frames=(Frame("/w/train.py", 152, "__next__"),), occurred_ns=T0 + 4 * S)
    facts = collect([prog, in_save, outside], {0: None, 1: None}, {}, {2: dump})
    assert facts.steps == {0: 4} and facts.progress[0] is prog.ev
    # rank 0's step line speaks through its step (4), not its place among other ranks' lines
    assert facts.in_save == {0: T0 + 3 * S} and facts.alive == {1: T0 + 2 * S, 2: T0 + 4 * S}


def test_an_error_in_a_training_step_after_a_ranks_step_n_line_shows_it_reached_step_n_plus_1():
    prog = f("rank 2 step 4 loss 1.2", 2, stream="r2", seq=10)
    err = f("ValueError: feature vector has 17 columns", 2, stream="r2", seq=40,
            frames=(("/w/train.py", 1, "train_step"), ("/ds/runtime/engine.py", 2, "forward")))
    facts = collect([prog, err], {2: None}, {}, {})
    assert facts.steps == {2: 4} and facts.reached == {2: 5}


def test_dumps_per_rank_and_nccl_work_status():
    a = Event(text="x", source="ranklog", kind=KIND_STACK, local_rank=1, occurred_ns=None)
    b = Event(text="x", source="ranklog", kind=KIND_STACK, local_rank=1, occurred_ns=T0)
    assert stack_dumps([b, a], {}, single=True).latest == {1: b}  # the timed dump wins
    assert stack_dumps([a], {}, single=False).latest == {}
    work = nccl_work([f("[rank3]:[E1203 09:20:13.223000 4003 ProcessGroupNCCL.cpp:2097] [PG 0 (default_pg) Rank 3] "
                        "Timeout at NCCL work: 880, last enqueued NCCL work: 880, last completed NCCL work: 879.", 3)])
    assert [(w.rank, w.pg, w.seq, w.enqueued, w.completed) for w in work] == [(3, "0", 880, 880, 879)]
