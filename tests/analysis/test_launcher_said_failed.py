"""A launcher's or an operator's word that a worker failed, when nothing else in the text says what
failed, is the failure at low confidence, never "no failure found" (judge._child_failed, catalog trait
child-failed). Lines are written from the format strings the signatures' references name: Open MPI's
help-orterun.txt [orterun:non-zero-exit], kubeflow's training-operator job conditions, the MPI
operator's eviction condition. Also: a traceback reads as its own exception line, not as a context line
another thread printed into it."""

from __future__ import annotations

import pytest

from tests.offline.scoring import first_failure_of

OMPI_NONZERO = """--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[40417,1],5]
  Exit code:    1
--------------------------------------------------------------------------
"""


def test_mpiruns_first_nonzero_exit_names_the_rank():
    ff = first_failure_of(OMPI_NONZERO)
    assert (ff["signature"], ff["rank"], ff["category"], ff["confidence"]) == ("mpi.nonzero_exit", 5, "unknown", "low")
    assert "is all there is" in ff["evidence"][0]["linked_by"]


def test_a_ranks_own_error_comes_before_mpiruns_summary():
    ff = first_failure_of("[1,5]<stderr>:ValueError: expected 4 dims, got 3\n" + OMPI_NONZERO)
    assert ff["signature"] == "python.exception" and ff["category"] != "unknown"


def test_the_daemons_names_are_no_rank():
    """Not an example: ORTE names its daemons [[family,0],N]; N is a node's daemon, not a rank."""
    assert first_failure_of("  HNP daemon   : [[16919,0],0] on node gpu-01\n  Process name: [[16919,0],2]\n") is None


@pytest.mark.parametrize("line, signature", [
    ("  Message:               TFJob team/bert has failed because 1 Worker replica(s) failed.", "k8s.training_job_failed"),
    ("Warning  PyTorchJobFailed  2m  pytorchjob-controller  PyTorchJob default/llm-sft has failed because 2 Worker "
     "replica(s) failed.", "k8s.training_job_failed"),
    ("    message: 1/8 workers are evicted", "k8s.evicted"),
])
def test_an_operator_that_says_the_job_failed_is_a_failure_of_unknown_kind(line, signature):
    ff = first_failure_of(line + "\n")
    assert (ff["signature"], ff["category"], ff["rank"]) == (signature, "unknown", None)
    assert ff["confidence"] in ("low", "medium")


def test_an_nccl_error_no_signature_knows_is_still_a_failure():
    """C10D_NCCL_CHECK's "NCCL error in: file:line, <reason>" with a reason worded otherwise (another NCCL
    build, a retyped paste) is a failure of unknown kind, not nothing."""
    ff = first_failure_of("RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:272, "
                          "unhanled system error\n")
    assert (ff["signature"], ff["category"], ff["confidence"]) == ("nccl.error_in", "unknown", "low")
    # not an example: a reason NCCL names has its own signature
    ff = first_failure_of("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
                          "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n")
    assert ff["signature"] == "nccl.system_error"


def test_a_traceback_reads_as_its_exception_not_a_line_printed_into_it():
    """DeepSpeed's checkpoint engine logs "Loading checkpoint from ..." while the main thread raises: the
    log line lands inside the traceback's text, and the traceback is still the ZeRO exception."""
    text = ('Traceback (most recent call last):\n  File "train.py", line 584, in main\n'
            '    it = load_checkpoint(model, optimizer, args)\n  File "/w/utils.py", line 339, in load_checkpoint\n'
            "[2023-03-21 20:28:05,674] [INFO] [torch_checkpoint_engine.py:21:load] [Torch] Loading checkpoint from "
            "/ckpt/80000/mp_rank_00_model_states.pt...\n"
            '    load_lr_scheduler_states=True)\n'
            '  File "/usr/lib/python3/site-packages/deepspeed/runtime/engine.py", line 2950, in _load_zero_checkpoint\n'
            '    raise ZeRORuntimeException("The checkpoint being loaded used a DP " \\\n'
            "deepspeed.runtime.zero.utils.ZeRORuntimeException: The checkpoint being loaded used a DP world size of 16 "
            "but the current world size is 8. Automatic adjustment of ZeRO's optimizer state partitioning with a new "
            "world size is not currently supported.\n")
    ff = first_failure_of(text)
    assert (ff["signature"], ff["category"], ff["phase"]) == ("deepspeed.zero_dp_world_size_changed", "config",
                                                              "checkpoint-load")


def test_a_model_with_unused_parameters_is_not_bet_on_as_user_code():
    """DDP's unused-parameter error: the model may be the job's own or a library's as it ships; the line
    can not tell, so the answer is never high."""
    ff = first_failure_of("[rank3]: RuntimeError: Expected to have finished reduction in the prior iteration before "
                          "starting a new one. This error indicates that your module has parameters that were not used "
                          "in producing loss.\n[rank3]: Parameter indices which did not receive grad for rank 3: 12 13\n")
    assert (ff["category"], ff["confidence"]) == ("user-code", "medium")


def test_a_state_dict_of_other_shapes_is_not_bet_on_as_config():
    """torch's load_state_dict size mismatch: most often a model built with other sizes than the
    checkpoint's, but also a path to another model's checkpoint or a library's placeholders."""
    ff = first_failure_of("[rank1]: RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM:\n"
                          "[rank1]:        size mismatch for model.layers.4.self_attn.q_proj.weight: copying a param "
                          "with shape torch.Size([1024, 1024]) from checkpoint, the shape in current model is "
                          "torch.Size([4096, 4096]).\n")
    assert (ff["category"], ff["confidence"]) == ("config", "medium")
