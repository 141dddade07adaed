"""PyTorch distributed, NCCL, c10d stores and the launchers: the catalog against lines written
from the format strings of the sources (PyTorch 1.10-2.9, NCCL 2.10-2.27, aws-ofi-nccl,
torchelastic, the DeepSpeed launcher), and small pasted logs through the whole analysis.

Every line here is written from a format string with made-up values (host names, pids,
addresses, sequence numbers); none is copied from a user's log.
"""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import load_catalog
from tests.analysis.catalog_lines import assert_line
from tests.offline.scoring import Case
from tests.offline.scoring import analyze as analyze_case

CATALOG = load_catalog()

# (line, signature id, role, category, the facts it must carry)
LINES = [
    # ProcessGroupNCCL watchdog, 1.10-1.11: WorkNCCL(OpType=..., Timeout(ms)=...)
    ("[E ProcessGroupNCCL.cpp:587] [Rank 6] Watchdog caught collective operation timeout: "
     "WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800342 milliseconds before timing out.",
     "nccl.watchdog_timeout", "cascade", "cascade", {"rank": "6", "op": "ALLREDUCE", "timeout_ms": "1800000"}),
    # 2.4+: logPrefix of the default group names the global rank
    ("[rank4]:[E1109 01:02:03.000000000 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 4] "
     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88, OpType=_ALLGATHER_BASE, NumelIn=512, "
     "NumelOut=4096, Timeout(ms)=600000) ran for 600123 milliseconds before timing out.",
     "nccl.watchdog_timeout", "cascade", "cascade", {"rank": "4", "seq": "88", "op": "_ALLGATHER_BASE"}),
    # the 2.2-2.3 wrapper "[PG 0 Rank r] Process group watchdog thread terminated with exception: ..."
    ("  what():  [PG 0 Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, "
     "Timeout(ms)=120000) ran for 120092 milliseconds before timing out.",
     "nccl.watchdog_timeout", "cascade", "cascade", {"rank": "1", "seq": "1"}),
    # behind a Ray actor prefix
    ("(WorkerDict pid=3301, ip=10.0.0.5) [rank3]:[E1118 20:32:23.955028747 ProcessGroupNCCL.cpp:629] [Rank 3] "
     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2635, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
     "Timeout(ms)=1800000) ran for 1800024 milliseconds before timing out.",
     "nccl.watchdog_timeout", "cascade", "cascade", {"rank": "3", "seq": "2635"}),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 3]  failure detected by watchdog at work sequence id: 2635 PG status: "
     "last enqueued work: 2635, last completed work: 2634",
     "nccl.work_status", "context", "unknown", {"rank": "3", "seq": "2635", "completed": "2634"}),
    ("[rank1]:[E ProcessGroupNCCL.cpp:626] [Rank 1] Work WorkNCCL(SeqNum=40, OpType=BROADCAST, NumelIn=1, "
     "NumelOut=1, Timeout(ms)=600000) timed out in blocking wait (TORCH_NCCL_BLOCKING_WAIT=1).",
     "nccl.blocking_wait_timeout", "cascade", "cascade", {"rank": "1", "op": "BROADCAST"}),
    ("[PG 0 (default_pg) Rank 12] Exception (either an error or timeout) detected by watchdog at work: 2070, "
     "last enqueued NCCL work: 2070, last completed NCCL work: 2069.",
     "nccl.work_status", "context", "unknown", {"rank": "12", "pg_rank": "12", "pg": "0", "enqueued": "2070"}),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 2] Received a dump signal due to a collective timeout from  rank 6 and "
     "we will try our best to dump the debug info. Last enqueued NCCL work: 900, last completed NCCL work: 899.",
     "nccl.work_status", "context", "unknown", {"rank": "2", "completed": "899"}),
    ("[E ProcessGroupNCCL.cpp:537] Some NCCL operations have failed or timed out. Due to the asynchronous nature "
     "of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
     "nccl.async_abort", "cascade", "cascade", {}),
    ("[rank2]:[E ProcessGroupNCCL.cpp:583] [Rank 2] To avoid data inconsistency, we are taking the entire process down.",
     "nccl.async_abort", "cascade", "cascade", {"rank": "2"}),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 7] Observed flight recorder dump signal from another rank via TCPStore.",
     "nccl.dump_signal", "cascade", "cascade", {"rank": "7"}),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 3] Heartbeat monitor timed out! Process will be terminated after "
     "dumping debug info. workMetaList_.size()=2",
     "nccl.heartbeat_timeout", "cascade", "cascade", {"rank": "3"}),
    ("torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] "
     "via c10d key-value store by key '0', but store->get('0') got error: wait timeout after 300000ms, keys: "
     "/default_pg/0//cuda//0",
     "nccl.unique_id_store_error", "cascade", "cascade", {"pg_rank": "1"}),
    # c10d checks that name a rank
    ("RuntimeError: [Rank 0]: Rank 5 failed to pass monitoredBarrier in 60000 ms",
     "c10d.monitored_barrier_failed", "cascade", "cascade", {"missing_rank": "5", "timeout_ms": "60000"}),
    ("[E ProcessGroupGloo.cpp:138] [Rank 0]: Ranks 2, 5 failed to pass monitoredBarrier in 60000 ms",
     "c10d.monitored_barrier_failed", "cascade", "cascade", {"missing_ranks": "2, 5"}),
    ("[rank3]:[E325 10:00:00.000000000 ProcessGroupGloo.cpp:145] Rank 3 successfully reached monitoredBarrier, but "
     "received errors while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.",
     "c10d.monitored_barrier_peer", "cascade", "cascade", {"rank": "3"}),
    # NCCL's own lines that name a cause
    ("node-1:3301:3390 [0] init.cc:943 NCCL WARN Duplicate GPU detected : rank 3 and rank 2 both on CUDA device 41000",
     "nccl.duplicate_gpu", "root", "config", {"busid": "41000"}),
    ("node-1:3301:3390 [1] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.9.8.7<50123> failed : "
     "Connection refused",
     "nccl.socket_connect_failed", "root", "network", {"peer": "10.9.8.7<50123>", "error": "Connection refused"}),
    ("node-1:3301:3390 [1] NCCL INFO Call to connect returned Connection refused, retrying",
     "nccl.connect_retry", "context", "network", {"error": "Connection refused"}),
    ("node-1:3301:3390 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.9.8.7<50123> "
     "with error 12, opcode 129, len 0, vendor err 129 (Recv)",
     "nccl.ib_completion_error", "root", "network", {"status": "12"}),
    ("node-1:3301:3390 [1] misc/ibvwrap.cc:376 NCCL WARN Call to ibv_modify_qp failed with 110 Connection timed "
     "out, on dev mlx5_2:1, curr state INIT, next state RTR",
     "nccl.ibverbs_call_failed", "root", "network", {"call": "ibv_modify_qp"}),
    ("node-1:3301:3390 [1] misc/nvmlwrap.cc:187 NCCL WARN nvmlDeviceGetHandleByPciBusId() failed: GPU is lost",
     "nccl.nvml_gpu_lost", "root", "hardware", {}),
    ("node-1:3301:3390 [0] include/alloc.h:114 NCCL WARN Cuda failure 'out of memory'",
     "nccl.cuda_oom", "root", "gpu-memory", {}),
    ("node-1:3301:3390 [0] enqueue.cc:1556 NCCL WARN Cuda failure 'unspecified launch failure'",
     "cuda.launch_failure", "root", "unknown", {}),
    # the ncclResult texts and what they wrap
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
     "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
     "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'initialization error'",
     "nccl.cuda_failure", "root", "unknown", {"error": "initialization error"}),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
     "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\n"
     "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.\n"
     "Last error:\nsocketStartConnect: Connect to 10.9.8.7<50123> failed : No route to host",
     "nccl.socket_connect_failed", "root", "network", {"error": "No route to host"}),
    ("RuntimeError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, "
     "invalid argument, NCCL version 2.10.3",
     "nccl.invalid_usage", "root", "config", {"what": "argument"}),
    ("[rank5]:[E ProcessGroupNCCL.cpp:542] [Rank 5] Collective WorkNCCL(SeqNum=89, OpType=ALLREDUCE, "
     "NumelIn=67108864, NumelOut=67108864, Timeout(ms)=90000) raised the following async exception: NCCL error: "
     "remote process exited or there was a network error, NCCL version 2.21.5",
     "nccl.remote_error", "cascade", "cascade", {}),
    # c10d stores and sockets at init
    ("[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:38429 (errno: 98 - Address already in use).",
     "c10d.store_port_in_use", "root", "config", {"port": "38429"}),
    ("torch.distributed.DistNetworkError: The client socket has failed to connect to any network address of "
     "(node-0, 29500). The client socket has failed to connect to [node-0]:29500 (errno: 111 - Connection refused).",
     "c10d.store_connect_failed", "root", "network", {"host": "node-0", "port": "29500"}),
    ("torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 3/4 clients joined.",
     "c10d.store_clients_timeout", "root", "network", {"joined": "3", "expected": "4"}),
    ("RuntimeError: [/opt/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:799] connect [10.9.8.7]:38121: "
     "No route to host", "gloo.connect_failed", "root", "network", {"peer": "[10.9.8.7]:38121"}),
    ("node-1:3301:3301 [0] bootstrap.cc:45 NCCL WARN Bootstrap : no socket interface found",
     "nccl.no_interface", "root", "config", {}),
    # c10d's exception types: the specific signatures first, the type last (python.exception calls it user code)
    ("torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote "
     "server shutdown or crash?", "c10d.store_connection_lost", "cascade", "cascade", {}),
    ("torch.distributed.DistBackendError: [PG ID 0 PG GUID 0(default_pg) Rank 2] something new",
     "c10d.dist_error", "root", "unknown", {"exc_type": "DistBackendError"}),
    # torchelastic and the DeepSpeed launcher
    ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
     "torchelastic.rendezvous_timeout", "root", "network", {}),
    ("WARNING:torch.distributed.elastic.rendezvous.dynamic_rendezvous:The node 'node-2_1234_0' has failed to send a "
     "keep-alive heartbeat to the rendezvous 'job7' due to an error of type RendezvousConnectionError.",
     "torchelastic.rendezvous_keepalive_failed", "cascade", "cascade", {"error_type": "RendezvousConnectionError"}),
    ('    "message": "RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for '
     'details.",', "torchelastic.rendezvous_connection", "root", "network", {}),
    ("  rank: 2 (local_rank: 2)", "torchelastic.failure_rank", "context", "unknown", {"rank": "2"}),
    ("Child process 5121 (local_rank 2) FAILED (exitcode -9)",
     "torchelastic.worker_sigkill", "root", "unknown", {"pid": "5121", "exitcode": "-9"}),
    ("[2026-12-02 10:09:40,512] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', "
     "'--local_rank=7', '--deepspeed_config', 'ds.json'] exits with return code = -9",
     "deepspeed.launcher_exit_signal", "root", "unknown", {"exitcode": "-9", "last_local_rank": "7"}),
    # torch.distributed.launch before torchelastic raised CalledProcessError with the last command built
    ("subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py', '--local_rank=3']' returned "
     "non-zero exit status 1.", "deepspeed.launcher_exit", "context", "unknown", {"last_local_rank": "3"}),
    ("torch.multiprocessing.spawn.ProcessExitedException: process 2 terminated with signal SIGSEGV",
     "torchelastic.worker_signal", "root", "unknown", {"local_rank": "2", "signal": "SIGSEGV"}),
    ("[2026-12-02 10:09:40,512] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', "
     "'--local_rank=7'] exits with return code = 1",
     "deepspeed.launcher_exit", "context", "unknown", {"exitcode": "1"}),
]


