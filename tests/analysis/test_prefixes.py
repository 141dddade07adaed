"""prefixes.peel: every known prefix comes off, in any order, and what it said is kept;
ordinary text is never taken for a prefix. Lines are written from each tool's format."""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.prefixes import peel
from tests.offline.scoring import Case, analyze, first_failure_of

WATCHDOG = ("[rank7]:[E218 10:48:25.681000 4242 ProcessGroupNCCL.cpp:632] [Rank 7] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
            "ran for 600021 milliseconds before timing out.")


@pytest.mark.parametrize("prefix, rank, node, stamp", [
    ("", 7, None, None),
    ("2026-02-18T10:48:25.681Z ", 7, None, "2026-02-18T10:48:25.681Z"),  # a collector's time
    ("2026-02-18T10:48:25.681234567Z stderr F ", 7, None, "2026-02-18T10:48:25.681234567Z"),  # CRI file
    ("\t", 7, None, None),
    ("29: ", 7, None, None),  # srun --label before the worker's own prefix: the worker's rank wins
    ("(WorkerDict pid=123, ip=10.0.0.5) ", 7, "10.0.0.5", None),  # Ray
    ("  (WorkerDict pid=123, ip=[fd00:5::30f]) ", 7, "fd00:5::30f", None),  # Ray on IPv6: the address in brackets
    ("trainer-1  | ", 7, None, None),  # docker compose
    ("(head, rank=0, pid=4773) ", 7, "head", None),  # SkyPilot: the node's name and index (a node, no rank)
    ("(worker1, rank=1, pid=88, ip=10.0.0.2) ", 7, "10.0.0.2", None),  # SkyPilot's worker node, its ip
    ("(train, pid=4773) ", 7, None, None),  # SkyPilot on one node: the task's name
    ("\x1b[36m", 7, None, None),  # colour left on (removed by traceback.visible before peel)
    ("> ", 7, None, None),  # Markdown quote
    ("E       ", 7, None, None),  # pytest's marker of a failing test's exception lines
    ("gpu-node-3: ", 7, "gpu-node-3", None),  # pdsh
    ("job.node-7 [stderr] ", 7, "node-7", None),
    ("train/1 [default3]:", 7, None, None),  # torchx's log viewer (role/replica), then torchrun --tee
    # a Python logger relaying the rank's line (its own "%(asctime)s - %(name)s - %(levelname)s - " header)
    ("2025-10-31 03:11:02,478 - trainer - INFO - ", 7, None, "2025-10-31 03:11:02,478"),
])
def test_a_known_prefix_hides_nothing(prefix, rank, node, stamp):
    from firstfault.analysis.traceback import visible
    p = peel(visible(prefix + WATCHDOG))
    assert p.text.startswith("[E218 10:48:25.681000 4242 ProcessGroupNCCL.cpp:632] [Rank 7] Watchdog caught")
    assert (p.rank, p.node, p.stamp) == (rank, node, stamp)
    assert load_catalog().match(p.text).signature.id == "nccl.watchdog_timeout"


def test_prefixes_stack_in_any_order():
    a = peel("2026-02-18T10:48:25Z (RayTrainWorker pid=77, ip=10.1.2.3) [rank3]: RuntimeError: x")
    b = peel("(RayTrainWorker pid=77, ip=10.1.2.3) 2026-02-18T10:48:25Z [rank3]: RuntimeError: x")
    for p in (a, b):
        assert (p.text, p.rank, p.node, p.stamp) == ("RuntimeError: x", 3, "10.1.2.3", "2026-02-18T10:48:25Z")
    assert a.key == b.key  # the same writer, whatever the order


def test_journald_kernel_line_keeps_host_and_time():
    p = peel("Feb 18 10:48:25 gpu-3 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.")
    assert p.text.startswith("NVRM: Xid (PCI:0000:3b:00): 79")
    assert (p.node, p.stamp) == ("gpu-3", "Feb 18 10:48:25")


def test_lightning_and_open_mpi_name_the_rank():
    assert peel("[rank: 3] Seed set to 42").rank == 3
    p = peel("[1,5]<stderr>:Traceback (most recent call last):")
    assert (p.text, p.rank) == ("Traceback (most recent call last):", 5)


def test_skypilot_s_node_index_is_no_rank():
    """SkyPilot's rank= counts nodes (SKYPILOT_NODE_RANK): a traceback behind it names its node, not its rank."""
    ff = first_failure_of("(head, rank=0, pid=4773) Traceback (most recent call last):\n"
                          '(head, rank=0, pid=4773)   File "/w/megatron/core/datasets/indexed_dataset.py", line 293, '
                          "in __init__\n"
                          "(head, rank=0, pid=4773)     assert self.sequence_lengths.shape[0] == self.document_indices[-1]\n"
                          "(head, rank=0, pid=4773) AssertionError\n")
    assert (ff["signature"], ff["category"], ff["rank"]) == ("python.exception", "framework", None)
    assert ff["node"] == "head"


