"""phase.phase_from_worker_call: verl's driver calls a worker group method through the proxy of
verl/single_controller/ray/base.py func_generator (``func`` in 0.1-0.2, ``Functor.__call__`` in
0.3+); the source line above the proxy's frame names the method, the [[task]] rules its phase.
Tracebacks written from those shapes, with made-up paths and values."""

from __future__ import annotations

import pytest

from firstfault.analysis.phase import phase_from_worker_call, phase_hint
from tests.offline.scoring import first_failure_of

FRAME = '  File "/opt/verl/verl/single_controller/ray/base.py", line {line}, in {func}\n'


def _tb(call: str, func: str = "__call__", carets: bool = False) -> str:
    return ("Traceback (most recent call last):\n"
            '  File "/opt/verl/verl/trainer/ppo/ray_trainer.py", line 812, in fit\n'
            f"    {call}\n"
            + ("    " + "^" * len(call) + "\n" if carets else "")
            + FRAME.format(line=52 if func == "__call__" else 42, func=func)
            + "    output = ray.get(output)\n"
            "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n")


@pytest.mark.parametrize("call, func, carets, want", [
    ("ref_log_prob = self.ref_policy_wg.compute_ref_log_prob(batch)", "func", False, "forward"),
    ("gen_batch_output = self.actor_rollout_wg.generate_sequences(gen_batch)", "__call__", True, "forward"),
    ("self.actor_rollout_wg.save_checkpoint(local_path, hdfs_path, self.global_steps)", "__call__", False,
     "checkpoint-save"),
    ("self.actor_rollout_wg.init_model()", "func", False, "init"),
])
def test_the_method_the_driver_called(call, func, carets, want):
    assert phase_from_worker_call(_tb(call, func, carets)) == want


@pytest.mark.parametrize("text", [
    _tb("actor_output = self.actor_rollout_wg.update_actor(batch)"),  # no [[task]] rule names it
    _tb("out = self.compute_ref_log_prob(batch)").replace("single_controller/ray/base.py", "my_pkg/base.py"),
    "    ref_log_prob = self.ref_policy_wg.compute_ref_log_prob(batch)\n",  # a source line, no proxy frame under it
])
def test_nothing_without_the_proxy_frame_or_a_known_method(text):
    assert phase_from_worker_call(text) is None


def test_a_named_ray_task_comes_first():
    text = "ray.exceptions.RayTaskError(OSError): ray::WorkerDict.actor_rollout_save_checkpoint() (pid=1, ip=10.0.0.2)\n"
    assert phase_hint(text + _tb("self.ref_policy_wg.compute_ref_log_prob(batch)")) == (
        "checkpoint-save", "the Ray task that failed")


def test_a_pasted_actor_death_in_the_reference_forward():
    text = ("ray.exceptions.RayTaskError(ActorDiedError): ray::main_task() (pid=5012, ip=10.0.0.7)\n"
            + _tb("ref_log_prob = self.ref_policy_wg.compute_ref_log_prob(batch)").split("\n", 1)[1])
    ff = first_failure_of(text)
    assert ff["phase"] == "forward"
    assert ff["phase_from"] == "the worker group method the driver called"


@pytest.mark.parametrize("line, phase", [
    # verl's trainer calling a method its worker group class no longer has (a refactor between releases)
    ("AttributeError: 'NVMegatronRayWorkerGroup' object has no attribute 'compute_log_prob'", "forward"),
    ("[rank0]: AttributeError: 'FSDPCheckpointManager' object has no attribute 'save_checkpoint'", "checkpoint-save"),
    # not examples: a method the task rules do not know, a module's missing attribute, no AttributeError
    ("AttributeError: 'RayWorkerGroup' object has no attribute 'update_actor'", None),
    ("AttributeError: module 'verl' has no attribute 'compute_log_prob'", None),
    ("KeyError: 'compute_log_prob'", None),
])
def test_the_method_an_attribute_error_says_its_object_lacks(line, phase):
    hint = phase_hint(line)
    assert (hint[0] if hint else None) == phase