@pytest.mark.parametrize("text,sig,role,category,facts", LINES, ids=[f"{x[1]}-{i}" for i, x in enumerate(LINES)])
def test_lines_from_the_format_strings(text, sig, role, category, facts):
    assert_line(CATALOG, text, sig, role, category, facts)


# NCCL before 2.13 named ncclInternalError just "internal error" (ncclGetErrorString); PyTorch 1.x wraps it
# as "NCCL error in: <file>:<line>, internal error, NCCL version ..." or, from the watchdog, "NCCL error: ..."
OLD_NCCL_RESULTS = [
    ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, internal error, "
     "NCCL version 2.10.3", "nccl.internal_error", "framework", {"site": "../torch/csrc/distributed/c10d/"
                                                                          "ProcessGroupNCCL.cpp:1191"}),
    ("terminate called after throwing an instance of 'std::runtime_error'\n  what():  NCCL error: internal error, "
     "NCCL version 2.7.8", "nccl.internal_error", "framework", {}),
]


@pytest.mark.parametrize("text,sig,category,facts", OLD_NCCL_RESULTS)
def test_the_ncclresult_texts_of_nccl_before_2_13(text, sig, category, facts):
    m = CATALOG.match(text)
    assert m is not None and (m.signature.id, m.category) == (sig, category)
    assert {k: m.groups.get(k) for k in facts} == facts


