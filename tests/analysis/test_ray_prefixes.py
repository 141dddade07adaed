"""Prefixes in front of a Ray worker's line: Ray's own "(Name pid=N, ip=X) " with a host name for
X (Ray's log_monitor prints the node's address as it was given: ray start --node-ip-address
accepts a name, as on Kubernetes pods), and a collector's bracketed time in front of it. The
global rank is the one PyTorch's "[rankN]:" prefix names, not a process group's "[Rank N]"."""

from __future__ import annotations

import pytest

from firstfault.analysis.prefixes import peel

WATCHDOG = ("[E305 14:02:47.500120334 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=5, OpType=BROADCAST, NumelIn=4, NumelOut=4, Timeout(ms)=1800000) ran for "
            "1800212 milliseconds before timing out.")


@pytest.mark.parametrize("line, node, stamp", [
    ("(WorkerDict pid=1230, ip=trainjob-7-worker-0) [rank15]:" + WATCHDOG, "trainjob-7-worker-0", None),
    ("[2026-05-10 00:18:21] (WorkerDict pid=1230, ip=trainjob-7-worker-0) [rank15]:" + WATCHDOG,
     "trainjob-7-worker-0", "2026-05-10 00:18:21"),
    ("[2026-05-10 00:18:21] (WorkerDict pid=1230, ip=10.0.0.5) [rank15]:" + WATCHDOG, "10.0.0.5", "2026-05-10 00:18:21"),
    ("[2026-05-10 00:18:21] [rank15]:" + WATCHDOG, None, "2026-05-10 00:18:21"),
])
def test_ray_and_collector_prefixes_come_off_and_the_global_rank_stays(line, node, stamp):
    p = peel(line)
    assert p.text == WATCHDOG and p.rank == 15
    assert p.node == node and p.stamp == stamp


@pytest.mark.parametrize("line", [
    "[2026-08-02 01:24:59,694] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 33131",  # DeepSpeed's own header
    "[2026-05-10 00:18:21] (see the note below) the run stopped",  # words in parentheses, no Ray prefix
    "[2026-05-10 00:18:21] Epoch 3 finished",
])
def test_a_bracketed_time_before_anything_else_stays(line):
    p = peel(line)
    assert p.text == line and p.stamp is None and p.rank is None


@pytest.mark.parametrize("line, rank", [
    ("(MegatronPolicyWorker[rank=3] pid=2680520, ip=172.17.0.2) " + WATCHDOG, 3),
    ("[2026-05-10 00:18:21] (DTensorPolicyWorkerV2[rank=12] pid=99) " + WATCHDOG, 12),
    ("(MegatronPolicyWorker pid=2680520, ip=172.17.0.2) " + WATCHDOG, None),  # before init_process_group: no rank
    ("(WorkerDict pid=1230, ip=10.0.0.5) " + WATCHDOG, None),  # Ray's class name names no rank
])
def test_an_actor_repr_that_names_its_rank_gives_the_rank(line, rank):
    """Ray prints an actor's lines behind its repr; NeMo-RL's policy workers' repr is
    f"{class}[rank={torch.distributed.get_rank()}]" once the process group is up."""
    p = peel(line)
    assert p.text == WATCHDOG and p.rank == rank


def test_an_actor_repr_with_a_role_in_parentheses_is_a_ray_prefix():
    """ROLL's workers' repr is Class(role-index): Ray's prefix holds it as it is."""
    p = peel("(ActorWorker(reference-0) pid=7034, ip=10.0.0.5)   File \"/app/roll/worker.py\", line 3, in step")
    assert p.text == '  File "/app/roll/worker.py", line 3, in step' and p.node == "10.0.0.5"
    words = "(see the note (below) pid=7) the run stopped"
    assert peel(words).text == words


@pytest.mark.parametrize("prefix", ["(VllmWorker rank=3 pid=44710) ", "(VllmWorker TP1 pid=44710) ",
                                    "(EngineCore_DP2 pid=598582) ",
                                    "[2026-08-20 09:48:31] (VllmWorker rank=3 pid=44710) ",  # a collector's time first
                                    "[2026-08-20 09:48:31] (ActorWorker(reference-0) pid=7034) "])
def test_vllm_s_worker_prefixes_come_off_and_name_no_training_rank(prefix):
    """vLLM's multiprocess executor prefixes its workers' lines with their index in the engine (TP, DP):
    the rollout engine's own numbering, not the trainer's rank."""
    line = "ERROR 08-20 09:48:31 [pynccl_wrapper.py:229] Failed to load NCCL library from libnccl.so.2."
    p = peel(prefix + line)
    assert p.text == line and p.rank is None
