"""nvml: the source against a fake pynvml (no GPU here), the fake against the real pynvml's
names, the real pynvml's answer on a machine without a driver, and (GPU machines) the
real library."""

from __future__ import annotations

import inspect
import os
import sys
import time

import pytest

from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.sources.nvml import Nvml, NvmlError, NvmlSource
from tests.agent.sources import fake_pynvml as fp
from tests.agent.sources.conftest import Sink

UUID0 = "GPU-8a47641b-dff6-f09f-618c-c3eb58fb430d"
UUID1 = "GPU-2c1f0b6e-5d3e-4e2a-9a41-7f5e6c1d9b20"
GIB = 2**30


@pytest.fixture
def fake(monkeypatch):
    gpus = [fp.FakeGpu(UUID0, "00000000:3B:00.0", used=3 * GIB, procs=[(4712, 2 * GIB)]),
            fp.FakeGpu(UUID1, "00000000:3C:00.0", used=5 * GIB, procs=[(4713, 4 * GIB), (4799, None)])]
    return fp.install(monkeypatch, fp.FakeNvml(gpus))


def heads(sink: Sink) -> list:
    return [d for d in sink.of("gpu.memory") if d.pid is None]


def test_xid_event_is_stamped_on_receipt_with_the_gpu_and_its_processes(fake, sink, running):
    with running(NvmlSource(interval_s=60), sink):
        sink.wait_for(lambda d: d.kind == "gpu.memory")  # registered and sampled
        before = time.time_ns()
        fake.push(1, fp.nvmlEventTypeXidCriticalError, 79)
        d = sink.wait_for(lambda d: d.kind == "gpu.xid")
        after = time.time_ns()
    assert d.source == "nvml" and d.severity == 3
    assert before <= d.occurred_ns == d.observed_ns <= after
    assert d.message == f"NVML: Xid 79 on GPU 1 (PCI:00000000:3C:00.0 {UUID1})"
    assert d.fields == {"gpu": 1, "uuid": UUID1, "pci_bus_id": "00000000:3C:00.0", "event_type": "xid",
                        "xid": 79, "pids": "4713,4799", "pids_from": "query"}
    assert d.pid is None  # two processes on that GPU: none is named
    assert fake.timeouts_ms and max(fake.timeouts_ms) <= 1000
    assert fake.inits == fake.shutdowns == 1 and fake.freed == [1]


def test_xid_names_the_one_process_and_the_mig_instance(fake, sink, running):
    with running(NvmlSource(interval_s=60), sink):
        sink.wait_for(lambda d: d.kind == "gpu.memory")
        fake.push(0, fp.nvmlEventTypeXidCriticalError, 13, gi=1, ci=2)
        d = sink.wait_for(lambda d: d.kind == "gpu.xid")
    assert d.pid == 4712 and d.fields["pids"] == "4712"
    assert d.fields["gpu_instance_id"] == 1 and d.fields["compute_instance_id"] == 2


def test_xid_takes_the_last_sampled_processes_when_the_gpu_is_gone(fake, sink, running):
    with running(NvmlSource(interval_s=60), sink):
        sink.wait_for(lambda d: d.kind == "gpu.memory")
        fake.fail("nvmlDeviceGetComputeRunningProcesses", fp.NVML_ERROR_GPU_IS_LOST)
        fake.push(0, fp.nvmlEventTypeXidCriticalError, 79)
        d = sink.wait_for(lambda d: d.kind == "gpu.xid")
    assert (d.pid, d.fields["pids"], d.fields["pids_from"]) == (4712, "4712", "sample")


def test_xid_from_a_device_nvml_cannot_name(fake, sink, running):
    with running(NvmlSource(interval_s=60), sink):
        sink.wait_for(lambda d: d.kind == "gpu.memory")
        fake.fail("nvmlDeviceGetIndex", fp.NVML_ERROR_GPU_IS_LOST)
        fake.fail("nvmlDeviceGetComputeRunningProcesses", fp.NVML_ERROR_GPU_IS_LOST)
        fake.push(1, fp.nvmlEventTypeXidCriticalError, 79)
        d = sink.wait_for(lambda d: d.kind == "gpu.xid")
    assert d.message == "NVML: Xid 79 on an unknown GPU" and d.pid is None
    assert d.fields == {"gpu": None, "uuid": None, "pci_bus_id": None, "event_type": "xid", "xid": 79,
                        "pids": "", "pids_from": "sample"}


