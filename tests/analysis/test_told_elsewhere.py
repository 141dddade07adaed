"""A failure told in parts: a traceback cut before its exception line under the error line it raises;
the same failure cut on one rank and whole on another; NCCL's "Last error:" cause under the traceback
that raised its wrapper. Lines are written from the format strings of c10d (socket.cpp waitForInput,
DistStoreError), Megatron-Core (transformer_block.py's pipeline assertion) and NCCL (alloc.h)."""

from __future__ import annotations

from tests.offline.scoring import first_failure_of

BAR = "Tokenizing train set (num_proc=32):  93%|#########3| 3721/4000 [29:50<01:07, 4.13 examples/s]"
SOCKET_TIMEOUT = ("[rank1]:[W516 14:34:56.854597329 socket.cpp:489] [c10d] waitForInput: socket SocketImpl(fd=79, "
                  "addr=[localhost]:41170, remote=[localhost]:29500) timed out after 1800000ms")
CUT = ('[rank1]: Traceback (most recent call last):\n'
       '[rank1]:   File "/w/train.py", line 124, in <module>\n'
       '[rank1]:     main()\n'
       '[rank1]:   File "/w/train.py", line 88, in main\n'
       '[rank1]:     with training_args.main_process_first(desc="tokenize"):\n')


def test_a_cut_traceback_under_a_ranks_timeout_is_that_timeouts_raise():
    """The socket timeout's traceback, cut before DistStoreError's line, is no failure of its own: the
    wait it raises is what rank 1 said, and the bar of work rank 0 ran outlasted its timeout."""
    ff = first_failure_of("\n".join([BAR, SOCKET_TIMEOUT, CUT]))
    assert (ff["signature"], ff["category"], ff["phase"]) == ("hang.stopped_first", "config", "data")
    told = [e for e in ff["evidence"] if "socket.cpp" in e["text"]]
    assert told and "its traceback follows it" in told[0]["linked_by"]


def test_a_cut_traceback_far_below_or_of_another_rank_stays_its_own():
    """Not examples: the traceback of another rank, or one printed well below the line, is not its raise."""
    other = CUT.replace("[rank1]", "[rank0]")
    ff = first_failure_of("\n".join([SOCKET_TIMEOUT, other]))
    assert (ff["signature"], ff["rank"]) == ("python.traceback", 0)
    far = "\n".join([SOCKET_TIMEOUT] + [f"[rank1]: step {i} done" for i in range(5)] + [CUT])
    assert first_failure_of(far)["signature"] == "python.traceback"


def test_a_launchers_kill_line_is_no_error_a_traceback_belongs_to():
    """DeepSpeed's launcher printing "Killing subprocess" right above a worker's cut traceback did not
    raise it: the traceback stays the failure."""
    text = ("[2024-02-11 22:36:22,106] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 275125\n"
            + CUT.replace("[rank1]: ", ""))
    assert first_failure_of(text)["signature"] == "python.traceback"


PP_ASSERT = ('[rank{r}]: Traceback (most recent call last):\n'
             '[rank{r}]:   File "/usr/lib/python3/dist-packages/megatron/core/transformer/transformer_block.py", '
             'line 201, in _get_block_submodules\n'
             '[rank{r}]:     num_layers = get_num_layers_to_build(config)\n')
PP_END = ('[rank{r}]:   File "/usr/lib/python3/dist-packages/megatron/core/transformer/transformer_block.py", line 110, '
          'in get_num_layers_to_build\n'
          '[rank{r}]:     num_layers % config.pipeline_model_parallel_size == 0\n'
          '[rank{r}]: AssertionError: num_layers should be divisible by pipeline_model_parallel_size\n')


def test_untimed_the_failure_a_signature_names_comes_before_a_cut_traceback():
    """A paste with no times: rank 2's traceback is cut, rank 15's says what failed. The paste's order
    says little, so the failure named comes first."""
    ff = first_failure_of(PP_ASSERT.format(r=2) + PP_ASSERT.format(r=15) + PP_END.format(r=15))
    assert (ff["category"], ff["rank"], ff["phase"]) == ("config", 15, "init")