NOT_RANKS = [
    # a non-default process group's rank is not the global rank
    ("[PG ID 3 PG GUID 7(DATA_PARALLEL_GROUP) Rank 1] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=52, OpType=_REDUCE_SCATTER_BASE, NumelIn=8192, NumelOut=1024, Timeout(ms)=600000) ran for "
     "600400 milliseconds before timing out.", "nccl.watchdog_timeout"),
    ("[PG ID 3 PG GUID 7(DATA_PARALLEL_GROUP) Rank 1] Process group watchdog thread terminated with exception: "
     "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=52, OpType=ALLREDUCE, NumelIn=8, "
     "NumelOut=8, Timeout(ms)=600000) ran for 600400 milliseconds before timing out.", "nccl.watchdog_timeout"),
    ("[PG 2 Rank 1] Timeout at NCCL work: 880, last enqueued NCCL work: 880, last completed NCCL work: 879.",
     "nccl.work_timeout_status"),
    ("[PG 2 Rank 1] Exception (either an error or timeout) detected by watchdog at work: 880, last enqueued NCCL "
     "work: 880, last completed NCCL work: 879.", "nccl.work_status"),
    # "[3]" before NCCL WARN is a GPU index, and the ranks of Duplicate GPU are the communicator's
    ("node-1:3301:3390 [3] init.cc:943 NCCL WARN Duplicate GPU detected : rank 3 and rank 2 both on CUDA device 41000",
     "nccl.duplicate_gpu"),
    ("node-1:3301:3390 [3] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer "
     "node-2<50123>", "nccl.peer_closed"),
    # the DeepSpeed launcher's --local_rank is the last rank it started, not the one that died
    ("[ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', '--local_rank=7'] exits with "
     "return code = -9", "deepspeed.launcher_exit_signal"),
    # the ncclUniqueId message names the group's rank in brackets
    ("RuntimeError: [2] is setting up NCCL communicator and retreiving ncclUniqueId from [0] via c10d key-value store "
     "by key '0', but store->get('0') got error: Socket Timeout", "nccl.unique_id_store_error"),
    ("torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3. ", "nccl.comm_aborted"),
    # the mismatch names the reporting rank inside its process group, which may be a subgroup
    ("RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
     "CollectiveFingerPrint(SequenceNumber=9, OpType=ALLGATHER), but Rank 0 is running collective: "
     "CollectiveFingerPrint(SequenceNumber=9, OpType=REDUCE_SCATTER).", "c10d.collective_mismatch"),
    # the rank monitoredBarrier names did not print the line: it is the one that never arrived
    ("[rank0]: RuntimeError: [Rank 0]: Rank 3 failed to pass monitoredBarrier in 30000 ms",
     "c10d.monitored_barrier_failed"),
]


