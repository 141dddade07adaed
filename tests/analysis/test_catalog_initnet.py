"""Job start-up, the network and launch configuration: NCCL's communicator set-up and error back
traces, the "Last error:" cause under an ncclResult, c10d's env:// and no-GPU checks, the device
ordinal a launch asks for, mpirun's start-up, Slurm's task launch and the rendezvous store.

Every line here is written from the format strings of the sources (NCCL 2.10-2.29 init.cc,
transport/net.cc, checks.h, bootstrap.cc, net_socket.cc; PyTorch rendezvous.py,
ProcessGroupNCCL.cpp, c10d_rendezvous_backend.py; Open MPI help texts; Slurm step_launch.c and
slurm_errno.c) with made-up values; none is copied from a user's log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.lasterror import MAX_GAP, TRACE, TRACE_REACH, WRAPPER, prefer_details
from tests.analysis.catalog_lines import assert_line
from tests.offline.scoring import first_failure_of

CATALOG = load_catalog()

# (line, signature id, role, category, facts it must carry)
LINES = [
    # init.cc 2.10-2.17: the rank of this process in its communicator
    ("gpu-03:4411:4411 [1] NCCL INFO comm 0x5581a2b3c4d0 rank 5 nranks 8 cudaDev 1 busId 1b000 - Init COMPLETE",
     "nccl.comm_rank", "context", "unknown", {"rank": "5", "nranks": "8", "pid": "4411"}),
    # 2.19+: funcName first, Init START
    ("gpu-03:4411:4411 [1] NCCL INFO ncclCommInitRankConfig comm 0x5581a2b3c4d0 rank 5 nranks 8 cudaDev 1 "
     "nvmlDev 1 busId 1b000 commId 0x1f2e3d4c5b6a7988 - Init START",
     "nccl.comm_rank", "context", "unknown", {"rank": "5", "cuda_dev": "1"}),
    # net.cc: [send] names this rank first, [receive] second
    ("gpu-03:4411:4470 [1] NCCL INFO Channel 02/0 : 5[1b000] -> 6[3d000] [send] via NET/IB/0",
     "nccl.comm_rank", "context", "unknown", {"rank": "5"}),
    ("gpu-03:4411:4470 [1] NCCL INFO Channel 02/0 : 4[1b000] -> 5[3d000] [receive] via NET/IB/0",
     "nccl.comm_rank", "context", "unknown", {"rank": "5"}),
    # checks.h back traces, 2.10-2.27 and 2.28+
    ("gpu-03:4411:4470 [1] NCCL INFO transport/net.cc:612 -> 2",
     "nccl.trace_system_error", "root", "network", {"site": "transport/net.cc:612"}),
    ("gpu-03:4411:4470 [1] NCCL INFO misc/socket.cc:512 (socketFinalizeAccept) -> 2 (Connection reset by peer)",
     "nccl.trace_system_error", "root", "network", {"error": "Connection reset by peer"}),
    ("gpu-03:4411:4470 [1] NCCL INFO transport/net.cc:1190 -> 6 [Proxy Thread]",
     "nccl.trace_remote_error", "cascade", "cascade", {}),
    ("gpu-03:4411:4411 [1] NCCL INFO init.cc:1702 -> 5",
     "nccl.trace_invalid_usage", "root", "config", {"code": "5"}),
    # bootstrap.cc / net_socket.cc
    ("gpu-03:4411:4470 [1] bootstrap.cc:73 NCCL WARN Message truncated : received 4128 bytes instead of 4096",
     "nccl.bootstrap_truncated", "root", "config", {"got": "4128", "want": "4096"}),
    ("gpu-03:4411:4470 [1] transport/net_socket.cc:483 NCCL WARN NET/Socket : peer 10.9.8.7<51122> message "
     "truncated : receiving 2097152 bytes instead of 1048576",
     "nccl.socket_message_truncated", "root", "user-code", {"peer": "10.9.8.7<51122>"}),
    # launch configuration
    ("[rank9]: RuntimeError: CUDA error: invalid device ordinal",
     "cuda.invalid_device_ordinal", "root", "config", {}),
    ("gpu-03:4411:4411 [0] init.cc:1490 NCCL WARN Cuda failure 101 'invalid device ordinal'",
     "cuda.invalid_device_ordinal", "root", "config", {}),
    ("ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable "
     "WORLD_SIZE expected, but not set",
     "c10d.env_var_not_set", "root", "config", {"var": "WORLD_SIZE"}),
    ("ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!",
     "c10d.nccl_no_gpus", "root", "config", {}),
    # Open MPI / PRRTE
    ("There are not enough slots available in the system to satisfy the 32 slots",
     "mpi.not_enough_slots", "root", "config", {"slots": "32"}),
    ("PRTE has lost communication with a remote daemon.\n\n  HNP daemon   : [prterun-a-1@0,0] on node node-a\n"
     "  Remote daemon: [prterun-a-1@0,2] on node node-c\n",
     "mpi.daemon_lost", "root", "network", {"host": "node-c"}),
    ("ORTE was unable to reliably start one or more daemons.",
     "mpi.daemon_start_failed", "root", "config", {}),
    # Slurm task launch: who refused it says the category
    ("srun: error: Task launch for StepId=77.0 failed on node gpu-12: Job credential expired",
     "slurm.task_launch_rejected", "root", "config", {"host": "gpu-12"}),
    ("srun: error: Task launch for StepId=77.0 failed on node gpu-12: Socket timed out on send/recv operation",
     "slurm.task_launch_unreachable", "root", "network", {"host": "gpu-12"}),
    ("srun: error: Task launch for StepId=77.0 failed on node gpu-12: Job credential revoked",
     "slurm.task_launch_failed", "root", "unknown", {}),
]

# lines that must not be read as what they look like
NOT = [
    # the bracket after host:pid:tid is the CUDA device, not a rank; P2P channels name no NET
    ("gpu-03:4411:4470 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC", "nccl.comm_rank"),
    # a split communicator's rank is a group rank
    ("gpu-03:4411:4411 [1] NCCL INFO ncclCommSplit comm 0x55 rank 0 nranks 2 cudaDev 1 nvmlDev 1 busId 1b000 "
     "parent 0x44 color 3 key 5 commId 0x1 - Init COMPLETE", "nccl.comm_rank"),
    # channel and tree lines hold " -> 2" too
    ("gpu-03:4411:4470 [1] NCCL INFO Channel 01/0 : 1[1b000] -> 2[3d000] [send] via NET/Socket/1",
     "nccl.trace_system_error"),
    ("gpu-03:4411:4470 [1] NCCL INFO Trees [0] 2/-1/-1->1->0 [1] 2/-1/-1->1->0", "nccl.trace_system_error"),
    # another CUDA error is not a launch misconfiguration
    ("RuntimeError: CUDA error: invalid device function", "cuda.invalid_device_ordinal"),
    # a monitoring frame: the rendezvous store was lost while training, not at start-up
    ('  File "/x/torch/distributed/elastic/rendezvous/dynamic_rendezvous.py", line 1079, in num_nodes_waiting\n'
     '    self._state_holder.sync()\n'
     '  File "/x/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 113, in _call_store\n'
     '    return getattr(self._store, store_op)(*args, **kwargs)\n'
     'RuntimeError: Connection reset by peer', "torchelastic.rendezvous_store_failed"),
]


@pytest.mark.parametrize("line,sig,role,category,facts", LINES, ids=[f"{s}-{i}" for i, (_, s, *_r) in enumerate(LINES)])
def test_line(line, sig, role, category, facts):
    assert_line(CATALOG, line, sig, role, category, facts)


@pytest.mark.parametrize("line,sig", NOT, ids=[s for _, s in NOT])
def test_not(line, sig):
    m = CATALOG.match(line)
    assert m is None or m.signature.id != sig


def test_the_wrappers_carry_the_trait():
    assert {"nccl.system_error", "nccl.internal_error", "nccl.unhandled_cuda_error", "nccl.invalid_usage",
            "c10d.dist_error"} <= CATALOG.ids_with(WRAPPER)
    assert "nccl.ofi_setup_failed" not in CATALOG.ids_with(WRAPPER)


# --- lasterror.prefer_details on findings of its own shape --------------------------------------

@dataclass
class _Ev:
    stream: str
    seq: int
    rank: int | None
    text: str
    pid: int | None = None
    frames: tuple = ()


@dataclass
class _M:
    groups: dict = field(default_factory=dict)


@dataclass
class _F:
    ev: _Ev
    role: str
    traits: frozenset = frozenset()
    links: list = field(default_factory=list)
    match: _M = field(default_factory=_M)

    def has(self, trait: str) -> bool:
        return trait in self.traits


def test_a_wrapper_gives_way_to_its_cause_below_it():
    w = _F(_Ev("-", 8, 1, "DistBackendError: NCCL error in: x.cpp:1, internal error"), "root", frozenset({WRAPPER}))
    c = _F(_Ev("-", 11, 1, "NET/OFI Unable to insert remote address"), "root")
    [cause] = prefer_details([w, c])
    assert cause.ev is c.ev and "internal error" in cause.links[0] and c.links == []
    # the wrapper's traceback says where it was raised: the cause, a line with none, takes its frames
    raised = _F(_Ev("-", 8, 1, "DistBackendError: NCCL error in: x.cpp:1, internal error", frames=("f",)), "root",
                frozenset({WRAPPER}))
    [cause] = prefer_details([raised, c])
    assert cause.ev.frames == ("f",) and cause.ev.text == c.ev.text and c.ev.frames == ()


def test_a_wrapper_stays_without_a_cause_close_below_it():
    w = _F(_Ev("-", 8, 1, "internal error"), "root", frozenset({WRAPPER}))
    far = _F(_Ev("-", 8 + MAX_GAP + 1, 1, "NET/OFI ..."), "root")
    other_rank = _F(_Ev("-", 9, 2, "NET/OFI ..."), "root")
    other_stream = _F(_Ev("b", 9, 1, "NET/OFI ..."), "root")
    cascade = _F(_Ev("-", 9, 1, "Connection closed by remote peer"), "cascade")
    generic = _F(_Ev("-", 9, 1, "RuntimeError: x"), "root", frozenset({"generic"}))
    above = _F(_Ev("-", 7, 1, "NET/OFI ..."), "root")
    for x in (far, other_rank, other_stream, cascade, generic, above):
        assert prefer_details([w, x]) == [w, x]
    # one wrapper under another: the inner one is no cause
    w2 = _F(_Ev("-", 9, 1, "ncclInternalError"), "root", frozenset({WRAPPER}))
    assert prefer_details([w, w2]) == [w, w2]


# --- whole pasted logs through the analysis -----------------------------------------------------



def test_a_cut_nccl_paste_names_the_rank_from_its_channel_lines():
    """Only NCCL_DEBUG=INFO set-up lines and a system error's back trace: the process's rank comes
    from its own [send] channel line (the [0] is its CUDA device), the phase from the set-up."""
    log = "\n".join([
        "node-a:2201:2260 [0] NCCL INFO Channel 00/0 : 0[4f000] -> 1[4f000] [send] via NET/Socket/0",
        "node-a:2201:2260 [0] NCCL INFO Channel 01/0 : 0[4f000] -> 1[4f000] [send] via NET/Socket/1",
        "node-a:2201:2261 [0] NCCL INFO include/net.h:31 -> 2",
        "node-a:2201:2261 [0] NCCL INFO transport/net.cc:590 -> 2",
        "",
    ])
    ff = first_failure_of(log)
    assert ff is not None
    assert (ff["rank"], ff["category"], ff["phase"]) == (0, "network", "init")
    assert ff["confidence"] == "low"


def test_the_warn_above_a_back_trace_is_the_failure():
    log = "\n".join([
        "node-a:2201:2201 [2] NCCL INFO ncclCommInitRank comm 0x55aa rank 2 nranks 4 cudaDev 2 nvmlDev 2 busId 61000 commId 0x7c1d - Init START",
        "node-a:2201:2201 [2] init.cc:737 NCCL WARN Duplicate GPU detected : rank 2 and rank 3 both on CUDA device 61000",
        "node-a:2201:2201 [2] NCCL INFO init.cc:1120 -> 5",
        "",
    ])
    ff = first_failure_of(log)
    assert ff["signature"] == "nccl.duplicate_gpu"
    assert (ff["category"], ff["phase"]) == ("config", "init")


def test_a_warn_line_takes_the_rank_its_pid_was_taught():
    log = "\n".join([
        "node-a:2201:2201 [2] NCCL INFO ncclCommInitRank comm 0x55aa rank 2 nranks 4 cudaDev 2 nvmlDev 2 busId 61000 commId 0x7c1d - Init START",
        "node-a:2201:2201 [2] init.cc:737 NCCL WARN Duplicate GPU detected : rank 2 and rank 3 both on CUDA device 61000",
        "",
    ])
    assert first_failure_of(log)["rank"] == 2


def test_a_launch_with_more_ranks_than_gpus():
    log = "\n".join([
        "[rank6]: Traceback (most recent call last):",
        '[rank6]:   File "/w/train.py", line 12, in <module>',
        "[rank6]:     torch.cuda.set_device(local_rank)",
        '[rank6]:   File "/usr/lib/python3/site-packages/torch/cuda/__init__.py", line 399, in set_device',
        "[rank6]:     torch._C._cuda_setDevice(device)",
        "[rank6]: RuntimeError: CUDA error: invalid device ordinal",
        "",
    ])
    ff = first_failure_of(log)
    assert ff["signature"] == "cuda.invalid_device_ordinal"
    assert (ff["rank"], ff["category"], ff["phase"]) == (6, "config", "init")


def test_an_mpirun_rank_killed_is_named_by_its_rank():
    log = "\n".join([
        "--------------------------------------------------------------------------",
        "mpirun noticed that process rank 3 with PID 0 on node node-b exited on signal 9 (Killed).",
        "--------------------------------------------------------------------------",
        "",
    ])
    ff = first_failure_of(log)
    assert ff["rank"] == 3


def test_a_rendezvous_store_reset_at_start_up():
    log = "\n".join([
        "WARNING:torch.distributed.elastic.rendezvous.dynamic_rendezvous:The node 'node-b_4120_0' has failed to "
        "shutdown the rendezvous '8d1c' due to an error of type RendezvousConnectionError.",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", '
        "line 113, in _call_store",
        "    return getattr(self._store, store_op)(*args, **kwargs)",
        "RuntimeError: Connection reset by peer",
        "",
    ])
    ff = first_failure_of(log)
    assert (ff["category"], ff["phase"]) == ("network", "init")
    assert ff["confidence"] == "low"


def test_env_rendezvous_without_master_addr():
    log = "\n".join([
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 30, in <module>',
        '    dist.init_process_group("nccl")',
        '  File "/usr/lib/python3/site-packages/torch/distributed/rendezvous.py", line 166, in _env_rendezvous_handler',
        '    raise _env_error("MASTER_ADDR")',
        "ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable MASTER_ADDR "
        "expected, but not set",
        "",
    ])
    ff = first_failure_of(log)
    assert ff["signature"] == "c10d.env_var_not_set"
    assert (ff["category"], ff["phase"]) == ("config", "init")


BOOTSTRAP = [
    ("gpu-05:3120:3190 [0] bootstrap.cc:140 NCCL WARN Bootstrap Root : mismatch in rank count from procs 16 : 8",
     "nccl.bootstrap_rank_mismatch", {"nranks": "16", "other_nranks": "8"}),
    ("gpu-05:3120:3190 [0] bootstrap.cc:145 NCCL WARN Bootstrap Root : rank 2 of 16 ranks has already checked in",
     "nccl.bootstrap_rank_twice", {"dup_rank": "2"}),
]


@pytest.mark.parametrize("line,sig,facts", BOOTSTRAP, ids=[s for _, s, _ in BOOTSTRAP])
def test_bootstrap_root_names_no_rank_of_its_own(line, sig, facts):
    m = CATALOG.match(line)
    assert m.signature.id == sig and (m.role, m.category) == ("root", "config")
    assert "rank" not in m.groups  # the rank claimed twice is not the rank that printed the line
    for k, v in facts.items():
        assert m.groups[k] == v


def test_a_store_broken_pipe_is_a_survivor_but_python_s_own_is_not():
    assert CATALOG.match("RuntimeError: Broken pipe").role == "cascade"
    m = CATALOG.match("BrokenPipeError: [Errno 32] Broken pipe")
    assert m is None or m.signature.id != "net.broken_pipe"


def test_a_failed_connect_attempt_that_c10d_retried_is_no_failure():
    """socket.cpp warns once per address it tries (IPv6 first, errno 99) and then connects over
    IPv4: the failure of this log is the later error, not the warning."""
    log = "\n".join([
        "[W1203 10:01:02.123456789 socket.cpp:752] [c10d] The client socket has failed to connect to "
        "[localhost]:29500 (errno: 99 - Cannot assign requested address).",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/w/train.py", line 50, in <module>',
        "[rank1]:     loss = model(batch)",
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
        "capacity of 79.10 GiB of which 1.20 GiB is free.",
        "",
    ])
    ff = first_failure_of(log)
    assert (ff["rank"], ff["category"]) == (1, "gpu-memory")


def test_the_connect_error_c10d_raises_after_its_attempts_is_network_at_init():
    m = CATALOG.match("torch.distributed.DistNetworkError: The client socket has failed to connect to any network "
                      "address of (node-0, 29500). The client socket has failed to connect to [node-0]:29500 "
                      "(errno: 113 - No route to host).")
    assert (m.signature.id, m.role, m.category) == ("c10d.store_connect_failed", "root", "network")
    w = CATALOG.match("[W socket.cpp:601] [c10d] The client socket has failed to connect to [node-0]:29500 "
                      "(errno: 113 - No route to host).")
    assert (w.signature.id, w.role) == ("c10d.store_connect_attempt_failed", "context")


def _trace(seq: int, text: str, pid: int | None = None) -> _F:
    return _F(_Ev("-", seq, None, text, pid), "root", frozenset({TRACE}))


def _line(seq: int, text: str, role: str, pid: int | None = None) -> _F:
    return _F(_Ev("-", seq, None, text, pid), role)


def test_a_back_trace_under_its_process_s_warn_gives_way():
    """NCCL 2.10-2.12 returned a peer's closed socket as ncclSystemError: the survivor's back trace
    is its WARN's (a cascade), not a network root of its own."""
    warn = _line(5, "node-b:3101:3150 [1] misc/socket.cc:50 NCCL WARN Net : Connection closed by remote peer "
                    "10.0.0.7<40123>", "cascade")
    t1 = _trace(6, "node-b:3101:3150 [1] NCCL INFO include/socket.h:423 -> 2")
    t2 = _trace(7, "node-b:3101:3150 [1] NCCL INFO transport/net_socket.cc:414 -> 2")
    assert prefer_details([warn, t1, t2]) == [warn]


