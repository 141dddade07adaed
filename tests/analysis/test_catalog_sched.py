"""Schedulers, orchestrators and the NVIDIA driver (signatures/62-ray, 64-slurm, 66-kubernetes,
68-mpi, 75-nvidia): lines written from the sources' format strings, the near misses that must
not match, and small pasted logs run through `firstfault analyze -`."""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import load_catalog
from tests.offline.scoring import Case, analyze

CATALOG = load_catalog()

RAY_BOILERPLATE = (
    "(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot "
    "the problem, check the logs for the dead worker. RayTask ID: ffffffffffffffff0a1b2c3d4e5f607182930a1b01000000 "
    "Worker ID: 9f8e7d6c Node ID: 1a2b3c4d Worker IP address: 10.0.0.5 Worker port: 41234 Worker PID: 24215 "
    "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. "
    "End of file. There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to "
    "high memory usage. (2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or "
    "other unexpected errors.")


def sig(text: str) -> str | None:
    m = CATALOG.match(text)
    return None if m is None else m.signature.id


def paste(name: str, text: str) -> dict:
    return analyze(Case(name, ["-"], {}, stdin=text.encode()))


# ---------------------------------------------------------------------------------------------
# Lines, from the format strings
# ---------------------------------------------------------------------------------------------

def test_ray_boilerplate_listing_the_oom_killer_is_not_an_oom():
    m = CATALOG.match(RAY_BOILERPLATE)
    assert (m.signature.id, m.role, m.category) == ("ray.worker_died", "root", "unknown")
    assert m.groups["pid"] == "24215" and m.groups["exit_type"] == "SYSTEM_ERROR" and m.groups["ip"] == "10.0.0.5"
    newer = ("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
             "detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common causes "
             "include: (1) the process was killed by the OOM killer due to high memory usage, (2) ray stop --force "
             "was called, or (3) the worker crashed unexpectedly due to SIGSEGV or another unexpected error.")
    assert CATALOG.match(newer).category == "unknown"
    k8s_hint = ("Worker exit type: SYSTEM_ERROR Worker exit detail: Worker exits unexpectedly. Worker exits with an "
                "exit code None. The worker may have exceeded K8s pod memory limits.")
    assert CATALOG.match(k8s_hint).category == "unknown"


def test_only_rays_memory_monitor_says_oom():
    for text in (
        "(raylet) [2026-12-02 10:03:21,206 E 1 1] (raylet) node_manager.cc:3040: 1 Workers (tasks / actors) killed "
        "due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 0a1b, IP: 10.0.0.5) over "
        "the last time period.",
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "Worker exit type: NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due to the node running low on memory.",
    ):
        m = CATALOG.match(text)
        assert (m.signature.id, m.category, m.role) == ("ray.oom_killed", "host-memory", "root"), text
    m = CATALOG.match("Memory on the node (IP: 10.0.0.5, ID: 0a1b) where the task (task ID: 77aa, name=trainer, "
                      "rank=3,, pid=24215, memory used=12.00GB) was running was 480.00GB / 503.00GB (0.95), which "
                      "exceeds the memory usage threshold of 0.95.")
    assert m.groups["rank"] == "3" and m.groups["pid"] == "24215" and m.groups["ip"] == "10.0.0.5"
    # a worker's CUDA OOM wrapped by Ray is no host memory
    assert sig("ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.update_actor() (pid=1, ip=10.0.0.5)") \
        == "ray.task_error"
    assert CATALOG.get("ray.task_error").role == "context"


def test_ray_wrapped_exception_decides_when_its_traceback_follows():
    text = ("ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.update_actor() (pid=24215, ip=10.0.0.5)\n"
            '  File "/app/verl/workers/fsdp_workers.py", line 400, in update_actor\n'
            "    loss.backward()\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.10 GiB of which 1.02 GiB is free.")
    assert sig(text) == "cuda.oom"


def test_ray_intended_exits_and_timeouts_are_cascades():
    for text in ("Worker exit type: INTENDED_USER_EXIT Worker exit detail: Worker exits by an user request. "
                 "exit_actor() is called.",
                 "The actor is dead because it was killed by `ray.kill`.",
                 "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready."):
        assert CATALOG.match(text).role == "cascade", text