@pytest.mark.parametrize("text,sig", NOT_RANKS, ids=[s for _, s in NOT_RANKS])
def test_no_global_rank_where_the_message_names_none(text, sig):
    m = CATALOG.match(text)
    assert m is not None and m.signature.id == sig
    assert "rank" not in m.groups and "local_rank" not in m.groups, m.groups


NEAR_MISSES = [
    # source code of the format string itself
    ("    raise RendezvousTimeoutError", None),
    ("    raise RendezvousClosedError", None),
    # INFO lines that are not failures
    ("node-1:3301:3390 [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)", None),
    ("[I ProcessGroupWrapper.cpp:562] [Rank 0] Running collective: CollectiveFingerPrint(SequenceNumber=12, "
     "OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float)", None),
    # (a set-up line: only the context that maps host:pid to its communicator rank)
    ("node-1:3301:3390 [0] NCCL INFO Channel 03/0 : 0[90000] -> 1[1000] [send] via NET/Socket/3", "nccl.comm_rank"),
    # a timeout of the NCCL socket is not a dead peer (nccl.socket_recv_failed's cascade): the network's
    ("node-1:3301:3390 [1] misc/socket.cc:30 NCCL WARN socketProgressOpt: Call to recv from 10.9.8.7<50123> "
     "failed : Connection timed out", "nccl.socket_io_unreachable"),
    # "internal error" words that are not NCCL's result text
    ("RuntimeError: CUDA error: an internal error occurred", "cuda.error"),
    ("RuntimeError: Internal error, please check the config", "python.exception"),
    # a keep-alive warning names RendezvousConnectionError but is not the exception
    ("WARNING:torch.distributed.elastic.rendezvous.dynamic_rendezvous:The node 'n_1_0' has failed to shutdown the "
     "rendezvous 'job7' due to an error of type RendezvousConnectionError.", "torchelastic.rendezvous_keepalive_failed"),
]


