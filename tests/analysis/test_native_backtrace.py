"""A native stack trace (PyTorch c10's "Exception raised from {function} at {file}:{line} (most recent
call first):" and "frame #{n}: {symbol} + {offset} ({address} in {library})", glibc's backtrace_symbols
"{object}({symbol}+{offset}) [{address}]") is the tail of a failure: a paste that kept only the frames
still shows that something failed; a trace under its message gives way to the message. Made-up paths,
addresses and values; the line shapes are the libraries'."""

from __future__ import annotations

from tests.offline.scoring import first_failure_of

LIB = "/venv/lib/python3.11/site-packages/torch/lib"

FRAMES_ONLY = f"""\
[rank2]: frame #17: <unknown function> + 0x5aee23a (0x7f00aa04323a in {LIB}/libtorch_cpu.so)
[rank2]: frame #18: <unknown function> + 0xd244b5 (0x7f00ab7f34b5 in {LIB}/libtorch_python.so)
[rank2]: frame #19: _PyObject_MakeTpCall + 0x25b (0x5600c3a10a7b in /usr/bin/python)
"""

RAISED_ONLY = f"""\
Exception raised from ncclCommWatchdog at /src/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1902 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f00d631a446 in {LIB}/libc10.so)
frame #1: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d (0x7f00d9d5afdd in {LIB}/libtorch_cuda.so)
"""

BACKTRACE_SYMBOLS = """\
/venv/lib/python3.11/site-packages/ray/_raylet.so(+0x9bcdfd) [0x7f0022f13dfd] ray::core::NormalSchedulingQueue::ScheduleRequests()
/venv/lib/python3.11/site-packages/ray/_raylet.so(+0xd0cd38) [0x7f0023263d38] EventTracker::RecordExecution()
"""

# Two survivors' watchdogs time out; each prints its C++ exception with the stack under it
WATCHDOG = f"""\
[rank0]:[E1203 10:15:02.118000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4410, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600071 milliseconds before timing out.
Exception raised from checkTimeout at /src/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:635 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f00d631a446 in {LIB}/libc10.so)
frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x23d (0x7f00a55cba6d in {LIB}/libtorch_cuda.so)
[rank1]:[E1203 10:15:02.119000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4410, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600072 milliseconds before timing out.
Exception raised from checkTimeout at /src/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:635 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f00d631a446 in {LIB}/libc10.so)
"""

# A paste that put one rank's frames above the survivors' messages
FRAMES_ABOVE_WATCHDOG = f"""\
frame #2: <unknown function> + 0x145c0 (0x7f00d64815c0 in {LIB}/libtorch.so)
frame #3: <unknown function> + 0x9ca94 (0x7f00d6e9ca94 in /lib/x86_64-linux-gnu/libc.so.6)

{WATCHDOG}"""

CUDA = f"""\
[rank3]:[E1203 10:15:02.118000 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 3] Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered
Exception raised from c10_cuda_check_implementation at /src/c10/cuda/CUDAException.cpp:43 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f00d631a446 in {LIB}/libc10.so)
frame #1: c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool) + 0x118 (0x7f00de3c58a8 in {LIB}/libc10_cuda.so)
"""

# A Python traceback whose exception message carries the C++ stack (TORCH_SHOW_CPP_STACKTRACES=1)
TRACEBACK = f"""\
Traceback (most recent call last):
  File "/work/train.py", line 40, in <module>
    dist.barrier()
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4159, in barrier
    work = group.barrier(opts=opts)
torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 3/4 clients joined.
Exception raised from waitForWorkers at /src/torch/csrc/distributed/c10d/TCPStore.cpp:299 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f00d631a446 in {LIB}/libc10.so)
"""


def test_frames_alone_still_show_a_failure_of_that_rank():
    ff = first_failure_of(FRAMES_ONLY)
    assert ff["signature"] == "cpp.native_backtrace"
    assert (ff["rank"], ff["category"], ff["confidence"]) == (2, "unknown", "low")


def test_the_raised_from_line_alone_shows_a_failure():
    ff = first_failure_of(RAISED_ONLY)
    assert (ff["signature"], ff["confidence"]) == ("cpp.native_backtrace", "low")


def test_backtrace_symbols_lines_alone_show_a_failure():
    assert first_failure_of(BACKTRACE_SYMBOLS)["signature"] == "cpp.native_backtrace"


def test_a_stack_under_its_message_gives_way_to_the_message():
    assert first_failure_of(CUDA)["signature"] == "cuda.illegal_memory_access"
    assert first_failure_of(TRACEBACK)["signature"] != "cpp.native_backtrace"


def test_survivors_stacks_do_not_hide_the_hang():
    for text in (WATCHDOG, FRAMES_ABOVE_WATCHDOG):
        ff = first_failure_of(text)
        assert ff["signature"] != "cpp.native_backtrace"
        assert ff["category"] == "cascade"


def test_a_launcher_stopping_its_workers_below_does_not_hide_the_frames():
    text = RAISED_ONLY + ("[2026-12-03 10:15:08,067] torch.distributed.elastic.multiprocessing.api: [WARNING] "
                          "Sending process 4711 closing signal SIGTERM\n")
    assert first_failure_of(text)["signature"] == "cpp.native_backtrace"


def test_a_timeout_check_that_raised_is_a_survivors_timeout():
    text = ("Exception raised from checkTimeout at /src/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:635 "
            "(most recent call first):\n"
            f"frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f00d631a446 in {LIB}/libc10.so)\n")
    ff = first_failure_of(text)
    assert ff["signature"] != "cpp.native_backtrace"
    assert ff["category"] == "cascade"
