"""The phase of a Ray OOM kill: the task Ray's memory monitor killed, where its report names one
that the phase rules know, else the task of the node's biggest process in the report's table of top
memory users. Lines are filled in from Ray's format strings (src/ray/raylet/node_manager.cc
CreateOomKillMessageDetails, src/ray/common/memory_monitor.cc TopNMemoryDebugString); pids, sizes
and task names are made up."""

from __future__ import annotations

import pytest

from tests.offline.scoring import first_failure_of


def kill_report(killed: str, rows: list[tuple[int, float, str]]) -> str:
    """Ray's OOM kill as the driver prints it: the exception line, the node's memory with the killed
    task, the top memory users biggest first (Ray writes the table's header and rows with tabs)."""
    table = "".join(f"{pid}\t{gb:.2f}\t{cmd}\n" for pid, gb, cmd in rows)
    return ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
            "Memory on the node (IP: 10.0.0.5, ID: 9526eac4) where the task (task ID: 8c35c363, "
            f"name={killed}, pid=2121529, memory used=0.63GB) was running was 482.39GB / 503.52GB (0.958038), "
            "which exceeds the memory usage threshold of 0.95. Ray killed this worker (ID: 88da655e) because it "
            "was the most recently scheduled task; to see more information about memory usage on this node, use "
            "`ray logs raylet.out -ip 10.0.0.5`. Top 10 memory users:\n"
            "PID\tMEM(GB)\tCOMMAND\n" + table)


@pytest.mark.parametrize("killed, rows, phase", [
    # the driver's task was killed (the newest scheduled); the workers saving the critic held the memory
    ("main_task", [(2122099, 260.26, "ray::WorkerDict.critic_save_checkpoint"),
                   (2122347, 191.01, "ray::WorkerDict.critic_save_checkpoint"),
                   (2121529, 0.63, "ray::main_task")], "checkpoint-save"),
    # the killed task's own name says the phase, whatever the table holds
    ("WorkerDict.actor_rollout_compute_log_prob", [(2122099, 120.00, "ray::WorkerDict.critic_save_checkpoint")],
     "forward"),
    # the biggest process, not the first row a task rule knows: an idle worker is no task
    ("main_task", [(3001, 90.50, "ray::IDLE"), (3002, 88.00, "ray::WorkerDict.actor_rollout_generate_sequences"),
                   (3003, 12.00, "ray::WorkerDict.critic_save_checkpoint")], "forward"),
])
def test_the_oom_kill_takes_the_phase_of_the_task_it_names(killed, rows, phase):
    ff = first_failure_of(kill_report(killed, rows))
    assert (ff["signature"], ff["category"], ff["phase"]) == ("ray.oom_killed", "host-memory", phase)


@pytest.mark.parametrize("killed, rows", [
    # the biggest process runs a method no phase rule knows: the smaller save says nothing of it
    ("main_task", [(3001, 200.00, "ray::WorkerDict.actor_rollout_update_actor"),
                   (3002, 50.00, "ray::WorkerDict.critic_save_checkpoint")]),
    # no Ray worker in the table: the trainer's own processes name no task
    ("main_task", [(3001, 200.00, "/usr/bin/python3 -u train.py --config ppo.yaml")]),
    ("main_task", []),
])
def test_no_phase_where_the_report_names_no_known_task(killed, rows):
    ff = first_failure_of(kill_report(killed, rows))
    assert (ff["signature"], ff["phase"]) == ("ray.oom_killed", "unknown")


def test_a_table_far_below_the_kill_is_not_its_report():
    """Rows of another report, printed long after, say nothing of this kill."""
    text = kill_report("main_task", []) + "".join(f"step {i} done\n" for i in range(40)) + \
        "2122099\t260.26\tray::WorkerDict.critic_save_checkpoint\n"
    ff = first_failure_of(text)
    assert (ff["signature"], ff["phase"]) == ("ray.oom_killed", "unknown")