@pytest.mark.parametrize("text,sig", NEAR_MISSES, ids=[f"near-{i}" for i in range(len(NEAR_MISSES))])
def test_near_misses(text, sig):
    m = CATALOG.match(text)
    assert (m.signature.id if m else None) == sig


def test_cause_lines_come_before_the_ncclresult_texts_that_wrap_them():
    ids = [s.id for s in CATALOG.signatures]
    for cause in ("nccl.duplicate_gpu", "nccl.nvml_failed", "nccl.socket_connect_failed", "nccl.ib_completion_error",
                  "nccl.ofi_setup_failed", "nccl.cuda_failure"):
        for generic in ("nccl.remote_error", "nccl.system_error", "nccl.internal_error", "nccl.unhandled_cuda_error",
                        "nccl.invalid_usage"):
            assert ids.index(cause) < ids.index(generic), (cause, generic)
    assert ids.index("nccl.watchdog_terminated") > max(ids.index(i) for i in ids if i.startswith("nccl.")
                                                       and i not in ("nccl.watchdog_terminated", "nccl.warn"))


def test_a_rendezvous_store_lost_while_running_is_a_cascade_and_at_start_a_root():
    running = ('  File "/opt/venv/lib/python3.10/site-packages/torch/distributed/elastic/agent/server/api.py", line 877, '
               'in _invoke_run\n    num_nodes_waiting = rdzv_handler.num_nodes_waiting()\n'
               'torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store '
               'has failed. See inner exception for details.')
    starting = ('  File "/opt/venv/lib/python3.10/site-packages/torch/distributed/elastic/rendezvous/'
                'c10d_rendezvous_backend.py", line 176, in _create_tcp_store\n    store = TCPStore(\n'
                'torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store '
                'has failed. See inner exception for details.')
    assert CATALOG.match(running).signature.id == "torchelastic.rendezvous_connection_lost"
    m = CATALOG.match(starting)
    assert (m.signature.id, m.role, m.category, m.signature.phases) == (
        "torchelastic.rendezvous_connection", "root", "network", ("init",))