def test_a_back_trace_of_another_process_or_alone_stays():
    ctx = _line(3, "node-b:3101:3101 [1] NCCL INFO Channel 00/0 : 1[1b000] -> 0[1b000] [send] via NET/Socket/0",
                "context")
    other = _line(5, "node-c:4200:4250 [0] misc/socket.cc:50 NCCL WARN Net : Connection closed by remote peer x",
                  "cascade")
    t = _trace(6, "node-b:3101:3150 [1] NCCL INFO transport/net.cc:590 -> 2")
    assert prefer_details([ctx, other, t]) == [ctx, other, t]
    far = _line(1, "node-b:3101:3150 [1] init.cc:737 NCCL WARN something", "root")
    late = _trace(1 + TRACE_REACH + 1, "node-b:3101:3150 [1] NCCL INFO init.cc:1120 -> 5")
    assert prefer_details([far, late]) == [far, late]


def test_gloo_full_mesh_over_loopback_is_config_and_a_peer_reset_is_a_survivor():
    m = CATALOG.match("[E ProcessGroupGloo.cpp:138] Gloo connectFullMesh failed with "
                      "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error")
    assert (m.signature.id, m.category) == ("gloo.full_mesh_loopback", "config")
    m = CATALOG.match("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:799] "
                      "connect [10.1.2.8]:41277: Connection refused")
    assert (m.signature.id, m.category) == ("gloo.connect_failed", "network")
    m = CATALOG.match("[E ProcessGroupGloo.cpp:138] Gloo connectFullMesh failed with Connection reset by peer")
    assert m.role == "cascade"