def test_ecc_events(fake, sink, running):
    with running(NvmlSource(interval_s=60), sink):
        sink.wait_for(lambda d: d.kind == "gpu.memory")
        fake.push(0, fp.nvmlEventTypeDoubleBitEccError)
        fake.push(1, fp.nvmlEventTypeSingleBitEccError)
        sink.wait_for(lambda d: d.kind == "gpu.ecc" and d.fields["gpu"] == 1)
    double, single = sink.of("gpu.ecc")
    assert double.message == f"NVML: double bit ECC error on GPU 0 (PCI:00000000:3B:00.0 {UUID0})"
    assert (double.fields["event_type"], double.severity) == ("ecc_double_bit", 3)
    assert (single.fields["event_type"], single.severity) == ("ecc_single_bit", 4)
    assert "xid" not in double.fields and double.occurred_ns == double.observed_ns


def test_only_supported_event_types_are_registered(fake, sink, running):
    fake.gpus[0].supported = fp.nvmlEventTypeXidCriticalError | fp.nvmlEventTypePState  # ECC off
    with running(NvmlSource(interval_s=60), sink):
        sink.wait_for(lambda d: d.kind == "gpu.memory" and d.fields["gpu"] == 1)
        h0, h1 = heads(sink)[:2]
        fake.push(0, fp.nvmlEventTypeDoubleBitEccError)  # not registered: never delivered
        fake.push(0, fp.nvmlEventTypeXidCriticalError, 31)
        sink.wait_for(lambda d: d.kind == "gpu.xid")
    assert fake.sets[1] == {0: fp.nvmlEventTypeXidCriticalError, 1: fp.ALL_ERRORS}
    assert h0.fields["events"] == "xid" and h1.fields["events"] == "xid,ecc_double_bit,ecc_single_bit"
    assert sink.of("gpu.ecc") == []


def test_a_gpu_that_cannot_register_events_says_so_and_the_others_still_report(fake, sink, running):
    fake.fail("nvmlDeviceRegisterEvents", fp.NVML_ERROR_NOT_SUPPORTED)  # the first GPU's call
    with running(NvmlSource(interval_s=60), sink):
        sink.wait_for(lambda d: d.kind == "gpu.memory")
        fake.push(1, fp.nvmlEventTypeXidCriticalError, 48)
        sink.wait_for(lambda d: d.kind == "gpu.xid")
    h0 = heads(sink)[0]
    assert h0.fields["events_error"] == "nvmlDeviceRegisterEvents: Not Supported (NVML_ERROR_NOT_SUPPORTED)"
    assert "events" not in h0.fields and h0.fields["used_bytes"] == 3 * GIB
    assert [s.fields["state"] for s in sink.of("agent.status")] == ["running", "stopped"]


def test_no_event_set_means_samples_that_say_why(fake, sink, running):
    fake.fail("nvmlEventSetCreate", fp.NVML_ERROR_NOT_SUPPORTED)
    with running(NvmlSource(interval_s=60), sink):
        sink.wait_for(lambda d: d.kind == "gpu.memory" and d.fields["gpu"] == 1 and d.pid is None)
    assert {h.fields["events_error"] for h in heads(sink)} == {
        "nvmlEventSetCreate: Not Supported (NVML_ERROR_NOT_SUPPORTED)"}
    assert fake.timeouts_ms == [] and fake.freed == [] and fake.inits == fake.shutdowns == 1
    assert [s.fields["state"] for s in sink.of("agent.status")] == ["running", "stopped"]