def test_ray_repeat_suffix_and_bare_actor():
    p = peel("(pid=2345) RuntimeError: boom [repeated 3x across cluster]")
    assert p.text == "RuntimeError: boom" and p.key == "(pid=2345)"
    assert peel("(raylet) A worker died or was killed").text == "A worker died or was killed"


@pytest.mark.parametrize("line", [
    "RuntimeError: Expected all tensors to be on the same device",  # an exception line, not a host label
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "  File \"/w/train.py\", line 3, in main",  # a frame's indentation stays
    "0: hello",  # a number alone is no srun label unless the stream is labelled or something known follows
    "node03: ready",
    "Epoch 1: 100%|#####| 10/10",
    "2026-02-18 10:48:25,681 - INFO - loss 1.2",  # a program's own logging header stays
    "2026-02-18 10:48:25,681 - trainer - INFO - loss 1.2",  # and so does one with the logger's name
    "[2026-02-18 10:48:25,681] [INFO] [logging.py:96:log_dist] [Rank 0] hi",
    "(see above) the config is wrong",
    "(head, rank=0) the node index alone, no pid",
    "step-100: loss 2.1",
    "E1203 10:00:00.123456 4242 file.cc:12] a glog error line",  # glog's level letter, no spaces after it
    "ERROR   the job failed",
])
def test_ordinary_text_is_not_peeled(line):
    assert peel(line).text == line


def test_labels_known_from_earlier_lines_peel_a_tracebacks_source_lines():
    first = peel("worker-1: Traceback (most recent call last):")
    assert first.labels == ("worker-1",)
    assert peel("worker-1:     main()").text == "worker-1:     main()"
    assert peel("worker-1:     main()", labels=set(first.labels)).text == "    main()"
    assert peel("12: ValueError: bad", srun_labels=True).rank == 12


def test_a_traceback_behind_ray_prefixes_is_assembled_and_classified():
    log = "\n".join(f"(TaskRunner pid=4242, ip=10.0.0.9) {line}" for line in (
        "Traceback (most recent call last):",
        '  File "/opt/app/main_ppo.py", line 40, in run',
        "    trainer.fit()",
        '  File "/opt/app/trainer.py", line 88, in fit',
        "    out = self.actor.update_policy(batch)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.14 GiB of which 1.02 GiB is free.",
    )) + "\n"
    rep = analyze(Case("ray", ["-"], {}, stdin=log.encode()))
    ff = rep["first_failure"]
    assert ff["category"] == "gpu-memory" and ff["node"] == "10.0.0.9"
    assert ff["rank"] is None  # "GPU 0" is a device, not a rank


def test_a_heading_is_peeled_and_marked_as_prose():
    p = peel("# CUDA out of memory when training on two nodes")
    assert p.text == "CUDA out of memory when training on two nodes" and p.prose
    assert not peel("[rank1]: RuntimeError: x").prose


@pytest.mark.parametrize("line", ["Error:", "Error: ", "Log:", "Output:\t"])
def test_a_caption_alone_on_its_line_is_prose(line):
    p = peel(line)
    assert p.prose and p.text == line


@pytest.mark.parametrize("line", [
    "Exception: ",  # mp.spawn before 1.7: Exception(msg) whose msg starts with "\n\n-- Process 0 ..."
    "ValueError: ", "KeyboardInterrupt:", "UserWarning:", "SystemExit:",
    "Error", "Error: CUDA out of memory", "[rank1]: Error:", "Epoch: [19][300/7922]",
])
def test_not_a_caption(line):
    assert not peel(line).prose


def test_a_caption_above_a_pasted_spawn_failure_is_no_failure_of_its_own():
    """A person's "Error:" over mp.spawn's SIGKILL report (torch/multiprocessing/spawn.py
    ProcessContext.join: "process %d terminated with signal %s", 1.0+): the process index names
    the rank, the caption does not take the first place."""
    text = (
        "Error:\n"
        "Epoch: [4][120/900]\tTime: 0.611s (0.640s)\tLoss: 2.0e-04\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 212, in <module>\n'
        "    main()\n"
        '  File "/opt/venv/lib/python3.8/site-packages/torch/multiprocessing/spawn.py", line 118, in join\n'
        "    raise ProcessExitedException(\n"
        "torch.multiprocessing.spawn.ProcessExitedException: process 2 terminated with signal SIGKILL\n"
    )
    ff = first_failure_of(text)
    assert ff["signature"] == "torchelastic.worker_sigkill"
    assert ff["rank"] == 2
    assert ff["confidence"] != "high"