def test_a_distbackenderror_traceback_is_named_by_its_last_error():
    """Inside one traceback the catalog sees the ncclResult text and its 'Last error:' cause
    together, and the cause's signature comes first in the file."""
    log = "\n".join([
        "[rank2]: Traceback (most recent call last):",
        '[rank2]:   File "/w/train.py", line 20, in <module>',
        "[rank2]:     dist.barrier()",
        '[rank2]:   File "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", line 4159, in barrier',
        "[rank2]:     work = group.barrier(opts=opts)",
        "[rank2]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
        "[rank2]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. ",
        "[rank2]: Last error:",
        "[rank2]: socketStartConnect: Connect to 10.4.0.9<45123> failed : No route to host",
        "",
    ])
    ff = first_failure_of(log)
    assert ff["signature"] == "nccl.socket_connect_failed"
    assert (ff["rank"], ff["category"]) == (2, "network")


def test_a_slurm_step_whose_program_is_missing():
    log = "\n".join([
        "srun: job 4242 queued and waiting for resources",
        "srun: job 4242 has been allocated resources",
        "slurmstepd: error: execve(): python3.11: No such file or directory",
        "srun: error: gpu-07: task 0: Exited with exit code 2",
        "",
    ])
    ff = first_failure_of(log)
    assert (ff["signature"], ff["category"], ff["phase"]) == ("slurm.task_execve_failed", "config", "init")