def test_memory_per_gpu_and_per_process_every_interval(fake, sink, running):
    with running(NvmlSource(interval_s=0.05), sink):
        sink.wait_for(lambda d: d.kind == "gpu.memory" and d.pid == 4799)
        fake.gpus[0].procs.append((4800, GIB))
        sink.wait_for(lambda d: d.kind == "gpu.memory" and d.pid == 4800)
    h0, h1 = heads(sink)[:2]
    assert h0.fields == {"gpu": 0, "uuid": UUID0, "pci_bus_id": "00000000:3B:00.0", "events":
                         "xid,ecc_double_bit,ecc_single_bit", "used_bytes": 3 * GIB,
                         "total_bytes": 80 * GIB, "processes": 1}
    assert (h1.fields["used_bytes"], h1.fields["processes"]) == (5 * GIB, 2)
    procs = {(d.pid, d.fields["gpu"], d.fields["used_bytes"]) for d in sink.of("gpu.memory") if d.pid}
    assert procs == {(4712, 0, 2 * GIB), (4713, 1, 4 * GIB), (4799, 1, None), (4800, 0, GIB)}
    assert all(d.fields["uuid"] == (UUID0, UUID1)[d.fields["gpu"]] for d in sink.of("gpu.memory"))


def test_a_lost_gpu_fails_the_run_then_is_reported_as_lost(fake, sink, running):
    with running(NvmlSource(interval_s=60), sink, backoff_initial_s=0.05):
        sink.wait_for(lambda d: d.kind == "gpu.memory")
        fake.fail("nvmlDeviceGetHandleByIndex", fp.NVML_ERROR_GPU_IS_LOST)  # at the restart
        fake.fail("nvmlEventSetWait_v2", fp.NVML_ERROR_GPU_IS_LOST)
        failed = sink.wait_for(lambda d: d.fields.get("state") == "failed")
        lost = sink.wait_for(lambda d: d.kind == "gpu.memory" and "error" in d.fields)
        fake.push(1, fp.nvmlEventTypeXidCriticalError, 79)  # the other GPU still reports
        sink.wait_for(lambda d: d.kind == "gpu.xid")
    assert failed.fields["error"] == "NvmlError: nvmlEventSetWait_v2: GPU is lost (NVML_ERROR_GPU_IS_LOST)"
    assert lost.fields == {"gpu": 0, "uuid": None, "pci_bus_id": None,
                           "events_error": "nvmlDeviceGetHandleByIndex: GPU is lost (NVML_ERROR_GPU_IS_LOST)",
                           "error": "nvmlDeviceGetHandleByIndex: GPU is lost (NVML_ERROR_GPU_IS_LOST)"}
    assert lost.severity == 3 and lost.message.startswith("NVML: GPU 0 not read: ")
    assert fake.inits == fake.shutdowns == 2 and fake.freed == [1, 2]


def test_a_read_failing_on_one_gpu_marks_that_sample(fake, sink, running):
    fake.fail("nvmlDeviceGetMemoryInfo", fp.NVML_ERROR_UNKNOWN)
    with running(NvmlSource(interval_s=60), sink):
        sink.wait_for(lambda d: d.kind == "gpu.memory" and d.fields["gpu"] == 1 and d.pid is None)
    h0, h1 = heads(sink)
    assert h0.fields["error"] == "nvmlDeviceGetMemoryInfo: Unknown Error (NVML_ERROR_UNKNOWN)"
    assert "used_bytes" not in h0.fields and h1.fields["used_bytes"] == 5 * GIB


def test_events_off_samples_only(fake, sink, running):
    with running(NvmlSource(interval_s=60, events=False), sink):
        sink.wait_for(lambda d: d.kind == "gpu.memory")
    assert fake.sets == {} and fake.timeouts_ms == [] and fake.inits == fake.shutdowns == 1


def test_options_are_checked():
    with pytest.raises(ValueError, match="nvml: interval_s must be > 0, got 0"):
        NvmlSource(interval_s=0)


# --- unavailable() and the choke point ------------------------------------------------