def test_timed_the_earlier_failure_stays_first_even_if_cut():
    """Not an example: where the lines are timed, the earlier one is first, cut or not."""
    cut = "[2026-01-05 10:00:00,000] [ERROR] [engine.py:1:x] step failed\n" + PP_ASSERT.format(r=2)
    whole = ("[2026-01-05 10:05:00,000] [INFO] [engine.py:2:y] retrying\n" + PP_ASSERT.format(r=15)
             + PP_END.format(r=15))
    ff = first_failure_of(cut + whole)
    assert ff["rank"] == 2


NCCL_CALLOC = """\
[rank3]: Traceback (most recent call last):
[rank3]:   File "/w/train.py", line 80, in train_step
[rank3]:     loss.backward()
[rank3]:   File "/usr/lib/python3/dist-packages/torch/_tensor.py", line 522, in backward
[rank3]:     torch.autograd.backward(
[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
[rank3]: ncclUnhandledCudaError: Call to CUDA function failed.
[rank3]: Last error:
[rank3]: Failed to CUDA calloc async 1920 bytes
"""


def test_nccls_failed_calloc_is_the_gpu_full_where_its_wrapper_was_raised():
    ff = first_failure_of(NCCL_CALLOC)
    assert (ff["signature"], ff["category"], ff["rank"], ff["phase"]) == ("nccl.cuda_calloc_failed", "gpu-memory", 3,
                                                                          "backward")
    assert ff["confidence"] != "high"


WRAPPED = ("[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
           "ProcessGroupNCCL.cpp:1275, internal error - please report this issue to the NCCL developers, NCCL version "
           "2.18.1\n"
           "[rank3]: ncclInternalError: Internal check failed.\n"
           "[rank3]: Last error:\n"
           "[rank3]: {cause}\n")


def test_a_peers_closed_socket_under_an_ncclresult_is_what_the_wrapper_meant():
    """NCCL returns a peer's closed socket as whatever code its caller had ("internal error" here): the rank
    saw its peer go, a cascade, not NCCL's defect; its traceback, cut below, is that line's raise."""
    closed = WRAPPED.format(cause="Net : Connection closed by remote peer 10.1.2.7<36821>") + CUT.replace("rank1", "rank3")
    ff = first_failure_of(closed)
    assert ff["category"] == "cascade" and ff["signature"] != "nccl.internal_error"
    told = [e for e in ff["evidence"] if "closed by remote peer" in e["text"]]
    assert told and "internal error" in told[0]["linked_by"]


def test_a_proxys_failed_call_under_an_internal_error_is_the_network_not_nccls_defect():
    ff = first_failure_of(WRAPPED.format(cause="Proxy Call to rank 0 failed (Connect)"))
    assert (ff["signature"], ff["category"], ff["rank"], ff["confidence"]) == (
        "nccl.proxy_socket_failed", "network", 3, "low")
    # not an example: a cause line another rank printed stands for nothing of rank 3's
    other = WRAPPED.format(cause="x").replace("[rank3]: x\n", "[rank5]: Net : Connection closed by remote peer 10.1.2.7<1>\n")
    assert first_failure_of(other)["signature"] == "nccl.internal_error"


# NCCL's WARN lines of two processes on one node, as NCCL_DEBUG=WARN prints them (host:pid:tid [cuda device]):
# the proxy of device 0's process loses its peer, device 3's process could not allocate its buffers
PROXY_THEN_OOM = """\
gpu-07:3063025:3066048 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer gpu-07<51159>
gpu-07:3063025:3066048 [0] proxy.cc:1143 NCCL WARN Socket recv failed while polling for opId=0x55a51966cc80
gpu-07:3063028:3066152 [3] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'
gpu-07:3063028:3066152 [3] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes
"""


def test_with_no_times_a_guess_comes_after_a_failure_named_surely():
    """Printed first but capped at low (a proxy's socket may have lost a process that ended), the proxy's failure
    is no earlier than the other process's out-of-memory, which a signature names surely."""
    ff = first_failure_of(PROXY_THEN_OOM)
    assert (ff["signature"], ff["category"]) == ("nccl.cuda_oom", "gpu-memory")
    # not an example: alone, the proxy's failure is still the failure
    alone = first_failure_of("".join(PROXY_THEN_OOM.splitlines(keepends=True)[:2]))
    assert alone["signature"] == "nccl.proxy_socket_failed"
