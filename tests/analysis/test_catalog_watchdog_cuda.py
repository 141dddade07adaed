"""A CUDA error carried by the NCCL watchdog's wrapper keeps the rank the wrapper names.

ProcessGroupNCCL's watchdog rethrows the CUDA error it met while polling a collective, behind
its own prefix: ``"[Rank " << rank_ << "] NCCL watchdog thread terminated with exception: "``
(PyTorch 1.13-2.1) and ``logPrefix() << "Process group watchdog thread terminated with
exception: "`` (2.2+, logPrefix ``"[PG <id> Rank <r>] "``, from 2.4 ``"[PG ID <id> PG GUID
<guid>(<desc>) Rank <r>] "``). The error text is c10_cuda_check_implementation's
``"CUDA error: " + cudaGetErrorString(err)``. The same process's Python traceback, printed
without any rank prefix, says the same error; only the wrapper says whose it was.

A subgroup's logPrefix carries the rank inside that group, which is not the global rank: those
lines keep the signature and name no rank. The 1.13-2.1 wrapper says no group at all: its rank is
kept as ``pg_rank`` (the rank in the group that printed it), which the analysis uses as the rank
but never at confidence high.

Every line below is written from those format strings with made-up values.
"""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import load_catalog
from tests.analysis.catalog_lines import assert_line
from tests.offline.scoring import first_failure_of

CATALOG = load_catalog()

LINES = [
    ("[E ProcessGroupNCCL.cpp:1003] [Rank 1] NCCL watchdog thread terminated with exception: "
     "CUDA error: uncorrectable ECC error encountered", "cuda.ecc_uncorrectable", "root", "hardware", {"pg_rank": "1"}),
    ("[E1203 08:00:01.123456789 ProcessGroupNCCL.cpp:1412] [PG 0 Rank 6] Process group watchdog thread terminated "
     "with exception: CUDA error: unspecified launch failure", "cuda.launch_failure", "root", "unknown",
     {"rank": "6"}),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 12] Process group watchdog thread terminated with exception: "
     "CUDA error: an illegal memory access was encountered", "cuda.illegal_memory_access", "root", "framework",
     {"rank": "12", "error": "an illegal memory access was encountered"}),
    ("[Rank 4] NCCL watchdog thread terminated with exception: CUDA error: uncorrectable NVLink error was "
     "detected during the execution", "cuda.nvlink_uncorrectable", "root", "hardware", {"pg_rank": "4"}),
    ("[Rank 5] NCCL watchdog thread terminated with exception: CUDA error: unknown error",
     "cuda.unknown_error", "root", "hardware", {"pg_rank": "5"}),
    ("[PG 0 Rank 3] Process group watchdog thread terminated with exception: CUDA error: misaligned address",
     "cuda.misaligned_address", "root", "framework", {"rank": "3", "error": "misaligned address"}),
    ("[Rank 7] NCCL watchdog thread terminated with exception: CUDA error: operation not supported",
     "cuda.error", "root", "unknown", {"pg_rank": "7", "error": "operation not supported"}),
]


@pytest.mark.parametrize("text,sig,role,category,facts", LINES, ids=[x[1] for x in LINES])
def test_the_wrapper_names_the_rank(text, sig, role, category, facts):
    assert_line(CATALOG, text, sig, role, category, facts)


# (line, the signature it still is) -- and no rank comes from it
NO_RANK = [
    # a subgroup's rank (PG 3, PG ID 10) is not the job's rank
    ("[PG 3 Rank 5] Process group watchdog thread terminated with exception: "
     "CUDA error: uncorrectable ECC error encountered", "cuda.ecc_uncorrectable"),
    ("[PG ID 10 PG GUID 12(TENSOR_MODEL_PARALLEL_GROUP) Rank 1] Process group watchdog thread terminated with "
     "exception: CUDA error: an illegal memory access was encountered", "cuda.illegal_memory_access"),
    # the traceback's own line names nobody
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "cuda.ecc_uncorrectable"),
    # a device number in the message is not a rank
    ("RuntimeError: CUDA error: unspecified launch failure on device 3", "cuda.launch_failure"),
]


@pytest.mark.parametrize("text,sig", NO_RANK)
def test_no_rank_where_none_is_the_jobs(text, sig):
    m = CATALOG.match(text)
    assert m is not None and m.signature.id == sig
    assert m.groups.get("rank") is None and m.groups.get("pg_rank") is None, m.groups


# A rank's traceback (no prefix) and then its watchdog's wrapper of the same error.
PASTE = """\
  File "/srv/app/model.py", line 88, in embed
    scale = scale / (half - shift)
RuntimeError: CUDA error: uncorrectable ECC error encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1.

[E ProcessGroupNCCL.cpp:1003] [Rank 3] NCCL watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:44 (most recent call first):
"""


def test_the_paste_names_the_rank_its_watchdog_named_but_not_at_high():
    ff = first_failure_of(PASTE)
    assert (ff["rank"], ff["signature"], ff["category"]) == (3, "cuda.ecc_uncorrectable", "hardware")
    assert ff["confidence"] == "medium"  # 2.1's "[Rank r]" may be a subgroup's rank


def test_the_default_groups_wrapper_names_the_jobs_rank():
    text = PASTE.replace("[Rank 3] NCCL watchdog", "[PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog")
    ff = first_failure_of(text)
    assert (ff["rank"], ff["signature"], ff["category"]) == (3, "cuda.ecc_uncorrectable", "hardware")
    assert ff["confidence"] == "high"


def test_a_subgroup_watchdog_names_no_rank():
    text = PASTE.replace("[Rank 3] NCCL watchdog", "[PG 2 Rank 3] Process group watchdog")
    ff = first_failure_of(text)
    assert (ff["rank"], ff["signature"]) == (None, "cuda.ecc_uncorrectable")