def test_slurm_task_number_is_the_rank_and_the_signal_decides_the_role():
    m = CATALOG.match("srun: error: gpu-07: task 3: Out Of Memory")
    assert (m.signature.id, m.category, m.groups["rank"]) == ("slurm.oom_kill", "host-memory", "3")
    assert CATALOG.match("srun: error: gpu-07: task 3: Killed").role == "root"
    assert CATALOG.match("srun: error: gpu-07: task 3: Killed").category == "unknown"
    assert CATALOG.match("srun: error: gpu-[07-08]: tasks 0-2,4: Terminated").role == "cascade"
    assert "rank" not in CATALOG.match("srun: error: gpu-[07-08]: tasks 0-2,4: Terminated").groups
    e = CATALOG.match("srun: error: gpu-07: task 12: Exited with exit code 1")
    assert (e.role, e.groups["rank"], e.groups["exitcode"]) == ("context", "12", "1")
    assert CATALOG.match("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.").role == "cascade"


@pytest.mark.parametrize("line,sid,role,category", [
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=99.0. Some of the step tasks have been OOM Killed.",
     "slurm.oom_kill", "root", "host-memory"),
    ("slurmstepd: error: Detected 5 oom-kill event(s) in StepId=99.batch cgroup. Some of your processes may have "
     "been killed by the cgroup out-of-memory handler.", "slurm.oom_kill", "root", "host-memory"),
    ("slurmstepd: error: *** JOB 99 ON gpu-07 CANCELLED AT 2026-12-02T10:00:00 DUE TO TIME LIMIT ***",
     "slurm.time_limit", "root", "config"),
    ("slurmstepd: error: *** STEP 99.0 ON gpu-07 CANCELLED AT 2026-12-02T10:00:00 DUE TO PREEMPTION ***",
     "slurm.preempted", "root", "unknown"),
    ("slurmstepd: error: *** JOB 99 ON gpu-07 CANCELLED AT 2026-12-02T10:00:00 DUE TO NODE FAILURE, SEE SLURMCTLD "
     "LOG FOR DETAILS ***", "slurm.node_fail", "root", "hardware"),
    ("slurmstepd: error: *** STEP 99.0 ON gpu-07 CANCELLED AT 2026-12-02T10:00:00 ***",
     "slurm.job_cancelled", "cascade", "cascade"),
    ("slurmstepd: error: *** STEP 99.0 ON gpu-07 CANCELLED AT 2026-12-02T10:00:00 DUE TO TASK FAILURE ***",
     "slurm.job_cancelled", "cascade", "cascade"),
    ("srun: error: Node failure on gpu-08", "slurm.node_fail", "root", "hardware"),
])
def test_slurm_step_ends(line, sid, role, category):
    m = CATALOG.match(line)
    assert (m.signature.id, m.role, m.category) == (sid, role, category)


def test_mpi_rank_and_signal():
    m = CATALOG.match("mpirun noticed that process rank 5 with PID 24215 on node gpu-08 exited on signal 9 (Killed).")
    assert (m.signature.id, m.groups["rank"], m.groups["pid"], m.groups["signal"]) == ("mpi.proc_signal", "5", "24215", "9")
    wrapped = CATALOG.match("prterun noticed that process rank 7 with PID 0 on node gpu-08 exited on")
    assert wrapped.groups["rank"] == "7" and "signal" not in wrapped.groups
    assert CATALOG.match("mpirun noticed that process rank 5 with PID 1 on node n1 exited on signal 15 (Terminated)."
                         ).role == "cascade"
    assert CATALOG.match("MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD").groups["rank"] == "2"
    assert CATALOG.match("  Process name: [[41022,1],3]").role == "context"


