"""analysis/membership.py: which records of a job's selection are the job's own."""

from __future__ import annotations

from firstfault.analysis.membership import CONTEXT, JOB, OPEN_NS, OTHER, learn, named_pids
from firstfault.wire import Record

T0 = 1_796_206_319_782_000_000
S = 1_000_000_000


def rec(kind: str, source: str, message: str = "", *, at: int, job: str | None = "j", rank: int | None = None,
        pid: int | None = None, node: str = "n1", fields: dict | None = None) -> Record:
    return Record(node=node, stream="s", seq=0, source=source, kind=kind, message=message, occurred_ns=at,
                  observed_ns=at, job=job, rank=rank, pid=pid, fields=fields or {})


RANK0 = [rec("proc.start", "procs", at=T0, rank=0, pid=100, fields={"start_ns": T0, "cgroup": "/slurm/job_7"}),
         rec("rank.line", "ranklog", "step 1", at=T0 + S, rank=0),
         rec("proc.exit", "procs", at=T0 + 10 * S, rank=0, pid=100, fields={"code": -9, "signal": "SIGKILL"})]


def test_kernel_lines_name_pids_as_the_kernel_prints_them():
    assert named_pids("oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/a,task=python3,pid=4242,uid=0") == {4242}
    assert named_pids("Memory cgroup out of memory: Killed process 4242 (python3) total-vm:1kB") == {4242}
    assert named_pids("python3[4242]: segfault at 0 ip 00007f sp 00007f error 4") == {4242}
    assert named_pids("[   4242]     0  4242   100000    20000") == set()  # a row of the OOM task table


def test_kernel_lines_by_pid_cgroup_and_lifetime():
    m = learn(RANK0, "j")
    kill = "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg={cg},task_memcg={cg},task=python3,pid={pid},uid=0"
    assert m.place(rec("kernel.line", "kmsg", kill.format(cg="/x", pid=100), at=T0 + 9 * S, job=None)) == JOB
    # a data-loader worker of the rank, in the rank's memory cgroup
    assert m.place(rec("kernel.line", "kmsg", kill.format(cg="/slurm/job_7", pid=160), at=T0 + 9 * S, job=None)) == JOB
    assert m.place(rec("kernel.line", "kmsg", kill.format(cg="/other", pid=555), at=T0 + 9 * S, job=None)) == CONTEXT
    assert m.place(rec("kernel.line", "kmsg", kill.format(cg="/x", pid=100), at=T0 + 9 * S, job=None,
                       node="n2")) == CONTEXT  # pids are per node
    assert m.place(rec("kernel.line", "kmsg", "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
                       at=T0 + 5 * S, job=None)) == JOB
    assert m.place(rec("kernel.line", "kmsg", "e1000e: eth0 NIC Link is Down", at=T0 + 5 * S, job=None)) == CONTEXT
    assert m.place(rec("kernel.line", "kmsg", "Linux version 6.18", at=T0 - 60 * S, job=None)) == OTHER
    assert m.place(rec("cgroup.memory", "cgroup", at=T0 + S, job=None, fields={"pids": "100", "cgroup": "/c"})) == JOB
    assert m.place(rec("cgroup.memory", "cgroup", at=T0 + S, job=None, fields={"pids": "9", "cgroup": "/c"})) == CONTEXT


def test_processes_outside_the_jobs_life_or_of_no_job_are_not_members():
    before = [rec("proc.start", "procs", at=T0 - 100 * S, rank=0, pid=90, fields={"start_ns": T0 - 100 * S}),
              rec("proc.exit", "procs", at=T0 - 50 * S, rank=0, pid=90, fields={"code": 0})]
    m = learn(before + RANK0, "j")
    assert m.members == frozenset({("n1", 100)})
    assert m.place(before[1]) == OTHER and m.place(RANK0[2]) == JOB
    assert m.place(rec("proc.start", "procs", at=T0 + S, job=None, rank=0, pid=91)) == OTHER
    assert m.lifetime is not None and m.lifetime[0] > T0 - 50 * S


def test_lifetime_stays_open_while_a_member_runs_and_marks_widen_it():
    m = learn(RANK0[:2], "j")
    assert m.lifetime is not None and m.lifetime[1] == OPEN_NS
    mark = rec("job.mark", "marks", "job j start", at=T0 - 30 * S, fields={"event": "start"})
    m = learn([mark, *RANK0], "j")
    assert m.lifetime is not None and m.lifetime[0] <= T0 - 30 * S
    assert m.place(rec("kernel.line", "kmsg", "e1000e: eth0 NIC Link is Down", at=T0 - 20 * S, job=None)) == CONTEXT


def test_a_pid_names_the_member_only_while_it_held_it():
    # rank 0 (pid 100) lived T0..T0+10 s; later another process got pid 100 (pid_max 32768 wraps)
    # while the job's other rank still ran
    rank1 = [rec("proc.start", "procs", at=T0, rank=1, pid=101, fields={"start_ns": T0}),
             rec("rank.line", "ranklog", "step 9", at=T0 + 60 * S, rank=1)]
    m = learn(RANK0 + rank1, "j")
    kill = "Memory cgroup out of memory: Killed process {pid} (python3) total-vm:1kB, anon-rss:1kB"
    assert m.place(rec("kernel.line", "kmsg", kill.format(pid=100), at=T0 + 9 * S, job=None)) == JOB
    assert m.place(rec("kernel.line", "kmsg", kill.format(pid=100), at=T0 + 40 * S, job=None)) == CONTEXT
    assert m.place(rec("kernel.line", "kmsg", kill.format(pid=101), at=T0 + 40 * S, job=None)) == JOB  # still running
