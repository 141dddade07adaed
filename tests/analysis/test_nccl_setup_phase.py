"""NCCL's error back trace (checks.h NCCLCHECK: ``INFO(NCCL_ALL, "%s:%d -> %d")``, and from 2.28
``"%s:%d (%s) -> %d"``) names each call the error climbed out of. A trace through src/init.cc
(ncclCommInitRank, ncclCommInitAll, ncclCommSplit) is a communicator being set up: the job's
set-up, even when PyTorch made the communicator at the group's first collective. Made-up hosts,
pids and paths; the line shapes are NCCL's and PyTorch's."""

from __future__ import annotations

from tests.offline.scoring import first_failure_of

# Two processes on one host fail to reach the bootstrap root while making the communicator;
# the worker's PyTorch error names only the collective (its frames cut by the paste).
SETUP = """\
n07:4410:4522 [0] NCCL INFO misc/socket.cc:484 -> 2 (Connection refused)
n07:4411:4523 [1] NCCL INFO misc/socket.cc:484 -> 2 (Connection refused)
n07:4410:4522 [0] NCCL INFO misc/socket.cc:571 -> 2
n07:4411:4523 [1] NCCL INFO misc/socket.cc:571 -> 2
n07:4410:4522 [0] NCCL INFO bootstrap.cc:274 -> 2
n07:4411:4523 [1] NCCL INFO bootstrap.cc:274 -> 2
n07:4410:4522 [0] NCCL INFO init.cc:1501 -> 2
n07:4411:4523 [1] NCCL INFO init.cc:1501 -> 2
n07:4410:4522 [0] NCCL INFO group.cc:64 -> 2 [Async thread]
n07:4411:4523 [1] NCCL INFO group.cc:64 -> 2 [Async thread]
[rank3]:   File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2288, in all_reduce
[rank3]:     work = group.allreduce([tensor], opts)
[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1975, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
"""

# NCCL 2.28's trace names the function too
SETUP_228 = """\
gpu3:981:1040 [2] NCCL INFO misc/socket.cc:532 (socketStartConnect) -> 2 (No route to host)
gpu3:981:1040 [2] NCCL INFO bootstrap.cc:301 (bootstrapInit) -> 2
gpu3:981:1040 [2] NCCL INFO init.cc:1622 (ncclCommInitRankFunc) -> 2
"""

# The WARN says what failed (a CUDA call while allocating a channel); the back trace under it climbs
# through the communicator's set-up
WARN_THEN_SETUP = """\
ws-12:3150:3301 [0] include/alloc.h:112 NCCL WARN Cuda failure 2 'out of memory'
ws-12:3150:3301 [0] NCCL INFO include/alloc.h:199 -> 1
ws-12:3150:3301 [0] NCCL INFO channel.cc:41 -> 1
ws-12:3150:3301 [0] NCCL INFO init.cc:530 -> 1
ws-12:3150:3301 [0] NCCL INFO init.cc:1550 -> 1
ws-12:3150:3301 [0] NCCL INFO group.cc:64 -> 1 [Async thread]
"""

# A proxy's send fails in training: the trace climbs through the network transport and the
# proxy, never through init.cc
RUNTIME = """\
n07:4410:4590 [0] NCCL INFO transport/net_socket.cc:541 -> 2
n07:4410:4590 [0] NCCL INFO transport/net.cc:1134 -> 2
n07:4410:4590 [0] NCCL INFO proxy.cc:858 -> 2
n07:4410:4590 [0] NCCL INFO proxy.cc:1012 -> 2 [Proxy Thread]
"""


def test_a_trace_through_init_cc_is_set_up():
    ff = first_failure_of(SETUP)
    assert ff["category"] == "network"
    assert ff["phase"] == "init"
    assert "init.cc" in ff["phase_from"]


def test_the_2_28_trace_with_function_names_is_set_up_too():
    ff = first_failure_of(SETUP_228)
    assert (ff["category"], ff["phase"]) == ("network", "init")


def test_a_trace_through_the_proxy_is_not_set_up():
    ff = first_failure_of(RUNTIME)
    assert ff["category"] == "network"
    assert ff["phase"] != "init"


def test_init_cc_returning_success_is_no_failure():
    assert first_failure_of("n07:4410:4522 [0] NCCL INFO init.cc:1501 -> 0\n") is None


def test_a_warn_whose_back_trace_climbs_through_init_cc_is_set_up():
    ff = first_failure_of(WARN_THEN_SETUP)
    assert ff["signature"] == "nccl.cuda_oom"  # the WARN, not its back trace, is the failure
    assert ff["phase"] == "init"