def test_kubernetes_reasons():
    assert CATALOG.match("      Reason:       OOMKilled").category == "host-memory"
    assert CATALOG.match("      Reason:       Error") is None
    assert CATALOG.match("      Exit Code:    137").role == "context"
    assert CATALOG.match("The node was low on resource: memory. Threshold quantity: 100Mi, available: 5Mi.").category \
        == "host-memory"
    assert CATALOG.match("The node was low on resource: ephemeral-storage.").category == "storage"
    assert CATALOG.match("  Normal  Preempted  1m  default-scheduler  Preempted by pod 3f2a on node gpu-07").category \
        == "unknown"
    # Kubernetes' own words for a job-level summary carry no rank
    assert "rank" not in CATALOG.match("PyTorchJob llm has failed because 1 Worker replica(s) failed.").groups


def test_nvidia_driver_lines():
    m = CATALOG.match("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    assert (m.signature.id, m.category, m.groups["xid"], m.groups["pci"]) == ("nvidia.xid", "hardware", "79", "0000:3b:00")
    prev = CATALOG.match("NVRM: Xid (PCI:0000:3b:00): 45, pid=24215, name=python3, Ch 00000010 caused by previous Xid 79")
    assert prev.role == "context"
    assert CATALOG.match("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.").signature.id == "nvidia.gpu_fell_off_bus"
    ident = CATALOG.match("NVRM: GPU at PCI:0000:3b:00: GPU-8a47641b-dff6-f09f-618c-c3eb58fb430d")
    assert (ident.signature.id, ident.role) == ("nvidia.gpu_identity", "context")
    assert CATALOG.match("NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x22:0x56:667)").category == "hardware"
    assert CATALOG.match("NVRM: A GPU crash dump has been created. If possible, please run").role == "context"
    for code, bucket, category in ((48, "hardware", "hardware"), (63, "informational", "hardware"),
                                   (64, "hardware", "hardware"), (74, "hardware", "hardware"),
                                   (92, "informational", "hardware"), (94, "hardware", "hardware"),
                                   (95, "hardware", "hardware"), (119, "driver", "hardware"),
                                   (120, "driver", "hardware"), (140, "hardware", "hardware"),
                                   (13, "application", "user-code"), (43, "application", "user-code")):
        x = CATALOG.xid(code)
        assert (x.bucket, x.category) == (bucket, category), code
    assert CATALOG.xid(154).role == "context" and CATALOG.xid(45).role == "context"
    # the GPU's PCI address and its index are no rank
    assert "rank" not in m.groups


# ---------------------------------------------------------------------------------------------
# Pasted logs through the whole analysis
# ---------------------------------------------------------------------------------------------

VERL_RAY_OOM = """\
(TaskRunner pid=31002) step:12 - actor/pg_loss:0.031 - critic/score/mean:0.42
(WorkerDict pid=31455) [Rank 0] rollout finished, generating log probs
(raylet) [2026-12-02 10:03:21,206 E 31000 31000] (raylet) node_manager.cc:3277: 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 0a1b2c3d4e5f, IP: 10.0.0.5) over the last time period. To see more information about the Workers killed on this node, use `ray logs raylet.out -ip 10.0.0.5`
(raylet)
(raylet) Refer to the documentation on how to address the out of memory issue: https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-prevention.html. Consider provisioning more memory on this node or reducing task parallelism by requesting more CPUs per task. To adjust the kill threshold, set the environment variable `RAY_memory_usage_threshold` when starting Ray. To disable worker killing, set the environment variable `RAY_memory_monitor_refresh_ms` to zero.
Error executing job with overrides: ['trainer.nnodes=1']
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
\tclass_name: create_colocated_worker_cls.<locals>.WorkerDict
\tactor_id: 0a1b2c3d4e5f60718293a4b501000000
\tpid: 31455
\tip: 10.0.0.5
The actor is dead because its worker process has died. Worker exit type: NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due to the node running low on memory.
"""


def test_paste_ray_memory_monitor_kill_is_host_memory():
    ff = paste("verl-ray-oom", VERL_RAY_OOM)["first_failure"]
    assert (ff["signature"], ff["category"]) == ("ray.oom_killed", "host-memory")


def test_paste_ray_boilerplate_alone_is_an_unknown_death_not_an_oom():
    text = "(WorkerDict pid=24215) [Rank 1] update_actor step 40\n" + RAY_BOILERPLATE + "\n"
    ff = paste("ray-boilerplate", text)["first_failure"]
    assert ff["signature"] == "ray.worker_died" and ff["category"] == "unknown"
    assert ff["confidence"] != "high"


RAY_WRAPPED_CUDA_OOM = """\
Traceback (most recent call last):
  File "/app/verl/trainer/main_ppo.py", line 64, in main
    run_ppo(config)
  File "/usr/lib/python3.11/site-packages/ray/_private/worker.py", line 2661, in get
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_actor() (pid=24215, ip=10.0.0.5, actor_id=0a1b, repr=<verl.single_controller.ray.base.WorkerDict object at 0x7f1c>)
  File "/app/verl/workers/fsdp_workers.py", line 400, in update_actor
    metrics = self.actor.update_policy(data=data)
  File "/app/verl/workers/actor/dp_actor.py", line 310, in update_policy
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.02 GiB is free. Process 24215 has 78.07 GiB memory in use.
"""


def test_paste_ray_wrapped_worker_exception_is_the_failure():
    ff = paste("ray-wrapped-cuda-oom", RAY_WRAPPED_CUDA_OOM)["first_failure"]
    assert (ff["signature"], ff["category"]) == ("cuda.oom", "gpu-memory")


SLURM_CGROUP_OOM = """\
[rank3]: step 210 loss 2.113
slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks have been OOM Killed.
srun: error: gpu-07: task 3: Out Of Memory
srun: launch/slurm: _step_signal: Terminating StepId=4242.0
slurmstepd: error: *** STEP 4242.0 ON gpu-07 CANCELLED AT 2026-12-02T10:03:21 ***
srun: error: gpu-07: tasks 0-2: Terminated
srun: Force Terminated StepId=4242.0
"""


def test_paste_slurm_oom_names_the_task_as_rank():
    ff = paste("slurm-cgroup-oom", SLURM_CGROUP_OOM)["first_failure"]
    assert ff["category"] == "host-memory" and ff["signature"] == "slurm.oom_kill"
    assert ff["rank"] in (3, None)  # the Detected line comes first and names no task; then task 3
    rep = paste("slurm-cgroup-oom", SLURM_CGROUP_OOM)
    assert rep["ranks"]["3"]["first_error"]["signature"] == "slurm.oom_kill"


SLURM_TIME_LIMIT = """\
[2026-12-02 09:59:58,000] [INFO] [timer.py:264:stop] epoch=0/micro_step=400/global_step=400, RunningAvgSamplesPerSec=41.2, CurrSamplesPerSec=40.9, MemAllocated=12.1GB, MaxMemAllocated=30.2GB
slurmstepd: error: *** JOB 4242 ON gpu-07 CANCELLED AT 2026-12-02T10:00:01 DUE TO TIME LIMIT ***
srun: Job step aborted: Waiting up to 32 seconds for job step to finish.
srun: error: gpu-07: tasks 0-7: Terminated
"""


def test_paste_slurm_time_limit_is_a_config_root_not_a_crash():
    ff = paste("slurm-time-limit", SLURM_TIME_LIMIT)["first_failure"]
    assert (ff["signature"], ff["category"]) == ("slurm.time_limit", "config")


def test_paste_plain_cancel_and_terminated_tasks_blame_nobody():
    text = ("slurmstepd: error: *** STEP 4242.0 ON gpu-07 CANCELLED AT 2026-12-02T10:00:01 ***\n"
            "srun: error: gpu-07: tasks 0-3: Terminated\n")
    rep = paste("slurm-cancel", text)
    ff = rep["first_failure"]
    assert ff is None or ff.get("inferred") or ff["signature"] not in ("slurm.job_cancelled", "slurm.task_terminated")
    assert all(d["signature"] not in ("slurm.job_cancelled", "slurm.task_terminated") for d in rep["distinct_failures"])


MPIRUN_KILL = """\
[2026-12-02 10:03:00,000] [INFO] [logging.py:128:log_dist] [Rank 0] step=300, skipped=0, lr=[1e-05], mom=[(0.9, 0.999)]
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun noticed that process rank 5 with PID 24215 on node gpu-08 exited on signal 9 (Killed).
--------------------------------------------------------------------------
"""


def test_paste_mpirun_names_the_rank():
    ff = paste("mpirun-kill", MPIRUN_KILL)["first_failure"]
    assert ff["rank"] == 5 and ff["signature"] == "mpi.proc_signal"
    assert ff["confidence"] != "high"  # a SIGKILL alone does not say who sent it


def test_paste_mpirun_with_pid_and_node_blanked_out_still_names_the_rank():
    """Users blank out PIDs and host names before they paste (xxxxxx): the line stays Open MPI's."""
    blanked = MPIRUN_KILL.replace("with PID 24215 on node gpu-08", "with PID xxxxxx on node xxxxxxxx")
    rep = paste("mpirun-kill-blanked", blanked)
    ff = rep["first_failure"]
    assert (ff["rank"], ff["signature"], ff["category"], ff["confidence"]) == (5, "mpi.proc_signal", "host-memory", "low")
    assert ff["node"] is None and "xxxxxxxx" not in {n["node"] for n in rep["nodes"]}
    assert CATALOG.match("mpirun noticed that process rank 5 with PID xxxxxx on node gpu-08 exited on signal 15 "
                         "(Terminated).").role == "cascade"


OMPI_CRASH = """\
[gpu-08:24215] *** Process received signal ***
[gpu-08:24215] Signal: Segmentation fault (11)
[gpu-08:24215] Signal code: Address not mapped (1)
[gpu-08:24215] Failing at address: 0x10
[gpu-08:24215] [ 0] /lib/x86_64-linux-gnu/libc.so.6(+0x42520)[0x7f0c1a242520]
[gpu-08:24215] *** End of error message ***
--------------------------------------------------------------------------
mpirun noticed that process rank 5 with PID 24215 on node gpu-08 exited on signal 11 (Segmentation fault).
--------------------------------------------------------------------------
"""


def test_paste_open_mpis_crash_report_is_the_rank_mpirun_names_by_pid():
    """Open MPI's signal handler writes "[host:pid] Signal: ..." (HOSTFORMAT "[%s:%05d] "): the pid is
    the one mpirun's line ties to rank 5."""
    ff = paste("ompi-segv", OMPI_CRASH)["first_failure"]
    assert (ff["signature"], ff["rank"], ff["rank_from"]) == ("mpi.crash_signal", 5, "pid 24215")
    assert ff["confidence"] != "high"


def test_paste_an_abort_open_mpi_reports_is_not_the_failure_printed_above_it():
    aborted = "free(): invalid pointer\n" + OMPI_CRASH.replace("Segmentation fault (11)", "Aborted (6)").replace(
        "signal 11 (Segmentation fault)", "signal 6 (Aborted)")
    assert paste("ompi-abort", aborted)["first_failure"]["signature"] == "glibc.heap_corruption"
    assert (sig("[gpu-08:24215] Signal: Aborted (6)"), sig("[gpu-08:24215] Signal: Segmentation fault (11)")) == (
        "mpi.signal_report", "mpi.crash_signal")
    assert sig("[2026-12-02 10:03:00] Signal: Segmentation fault (11)") != "mpi.crash_signal"  # a time, no host:pid


K8S_DESCRIBE = """\
Name:             llm-sft-worker-1
Namespace:        default
Containers:
  pytorch:
    State:          Waiting
      Reason:       CrashLoopBackOff
    Last State:     Terminated
      Reason:       OOMKilled
      Exit Code:    137
      Started:      Wed, 02 Dec 2026 09:40:11 +0000
      Finished:     Wed, 02 Dec 2026 10:03:21 +0000
    Restart Count:  3
Events:
  Type     Reason   Age                From     Message
  ----     ------   ----               ----     -------
  Warning  BackOff  2m (x9 over 20m)   kubelet  Back-off restarting failed container pytorch in pod llm-sft-worker-1_default(5c1d2e3f)
"""


def test_paste_kubectl_describe_oomkilled():
    ff = paste("k8s-describe", K8S_DESCRIBE)["first_failure"]
    assert (ff["signature"], ff["category"]) == ("k8s.oom_killed", "host-memory")


DMESG_XID79 = """\
[Wed Dec  2 10:03:21 2026] NVRM: GPU at PCI:0000:3b:00: GPU-8a47641b-dff6-f09f-618c-c3eb58fb430d
[Wed Dec  2 10:03:21 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=24215, name=python3, GPU has fallen off the bus.
[Wed Dec  2 10:03:21 2026] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
[Wed Dec  2 10:03:22 2026] NVRM: A GPU crash dump has been created. If possible, please run
[Wed Dec  2 10:03:22 2026] NVRM: nvidia-bug-report.sh as root to collect this data before
[Wed Dec  2 10:03:22 2026] NVRM: the NVIDIA kernel module is unloaded.
"""


def test_paste_dmesg_xid79_is_hardware():
    ff = paste("dmesg-xid79", DMESG_XID79)["first_failure"]
    assert ff["category"] == "hardware" and ff["signature"] in ("nvidia.xid", "nvidia.gpu_fell_off_bus")
    assert ff["rank"] is None  # a PCI address is no rank


def test_slurm_memory_limit_reached_is_context_the_accounting_kill_is_root():
    hit = CATALOG.match("slurmstepd: error: Exceeded step memory limit at some point.")
    assert (hit.signature.id, hit.role) == ("slurm.memory_limit_hit", "context")
    kill = CATALOG.match("srun: Exceeded job memory limit")
    assert (kill.signature.id, kill.role, kill.category) == ("slurm.job_memory_limit", "root", "host-memory")
    # a task's death by signal names the task, not the rank (see 64-slurm.toml)
    assert CATALOG.match("srun: error: gpu-07: task 3: Aborted (core dumped)").groups.get("task") == "3"
    assert "rank" not in CATALOG.match("srun: error: gpu-07: task 3: Aborted (core dumped)").groups


def test_prose_is_not_a_kubernetes_or_slurm_status():
    assert sig("I think the worker pod got OOMKilled again after the upgrade") is None
    assert sig("We had a node failure on the cluster last night") is None


# srun's _task_finish names several tasks in one line ("tasks 0-3,5: Exited with exit code 1"): each is a
# failed task, so a later one-task line ("task 9: ...") is not the only failure.
SRUN_MANY_EXITED = """\
RuntimeError: NCCL error in: /opt/venv/lib/python3.8/site-packages/torch/lib/c10d/NCCLUtils.hpp:82, invalid argument, NCCL version 2.7.8
srun: error: gpu-07: tasks 1-3,5: Exited with exit code 1
srun: error: gpu-08: tasks 8-10: Exited with exit code 1
srun: error: gpu-08: task 9: Exited with exit code 1
"""

SRUN_ONE_EXITED_THEN_KILLED = """\
srun: error: gpu-07: task 5: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=4242.0
slurmstepd: error: *** STEP 4242.0 ON gpu-07 CANCELLED AT 2026-12-02T10:00:36 ***
srun: error: gpu-07: tasks 3,7: Killed
srun: error: gpu-08: tasks 8-15: Killed
"""


def test_srun_task_ranges_parse_as_ranks():
    from firstfault.analysis.rankstate import MAX_TASKS, task_ranks
    assert task_ranks("1-3,5") == [1, 2, 3, 5]
    assert task_ranks("[8-10]") == [8, 9, 10]
    assert task_ranks("7") == [7]
    assert task_ranks("3-1") == [] and task_ranks("a-b") == [] and task_ranks("1-") == []
    assert task_ranks(f"0-{MAX_TASKS}") == []  # more than it keeps: none, not a part


def test_paste_srun_task_ranges_are_all_failed_ranks():
    rep = paste("srun-many-exited", SRUN_MANY_EXITED)
    ff = rep["first_failure"]
    assert ff["rank"] is None  # ranks 1-3, 5, 8-10 failed: no one of them is the only one
    assert {r for r, v in rep["ranks"].items() if (v.get("exit") or {}).get("code") == 1} == {
        "1", "2", "3", "5", "8", "9", "10"}


def test_paste_srun_killed_ranges_after_one_exit_keep_that_task():
    ff = paste("srun-one-exited", SRUN_ONE_EXITED_THEN_KILLED)["first_failure"]
    assert ff["rank"] == 5


# Horovod's SHUT_DOWN_ERROR (horovod/common SHUT_DOWN_ERROR) on a survivor, under mpirun's
# --tag-output prefix, then Open MPI's summary naming the first process that exited.
HOROVOD_SHUTDOWN = """\
[1,1]<stderr>:  File "/opt/venv/lib/python3.8/site-packages/horovod/torch/mpi_ops.py", line 436, in synchronize
[1,1]<stderr>:    mpi_lib.horovod_torch_wait_and_clear(handle)
[1,1]<stderr>:RuntimeError: Horovod has been shut down. This was caused by an exception on one of the ranks or an \
attempt to allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If the shutdown was \
caused by an exception, you should see the exception in the log before the first shutdown message.
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[41022,1],0]
  Exit code:    1
"""


def test_horovod_shut_down_is_a_survivors_cascade():
    m = CATALOG.match("[1,1]<stderr>:RuntimeError: Horovod has been shut down. This was caused by an exception on "
                      "one of the ranks or an attempt to allreduce, allgather or broadcast a tensor after one of the "
                      "ranks finished execution.")
    assert (m.signature.id, m.role, m.category) == ("horovod.shut_down", "cascade", "cascade")
    assert sig("ValueError: Horovod has not been initialized; use hvd.init().") != "horovod.shut_down"


def test_paste_horovod_shut_down_never_blames_the_survivor():
    ff = paste("horovod-shutdown", HOROVOD_SHUTDOWN)["first_failure"]
    assert ff is None or not (ff["rank"] == 1 and ff["category"] in ("user-code", "framework"))
    assert ff is None or ff["signature"] != "python.exception"


# mosaicml/composer composer/cli/launcher.py: the monitor's first crash, then the ranks' exits at cleanup.
COMPOSER_SIGBUS = """\
INFO:composer.cli.launcher:Starting distributed environment on local node for global_rank(0-7)
INFO:composer.cli.launcher:Launching process for local_rank(2), global_rank(2) with command(['/usr/bin/python', '-u', 'train.py', 'yamls/mpt-1b.yaml'])
ERROR:composer.cli.launcher:Rank 2 crashed with exit code -7.
Waiting up to 30 seconds for all training processes to terminate. Press Ctrl-C to exit immediately.
Global rank 2 (PID 24215) exited with code -7
"""

COMPOSER_SEGFAULT = """\
ERROR:composer.cli.launcher:Rank 0 crashed with exit code -11.
Global rank 0 (PID 24215) exited with code -11
"""


def test_composer_s_first_crashed_rank_is_the_failure_and_a_sigbus_points_at_shared_memory():
    ff = paste("composer-sigbus", COMPOSER_SIGBUS)["first_failure"]
    assert (ff["signature"], ff["rank"], ff["category"], ff["confidence"]) == ("composer.rank_signal", 2, "config", "low")
    assert "/dev/shm" in ff["evidence"][0]["linked_by"]
    assert ff["first_action"].startswith("Read rank 2's own output (the launcher keeps it in rank2.stderr.txt")


def test_a_composer_segfault_names_its_rank_and_no_cause():
    ff = paste("composer-segfault", COMPOSER_SEGFAULT)["first_failure"]
    assert (ff["signature"], ff["rank"], ff["category"]) == ("composer.rank_signal", 0, "unknown")


def test_composer_s_sigterm_and_plain_exits_are_not_a_death_by_signal():
    assert sig("ERROR:composer.cli.launcher:Rank 3 crashed with exit code -15.") != "composer.rank_signal"
    assert sig("ERROR:composer.cli.launcher:Rank 3 crashed with exit code 1.") == "composer.rank_exit"
