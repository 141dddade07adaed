"""Offload targets and their pin_memory from DeepSpeed's printed zero_config.

DeepSpeedConfig.print writes ``zero_config`` as the pydantic model's str: ``key=value``
pairs, a set offload section as its class repr (deepspeed/runtime/zero/offload_config.py),
an unset one as ``None``. The lines below follow that format with values of our own.
"""

from firstfault.analysis.context import Context

PREFIX = "[2026-12-03 06:23:20,101] [INFO] [config.py:678:print]   zero_config .................. "
PARAM = ("DeepSpeedZeroOffloadParamConfig(device='nvme', nvme_path=PosixPath('/local_nvme'), buffer_count=5, "
         "buffer_size=100000000, max_in_cpu=1000000000, pin_memory=True)")
OPTIM = ("DeepSpeedZeroOffloadOptimizerConfig(device='cpu', nvme_path=None, buffer_count=4, pin_memory=False, "
         "pipeline_read=False, pipeline_write=False, fast_init=False, ratio=1.0)")


def context_of(zero_config: str) -> dict:
    ctx = Context()
    ctx.feed(PREFIX + zero_config)
    return ctx.to_report()


def test_both_offload_sections_with_their_pin_memory():
    rep = context_of(f"stage=3 contiguous_gradients=True offload_param={PARAM} offload_optimizer={OPTIM} "
                     "sub_group_size=1000000000")
    assert (rep["zero_stage"], rep["offload_param"], rep["offload_param_pin_memory"]) == (3, "nvme", True)
    assert (rep["offload_optimizer"], rep["offload_optimizer_pin_memory"]) == ("cpu", False)


def test_an_unset_section_does_not_borrow_the_next_ones_device():
    rep = context_of(f"stage=2 offload_param=None offload_optimizer={OPTIM} zenflow=None")
    assert (rep["offload_param"], rep["offload_param_pin_memory"]) == (None, None)
    assert rep["offload_optimizer"] == "cpu"


def test_no_offload():
    rep = context_of("stage=2 reduce_bucket_size=500000 offload_param=None offload_optimizer=None zenflow=None")
    assert [rep[k] for k in ("offload_param", "offload_optimizer", "offload_param_pin_memory",
                             "offload_optimizer_pin_memory")] == [None] * 4


def test_a_line_only_zero_3_prints_says_the_job_shards_its_parameters():
    for line in ("[2026-12-03 06:23:21,004] [INFO] [utils.py:781:see_memory_usage] DeepSpeedZeRoOffload initialize [begin]",
                 "Parameter Offload: Total persistent parameters: 538624 in 314 params",
                 "[2026-12-03 06:23:22,510] [INFO] [parameter_offload.py:277:_setup_for_real_optimizer] "
                 "Parameter Offload - Persistent parameters statistics: param_count = 314, numel = 538624"):
        ctx = Context()
        ctx.feed(line)
        assert ctx.sharded_by == line.strip()[:160]  # the line, as the report may quote it
        assert "zero_stage" not in ctx.config  # the resolved config was not seen: the report still asks for it
    for line in ("[2026-12-03 06:23:20,101] [INFO] [config.py:678:print]   zero_allow_untested_optimizer  False",
                 "Creating ZeRO Offload", "offload_param=None"):
        ctx = Context()
        ctx.feed(line)
        assert ctx.sharded_by is None


def test_under_zero_3_a_watchdog_s_all_gather_is_the_parameter_gather():
    from tests.offline.scoring import Case, analyze
    watchdog = ("[rank1]:[E206 16:45:19.236012277 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=5919, OpType=_ALLGATHER_BASE, NumelIn=4096, NumelOut=16384, "
                "Timeout(ms)=1800000) ran for 1800085 milliseconds before timing out.\n")
    zero3 = "Parameter Offload: Total persistent parameters: 538624 in 314 params\n"
    with_zero3 = analyze(Case("paste", ["-"], {}, stdin=(zero3 + watchdog).encode()))["first_failure"]
    alone = analyze(Case("paste", ["-"], {}, stdin=watchdog.encode()))["first_failure"]
    assert with_zero3["phase"] == "param-gather"
    assert alone["phase"] != "param-gather"  # ZeRO-1/2 and accelerate's gather also all-gather into a tensor