def test_unavailable_without_nvidia_ml_py(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    why = NvmlSource.unavailable(HostPaths())
    assert why.startswith("nvidia-ml-py is not installed") and "firstfault[nvml]" in why


def test_unavailable_when_nvml_does_not_start_or_sees_no_gpu(fake):
    fake.fail("nvmlInit", fp.NVML_ERROR_DRIVER_NOT_LOADED)
    assert NvmlSource.unavailable(HostPaths()) == (
        "NVML does not start (nvmlInit: Driver Not Loaded (NVML_ERROR_DRIVER_NOT_LOADED)): "
        "no NVIDIA driver or GPU on this machine?")
    fake.gpus.clear()
    assert NvmlSource.unavailable(HostPaths()) == "NVML sees no GPU"
    assert fake.inits == fake.shutdowns == 1
    fake.gpus.append(fp.FakeGpu(UUID0, "00000000:3B:00.0"))
    assert NvmlSource.unavailable(HostPaths()) is None


def test_run_without_nvidia_ml_py_fails_with_the_hint(monkeypatch, sink, running):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with running(NvmlSource(), sink, backoff_initial_s=10):
        d = sink.wait_for(lambda d: d.fields.get("state") == "failed")
    assert d.fields["error"].startswith("NvmlMissing: module pynvml not found: pip install")


def test_choke_point_names_errors_and_missing_functions(fake):
    nvml = Nvml().open()
    try:
        fake.fail("nvmlDeviceGetUUID", fp.NVML_ERROR_NOT_SUPPORTED)
        with pytest.raises(NvmlError) as e:
            nvml.uuid(nvml.handle(0))
        assert (e.value.function, e.value.name, e.value.not_supported, e.value.gpu_lost) == (
            "nvmlDeviceGetUUID", "NVML_ERROR_NOT_SUPPORTED", True, False)
        del fake.module.nvmlDeviceGetIndex
        with pytest.raises(NvmlError, match=r"nvmlDeviceGetIndex: not in this nvidia-ml-py"):
            nvml.index(nvml.handle(0))
        assert nvml.wait(nvml.event_set(), 1) is None  # a timeout is no error
    finally:
        nvml.close()
    assert fake.inits == fake.shutdowns == 1


# --- the fake against the real nvidia-ml-py ---------------------------------------------

def test_the_fake_has_the_real_pynvml_names_values_and_parameters():
    real = pytest.importorskip("pynvml")
    fake = fp.FakeNvml([])
    for name, value in vars(fp).items():
        if name.startswith(("NVML_ERROR_", "nvmlEventType", "NVML_SUCCESS")):
            assert getattr(real, name) == value, name
    for code, text in fp.TEXTS.items():
        assert str(real.NVMLError(code)) == text
    for name, fn in fake.functions.items():
        assert list(inspect.signature(getattr(real, name)).parameters) == list(
            inspect.signature(fn).parameters), name
    fields = {f for f, _ in real.c_nvmlEventData_t._fields_}
    assert {"device", "eventType", "eventData", "gpuInstanceId", "computeInstanceId"} <= fields
    assert {f for f, _ in real.c_nvmlMemory_t._fields_} == {"total", "free", "used"}
    assert {"pid", "usedGpuMemory"} <= {f for f, _ in real.c_nvmlProcessInfo_t._fields_}
    assert "busId" in {f for f, _ in real.nvmlPciInfo_t._fields_}


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia"), reason="this machine has the NVIDIA driver")
def test_real_pynvml_without_a_driver_says_why():
    pytest.importorskip("pynvml")
    assert NvmlSource.unavailable(HostPaths()) == (
        "NVML does not start (nvmlInit: NVML Shared Library Not Found "
        "(NVML_ERROR_LIBRARY_NOT_FOUND)): no NVIDIA driver or GPU on this machine?")


@pytest.mark.gpu
def test_real_library_on_a_gpu_machine(sink, running):
    """init, count, register for the supported events, one wait with a timeout, shutdown."""
    pytest.importorskip("pynvml")
    assert NvmlSource.unavailable(HostPaths()) is None
    nvml = Nvml().open()
    try:
        n = nvml.device_count()
        assert n > 0
        es = nvml.event_set()
        try:
            h = nvml.handle(0)
            assert nvml.uuid(h).startswith(("GPU-", "MIG-")) and ":" in nvml.pci_bus_id(h)
            used, total = nvml.memory(h)
            assert 0 <= used <= total
            bits = nvml.supported_events(h) & nvml.const("nvmlEventTypeXidCriticalError")
            if bits:
                nvml.register(h, bits, es)
            ev = nvml.wait(es, 200)  # a timeout gives None; a real event may come
            assert ev is None or ev.type_bits & bits
        finally:
            nvml.free(es)
    finally:
        nvml.close()
    with running(NvmlSource(interval_s=60), sink):
        d = sink.wait_for(lambda d: d.kind == "gpu.memory" and d.pid is None)
    assert d.fields["total_bytes"] > 0 and d.fields["uuid"].startswith(("GPU-", "MIG-"))