# Open MPI's UCX transport failing to reach a peer at start-up, then the process crashing in the
# UCX error handler (pml_ucx.c and UCX sock.c formats; made-up hosts and addresses)
UCX_THEN_SEGFAULT = """\
[1746051351.812265] [gpu-07:24215:0]            sock.c:334  UCX  ERROR   connect(fd=168, dest_addr=10.9.8.7:52595) failed: Connection refused
[gpu-07:24215] pml_ucx.c:424  Error: ucp_ep_create(proc=0) failed: Destination is unreachable
[gpu-07:24215] pml_ucx.c:477  Error: Failed to resolve UCX endpoint for rank 0
[gpu-07:24215:0:24215] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x3000)
==== backtrace (tid:  24215) ====
 0  /opt/hpcx/ucx/lib/libucs.so.0(ucs_handle_error+0x2e4) [0x7f00aa008654]
"""


def test_a_peer_ucx_could_not_reach_is_the_failure_not_the_crash_after_it():
    ff = first_failure_of(UCX_THEN_SEGFAULT)
    assert (ff["signature"], ff["category"], ff["phase"]) == ("mpi.ucx_unreachable", "network", "init")
    assert ff["confidence"] != "high"


# ProcessGroupNCCL's message for ncclInvalidUsage with its "Last error:" cause (NCCLUtils.cpp
# getNcclErrorDetailStr, NCCL bootstrap.cc), pasted with every line break doubled
NO_INTERFACE_DOUBLE_SPACED = """\
torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2897, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.27.3

ncclInvalidUsage: This usually reflects invalid usage of NCCL library.

Last error:

Bootstrap : no socket interface found

"""