# ---------------------------------------------------------------------------
# Whole pasted logs (written from the formats) through `firstfault analyze -`
# ---------------------------------------------------------------------------

def _analyze(text: str) -> dict:
    return analyze_case(Case("paste", ["-"], {}, stdin=text.encode()))


SOCKET_AT_INIT = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/train.py", line 41, in <module>
[rank1]:     dist.barrier()
[rank1]:   File "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper
[rank1]:     return func(*args, **kwargs)
[rank1]:   File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4159, in barrier
[rank1]:     work = group.barrier(opts=opts)
[rank1]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, \
unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
[rank1]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.
[rank1]: Last error:
[rank1]: socketStartConnect: Connect to 10.1.2.8<43215> failed : No route to host
E1202 10:12:00.462000 2611 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 1 \
(pid: 24215) of binary: /opt/venv/bin/python3
"""

TIMEOUTS_AND_A_KILLED_RANK = """\
[rank0]:[E1202 10:43:22.118000 2630 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=4012, OpType=ALLREDUCE, NumelIn=25165824, NumelOut=25165824, Timeout(ms)=1800000) ran for 1800087 \
milliseconds before timing out.
[rank2]:[E1202 10:43:22.119000 2632 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=4012, OpType=ALLREDUCE, NumelIn=25165824, NumelOut=25165824, Timeout(ms)=1800000) ran for 1800091 \
milliseconds before timing out.
[rank0]:[E1202 10:43:22.120000 2630 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 0] Exception (either an error \
or timeout) detected by watchdog at work: 4012, last enqueued NCCL work: 4012, last completed NCCL work: 4011.
[rank0]:[E1202 10:43:22.122000 2630 ProcessGroupNCCL.cpp:636] [Rank 0] To avoid data inconsistency, we are taking the \
entire process down.
W1202 10:43:30.020000 2611 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 2630 closing signal SIGTERM
E1202 10:43:31.462000 2611 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 1 \
(pid: 2631) of binary: /opt/venv/bin/python3
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_10:43:31
  host      : gpu-07
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 2631)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 2631
============================================================
"""

DEEPSPEED_LAUNCHER_ONLY = """\
[2026-12-02 10:03:01,004] [INFO] [launch.py:245:main] process 24214 spawned with command: ['/usr/bin/python3', '-u', \
'train.py', '--local_rank=0', '--deepspeed_config', 'ds.json']
[2026-12-02 10:03:01,006] [INFO] [launch.py:245:main] process 24215 spawned with command: ['/usr/bin/python3', '-u', \
'train.py', '--local_rank=1', '--deepspeed_config', 'ds.json']
[2026-12-02 10:09:40,332] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 24214
[2026-12-02 10:09:40,333] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 24215
[2026-12-02 10:09:40,512] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', \
'--local_rank=1', '--deepspeed_config', 'ds.json'] exits with return code = -9
"""

MONITORED_BARRIER = """\
Traceback (most recent call last):
  File "/work/train.py", line 88, in <module>
    dist.monitored_barrier(group=gloo_group, timeout=timedelta(seconds=30))
  File "/opt/venv/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 3791, in monitored_barrier
    return group_to_use.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
RuntimeError: [Rank 0]: Rank 3 failed to pass monitoredBarrier in 30000 ms
 Original exception: 