# Horovod's NCCL ops (horovod/common/ops/nccl_operations.cc: "ncclCommInitRank failed: " +
# ncclGetErrorString) raised through TensorFlow; cupy's NcclError names its call the same way.
COMM_INIT_NAMED = """\
tensorflow.python.framework.errors_impl.UnknownError:  ncclCommInitRank failed: unhandled system error
srun: error: node12: task 1: Exited with exit code 1
"""

ALLREDUCE_NAMED = "RuntimeError: ncclAllReduce failed: unhandled system error\n"


def test_an_error_naming_ncclcomminitrank_is_set_up():
    ff = first_failure_of(COMM_INIT_NAMED)
    assert (ff["category"], ff["phase"]) == ("network", "init")
    assert "ncclCommInitRank" in ff["phase_from"]


def test_an_error_naming_a_collective_call_is_not_set_up():
    assert first_failure_of(ALLREDUCE_NAMED)["phase"] != "init"


# Two processes of one host fail in the communicator's set-up: the first one's trace, pasted from
# its middle, shows only group.cc; the second's WARN (the peer's socket closed) has its trace under
# it through transport.cc and init.cc, which becomes that WARN's link (lasterror).
TWO_PROCESSES = """\
n07:4410:4522 [0] NCCL INFO group.cc:64 -> 2 [Async thread]
n07:4410:4410 [0] NCCL INFO group.cc:418 -> 2
n07:4411:4523 [1] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer n07<41222>
n07:4411:4523 [1] NCCL INFO misc/socket.cc:750 -> 6
n07:4411:4523 [1] NCCL INFO transport/p2p.cc:240 -> 3
n07:4411:4523 [1] NCCL INFO transport.cc:148 -> 3
n07:4411:4523 [1] NCCL INFO init.cc:1117 -> 3
n07:4411:4523 [1] NCCL INFO group.cc:64 -> 3 [Async thread]
"""


def test_another_process_trace_through_init_cc_in_the_paste_is_set_up_too():
    ff = first_failure_of(TWO_PROCESSES)
    assert ff["signature"] == "nccl.trace_system_error" and ff["phase"] == "init"


def test_without_any_trace_through_init_cc_the_paste_says_no_set_up():
    ff = first_failure_of(TWO_PROCESSES.replace("init.cc:1117", "proxy.cc:1076"))
    assert ff["phase"] != "init"


# A collective that made its group's communicator and failed there: ProcessGroupNCCL's C10D_NCCL_CHECK
# ("NCCL error in: <file>:<line>, <ncclGetErrorString>, NCCL version <v>", then the result's name and
# description), raised at the call (a barrier, DDP's first broadcast).
_SETUP_ERROR = [
    "Traceback (most recent call last):",
    '  File "/srv/job/main.py", line 40, in <module>',
    "    run(cfg)",
    '  File "/srv/job/main.py", line 22, in run',
    "    dist.barrier()",
    '  File "/opt/venv/lib/python3.8/site-packages/torch/distributed/distributed_c10d.py", line 2420, in barrier',
    "    work = default_pg.barrier(opts=opts)",
    "RuntimeError: NCCL error in: /opt/pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system error, "
    "NCCL version 2.7.8",
    "ncclSystemError: System call (socket, malloc, munmap, etc) failed.",
    "",
]


def test_an_nccl_error_of_communicator_set_up_before_any_progress_is_init():
    ff = first_failure_of("\n".join(_SETUP_ERROR))
    assert (ff["signature"], ff["phase"]) == ("nccl.system_error", "init")
    assert "communicator's set-up" in ff["phase_from"]


def test_the_same_error_after_training_progress_names_no_phase_from_its_kind():
    progress = "Epoch 3:  42%|████▏     | 210/500 [01:45<02:25,  2.00it/s]"
    ff = first_failure_of("\n".join([progress, *_SETUP_ERROR]))
    assert ff["signature"] == "nccl.system_error"
    assert ff["phase"] != "init"


def test_the_watchdog_reporting_that_error_later_names_no_phase_from_its_kind():
    ff = first_failure_of("[E ProcessGroupNCCL.cpp:414] [Rank 3] found async exception when checking for NCCL "
                          "errors: NCCL error: unhandled system error, NCCL version 2.10.3\n")
    assert ff["signature"] == "nccl.system_error"
    assert ff["phase"] != "init"