def test_a_double_spaced_paste_keeps_the_cause_under_its_wrapper():
    ff = first_failure_of(NO_INTERFACE_DOUBLE_SPACED)
    assert (ff["signature"], ff["category"], ff["phase"]) == ("nccl.no_interface", "config", "init")


# distributed_c10d.py _new_process_group_helper: mp.spawn's child asks for NCCL on a build without it
BACKEND_NOT_BUILT = (
    "torch.multiprocessing.spawn.ProcessRaisedException:\n\n-- Process 0 terminated with the following error:\n"
    "Traceback (most recent call last):\n"
    '  File "C:\\env\\lib\\site-packages\\torch\\multiprocessing\\spawn.py", line 69, in _wrap\n    fn(i, *args)\n'
    '  File "E:\\w\\train.py", line 30, in run\n    dist.init_process_group("nccl", rank=rank, world_size=2)\n'
    '  File "C:\\env\\lib\\site-packages\\torch\\distributed\\distributed_c10d.py", line 1013, in _new_process_group_helper\n'
    '    raise RuntimeError("Distributed package doesn\'t have NCCL " "built in")\n'
    "RuntimeError: Distributed package doesn't have NCCL built in\n")
# torch/nn/parallel/distributed.py refuses device_ids for a module on several devices (device_map='auto')
DDP_SPREAD = (
    "[rank1]: Traceback (most recent call last):\n"
    '[rank1]:   File "/w/train.py", line 88, in main\n[rank1]:     model = DDP(model, device_ids=[local_rank])\n'
    '[rank1]:   File "/env/lib/python3.10/site-packages/torch/nn/parallel/distributed.py", line 625, in __init__\n'
    "[rank1]:     self._log_and_throw(\n"
    "[rank1]: ValueError: DistributedDataParallel device_ids and output_device arguments only work with "
    "single-device/multiple-device GPU modules or CPU modules, but got device_ids [1], output_device 1, and module "
    "parameters {device(type='cuda', index=0), device(type='cuda', index=1)}.\n")


@pytest.mark.parametrize("text, signature, rank", [
    (BACKEND_NOT_BUILT, "c10d.backend_not_built", 0),
    (DDP_SPREAD, "torch.ddp_device_ids_mismatch", 1),
], ids=["backend-not-built", "ddp-model-spread"])
def test_a_torch_set_up_refusal_of_the_job_s_settings_is_config_at_init(text, signature, rank):
    ff = first_failure_of(text)
    assert (ff["signature"], ff["category"], ff["phase"], ff["rank"]) == (signature, "config", "init", rank)
