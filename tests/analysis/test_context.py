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