[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete
"""

PORT_IN_USE = """\
Traceback (most recent call last):
  File "/opt/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/opt/venv/lib/python3.10/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", \
line 176, in _create_tcp_store
    store = TCPStore(
torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. The server \
socket has failed to bind to [::]:29500 (errno: 98 - Address already in use). The server socket has failed to bind to \
0.0.0.0:29500 (errno: 98 - Address already in use).
"""

SUBGROUP_TIMEOUT_ONLY = """\
[E1203 04:12:11.800000 ProcessGroupNCCL.cpp:1664] [PG ID 3 PG GUID 7(DATA_PARALLEL_GROUP) Rank 1] Watchdog caught \
collective operation timeout: WorkNCCL(SeqNum=52, OpType=_REDUCE_SCATTER_BASE, NumelIn=8192, NumelOut=1024, \
Timeout(ms)=600000) ran for 600400 milliseconds before timing out.
"""

COLLECTIVE_MISMATCH = """\
[rank2]: Traceback (most recent call last):
[rank2]:   File "/work/train.py", line 120, in <module>
[rank2]:     dist.all_reduce(loss_tensor)
[rank2]:   File "/opt/venv/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 2501, in all_reduce
[rank2]:     work = group.allreduce([tensor], opts)
[rank2]: RuntimeError: Detected mismatch between collectives on ranks. Rank 2 is running collective: \
CollectiveFingerPrint(SequenceNumber=311, OpType=ALLREDUCE, TensorShape=[1], TensorDtypes=Float), but Rank 0 is \
running collective: CollectiveFingerPrint(SequenceNumber=311, OpType=BROADCAST, TensorShape=[1], TensorDtypes=Float).
"""


def _ff(text):
    return _analyze(text)["first_failure"]


def test_a_socket_connect_failure_under_a_distbackenderror_is_network_at_init():
    ff = _ff(SOCKET_AT_INIT)
    assert (ff["rank"], ff["category"], ff["phase"], ff["signature"]) == (1, "network", "init",
                                                                         "nccl.socket_connect_failed")


def test_timeouts_of_survivors_point_at_the_killed_rank():
    ff = _ff(TIMEOUTS_AND_A_KILLED_RANK)
    assert ff["rank"] == 1 and ff["signature"] == "torchelastic.worker_sigkill"
    assert ff["category"] == "host-memory" and ff["confidence"] == "low"


def test_the_deepspeed_launcher_line_names_no_rank_and_is_never_high():
    ff = _ff(DEEPSPEED_LAUNCHER_ONLY)
    assert ff is not None and ff["signature"] == "deepspeed.launcher_exit_signal"
    assert ff["rank"] is None and ff["confidence"] != "high"


def test_the_monitored_barrier_never_blames_the_rank_that_printed_it():
    """Rank 0 prints it (under its own "[rank0]:" prefix from PyTorch 2.2): rank 0 only waited.
    The rank that did not arrive is kept as missing_rank for the hang inference, never as the
    rank of the line, and no confident answer names rank 0."""
    m = CATALOG.match("RuntimeError: [Rank 0]: Rank 3 failed to pass monitoredBarrier in 30000 ms")
    assert m.groups["missing_rank"] == "3" and "rank" not in m.groups
    for text in (MONITORED_BARRIER, "".join(f"[rank0]: {line}\n" for line in MONITORED_BARRIER.splitlines())):
        ff = _ff(text)
        assert ff is None or ff["confidence"] != "high" or ff["rank"] != 0


def test_a_port_in_use_is_config_at_init():
    ff = _ff(PORT_IN_USE)
    assert (ff["category"], ff["phase"], ff["signature"]) == ("config", "init", "c10d.store_port_in_use")


def test_a_subgroup_rank_never_becomes_the_failing_rank():
    rep = _analyze(SUBGROUP_TIMEOUT_ONLY)
    ff = rep["first_failure"]
    assert ff is None or ff["rank"] != 1
    assert "1" not in rep["ranks"]


def test_a_collective_mismatch_is_user_code_on_the_rank_that_raised_it():
    ff = _ff(COLLECTIVE_MISMATCH)
    assert (ff["rank"], ff["category"], ff["signature"]) == (2, "user-code", "c10d.collective_mismatch")


# torchrun's own traceback (bin/torchrun -> errors.record's wrapper -> run.py main/run -> launcher/api.py),
# cut before its exception line: the agent's exit, not a worker's failure.
TORCHRUN_CUT = """\
Traceback (most recent call last):
  File "/opt/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/opt/venv/lib/python3.10/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 347, in wrapper
    return f(*args, **kwargs)
  File "/opt/venv/lib/python3.10/site-packages/torch/distributed/run.py", line 794, in main
    run(args)
  File "
"""

WATCHDOG_THEN_TORCHRUN_CUT = """\
[rank1]:[E1202 10:43:22.118000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=3, OpType=ALLGATHER, NumelIn=1, NumelOut=4, Timeout(ms)=600000) ran for 600168 milliseconds before \
timing out.
[rank1]:[E1202 10:43:22.119000000 ProcessGroupNCCL.cpp:1182] [Rank 1] NCCL watchdog thread terminated with exception: \
[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLGATHER, NumelIn=1, NumelOut=4, \
Timeout(ms)=600000) ran for 600168 milliseconds before timing out.
""" + TORCHRUN_CUT

STORE_TIMEOUT_THEN_TORCHRUN_CUT = """\
[E1202 10:04:34.467642512 socket.cpp:957] [c10d] The client socket has timed out after 900s while trying to connect \
to (10.1.2.7, 29500).
""" + TORCHRUN_CUT


def test_a_cut_torchrun_traceback_is_the_launcher_and_names_no_cause():
    m = CATALOG.match(TORCHRUN_CUT.rstrip("\n"))
    assert (m.signature.id, m.role) == ("torchelastic.launcher_traceback_cut", "cascade")
    # python -m torch.distributed.launch: runpy's frames above the launcher's
    legacy = ('Traceback (most recent call last):\n  File "<frozen runpy>", line 198, in _run_module_as_main\n'
              '  File "<frozen runpy>", line 88, in _run_code\n'
              '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/launch.py", line 208, in <module>\n'
              '    main()')
    assert CATALOG.match(legacy).signature.id == "torchelastic.launcher_traceback_cut"


def test_a_cut_traceback_with_a_frame_beyond_the_launcher_stays_the_programs():
    worker = ('Traceback (most recent call last):\n  File "<frozen runpy>", line 198, in _run_module_as_main\n'
              '  File "/work/train.py", line 12, in <module>\n    main()')
    rendezvous = (TORCHRUN_CUT.rstrip('\n').rsplit("\n", 1)[0] + '\n  File "/opt/venv/lib/python3.10/site-packages/'
                  'torch/distributed/elastic/agent/server/api.py", line 514, in _rendezvous\n'
                  '    rdzv_info = spec.rdzv_handler.next_rendezvous()')
    for text in (worker, rendezvous):
        assert CATALOG.match(text).signature.id == "python.traceback", text
    # with its exception line it is what the exception says
    done = TORCHRUN_CUT.rstrip('\n').rsplit("\n", 1)[0] + "\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: "
    assert CATALOG.match(done).signature.id == "torchelastic.child_failed"


def test_collective_timeouts_before_a_cut_torchrun_traceback_are_what_the_log_says():
    ff = _ff(WATCHDOG_THEN_TORCHRUN_CUT)
    assert ff["signature"] != "python.traceback" and ff["category"] == "cascade"


def test_a_store_timeout_before_a_cut_torchrun_traceback_is_network_at_init():
    ff = _ff(STORE_TIMEOUT_THEN_TORCHRUN_CUT)
    assert (ff["signature"], ff["category"], ff["phase"]) == ("c10d.store_connect_failed", "network", "init")


def test_a_cut_torchrun_traceback_alone_is_still_a_failure_of_unknown_kind():
    ff = _ff(TORCHRUN_CUT)
    assert ff is not None and ff["category"] == "unknown" and ff["confidence"] == "low"
