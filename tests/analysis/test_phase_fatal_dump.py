"""A fatal signal's phase from the faulthandler dump printed under it (findings._dumped).

CPython's faulthandler (Modules/faulthandler.c, 3.8-3.13) writes ``Fatal Python error: <name>``,
a blank line, then each thread's stack, most recent call first: ``Current thread 0x<id> (most
recent call first):`` for the thread that took the signal, ``Thread 0x<id> ...`` for the others
(and for all of them when a native thread took it), each frame as ``  File "<path>", line <n> in
<func>``. UCX prints its own ``Caught signal 7 (Bus error: ...)`` above for the same signal. Paths
and values are made up."""

from __future__ import annotations

from tests.offline.scoring import Case, analyze

DUMP = """\
Fatal Python error: {signal}

{header} 0x00007f3a2c1ff740 (most recent call first):
  File "/opt/env/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 3690 in barrier
  File "/work/Megatron-LM/megatron/training/initialize.py", line 231 in _compile_dependencies
  File "/work/Megatron-LM/megatron/training/initialize.py", line 97 in initialize_megatron
  File "/work/Megatron-LM/megatron/training/training.py", line 262 in pretrain
  File "/work/Megatron-LM/pretrain_gpt.py", line 240 in <module>
"""

UCX = "[node17:40211:0:40388] Caught signal 7 (Bus error: nonexistent physical address)\n"


def first(text: str) -> dict:
    return analyze(Case("paste", ["-"], {}, stdin=text.encode()))["first_failure"]


def test_a_fatal_signal_takes_the_phase_of_the_dump_under_it():
    got = first(DUMP.format(signal="Segmentation fault", header="Current thread"))
    assert (got["signature"], got["phase"]) == ("python.fatal_error", "init")


def test_a_native_handlers_report_of_the_same_signal_takes_it_too():
    got = first(UCX + "\n".join(["==== backtrace (tid:  40388) ====", " 0 0x0000000000014420 __funlockfile()  ???:0"])
                + "\n\n" + DUMP.format(signal="Bus error", header="Thread"))
    assert (got["signature"], got["phase"]) == ("ucx.caught_signal", "init")


def test_a_dump_printed_further_down_is_not_the_fatal_errors():
    # not-example: a later stack dump (py-spy, another process's faulthandler) after other lines
    later = "Fatal Python error: Segmentation fault\n\nnode17: rank 3 exited\nsome other line\n" + \
        DUMP.format(signal="Aborted", header="Current thread").split("\n", 2)[2]
    got = first(later)
    assert got["signature"] == "python.fatal_error" and got["phase"] == "unknown"