@pytest.mark.parametrize("line, text, peeled", [
    ("**RuntimeError: CUDA out of memory.**", "RuntimeError: CUDA out of memory.", "**"),
    ("_**### RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory**_",
     "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory", "_**### "),
])
def test_bold_around_a_whole_line_is_peeled_and_prose(line, text, peeled):
    p = peel(line)
    assert (p.text, p.peeled, p.prose) == (text, peeled, True)


@pytest.mark.parametrize("line", ["**kwargs", "__init__", "** not bold **", "**a** and **b", "x = 2**8**2"])
def test_not_bold_around_a_whole_line(line):
    p = peel(line)
    assert p.text == line and not p.prose


def test_a_bold_exception_line_under_a_pasted_spawn_traceback_ends_it():
    """mp.spawn's child traceback (torch/multiprocessing/spawn.py "-- Process %d terminated with the
    following error:") with its exception line pasted in bold: the catalog reads it as printed."""
    text = (
        "-- Process 0 terminated with the following error:\n"
        "Traceback (most recent call last):\n"
        '  File "/opt/venv/lib/python3.10/site-packages/torch/multiprocessing/spawn.py", line 69, in _wrap\n'
        "    fn(i, *args)\n"
        '  File "/opt/venv/lib/python3.10/site-packages/torch/serialization.py", line 242, in __init__\n'
        "    super().__init__(torch._C.PyTorchFileReader(name_or_buffer))\n"
        "**RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory**\n"
    )
    ff = first_failure_of(text)
    assert (ff["category"], ff["rank"]) == ("storage", 0)


@pytest.mark.parametrize("line, text", [
    ("[80851] E1202 10:12:00.462000 2611 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)",
     "E1202 10:12:00.462000 2611 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)"),
    ('[4242]   File "/opt/app/train.py", line 12, in <module>', '  File "/opt/app/train.py", line 12, in <module>'),
    ("[1830] [rank3]:[E1202 10:12:00.100000000 ProcessGroupNCCL.cpp:632] [Rank 3] x",
     "[E1202 10:12:00.100000000 ProcessGroupNCCL.cpp:632] [Rank 3] x"),
])
def test_a_log_viewers_line_number_is_peeled_and_names_no_one(line, text):
    p = peel(line)
    assert p.text == text
    assert p.key in ("", "rank3") and (p.rank == 3) == ("[rank3]" in line)


@pytest.mark.parametrize("line", [
    "[0] node0:13571:13571 [0] NCCL INFO Connected all rings",  # one or two digits: maybe a rank's tag
    "[12] ValueError: bad",
    "[12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",  # dmesg's time
    "[2026-12-02 10:12:00,462] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 4242",
    "[12345678] too long for a line number",
])
def test_not_a_line_number(line):
    assert peel(line).text == line


def test_a_line_numbered_paste_keeps_its_traceback_whole():
    # torchrun's worker traceback (format of traceback.print_exc) behind a viewer's line numbers
    lines = ["Traceback (most recent call last):",
             '  File "/opt/app/train.py", line 40, in <module>',
             "    main()",
             '  File "/opt/app/train.py", line 31, in main',
             "    loss = model(batch)",
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
             "79.14 GiB of which 1.02 GiB is free."]
    log = "\n".join(f"[{n}] {line}" for n, line in enumerate(lines, start=1750)) + "\n"
    ff = first_failure_of(log)
    assert ff["category"] == "gpu-memory" and ff["rank"] is None


def test_torchx_role_replica_label_is_peeled_before_a_worker_prefix():
    # torchx cli/cmd_log.py prints f"{role_name}/{replica_id} {line}"; NeMo-Run shows its logs this way
    p = peel("trainer/0 [default2]:[rank2]: Traceback (most recent call last):")
    assert (p.text, p.rank, p.local_rank) == ("Traceback (most recent call last):", 2, 2)
    q = peel("trainer/1 [default2]:[rank10]: Traceback (most recent call last):")
    assert q.key != p.key  # the same local rank on another replica is another writer


@pytest.mark.parametrize("line", [
    "trainer/0 started 8 processes",  # nothing known follows: a person's or a program's words
    "checkpoints/12 saved in 3.2 s",
    "see logs/3 [details]: below",  # brackets without a role and a number
])
def test_not_a_torchx_label(line):
    assert peel(line).text == line


def test_torchx_prefixed_traceback_names_its_rank():
    lines = ["[rank3]: Traceback (most recent call last):",
             '[rank3]:   File "/opt/app/train.py", line 40, in <module>',
             "[rank3]:     main()",
             "[rank3]: ValueError: expected 4 experts, found 2"]
    log = "".join(f"trainer/0 [default3]:{line}\n" for line in lines)
    ff = first_failure_of(log)
    assert ff["rank"] == 3 and ff["summary"]
