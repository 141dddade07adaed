"""A native abort that a C++ runtime explains in one line, before the launcher's exit summary,
written from libstdc++'s and torchrun's format strings."""

from tests.offline.scoring import first_failure_of

# libstdc++ __cxa_pure_virtual ("pure virtual method called"), then std::terminate's handler
# ("terminate called without an active exception"): SIGABRT, which torchrun's agent reports
# (elastic/multiprocessing/api.py "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s")
PURE_VIRTUAL_AT_EXIT = """\
[rank0]: validation done, saving final metrics
pure virtual method called
terminate called without an active exception
E1202 10:12:00.462000 2611 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 0 (pid: 4270) of binary: /usr/bin/python3
"""

ABORT_ALONE = """\
terminate called without an active exception
E1202 10:12:00.462000 2611 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 0 (pid: 4270) of binary: /usr/bin/python3
"""


def test_a_pure_virtual_call_is_the_library_s_defect_at_medium():
    got = first_failure_of(PURE_VIRTUAL_AT_EXIT)
    assert (got["signature"], got["category"], got["rank"]) == ("cpp.pure_virtual_call", "framework", 0)
    assert got["confidence"] == "medium"


def test_an_abort_no_line_explains_names_no_owner():
    got = first_failure_of(ABORT_ALONE)
    assert got["signature"] != "cpp.pure_virtual_call" and got["category"] != "framework"
