"""A fake ``pynvml`` module for machines without a GPU: the names, values and call shapes of
nvidia-ml-py 13 (pynvml.py), backed by a scripted set of GPUs.

Only what firstfault/agent/sources/nvml.py calls is here; test_nvml.py checks every name, value and
parameter list against the real pynvml when it is installed. ``install(monkeypatch, fake)``
puts it in ``sys.modules`` as ``pynvml``. Tests drive it: ``fake.push(index, type_bits, data)``
delivers an event (only if that GPU registered that type, as NVML does), ``fake.fail(name,
code)`` makes a function raise ``NVMLError(code)`` (once, or always).
"""

from __future__ import annotations

import queue
import sys
import threading
import types
from dataclasses import dataclass, field

# pynvml.py: the NVML_ERROR_* values and NVMLError._errcode_to_string texts used here
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
TEXTS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}
nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypePState = 0x0000000000000004
nvmlEventTypeXidCriticalError = 0x0000000000000008
ALL_ERRORS = nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError
NOT_ATTRIBUTED = 0xFFFFFFFF


class NVMLError(Exception):
    """As pynvml.NVMLError: ``value`` is the NVML return code, str() its text."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return TEXTS.get(self.value, f"NVML Error with code {self.value}")


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str  # nvmlPciInfo_t.busId as nvidia-ml-py 12+ returns it (str)
    total: int = 80 * 2**30
    used: int = 0
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    supported: int = ALL_ERRORS | nvmlEventTypePState


@dataclass(frozen=True)
class Handle:
    index: int


class FakeNvml:
    """The state behind the fake module: GPUs, registrations, queued events, calls seen."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.events: queue.Queue = queue.Queue()
        self.failures: dict[str, list[tuple[int, bool]]] = {}
        self.lock = threading.Lock()
        self.inits = self.shutdowns = 0
        self.sets: dict[int, dict[int, int]] = {}  # event set id -> {gpu index: type bits}
        self.freed: list[int] = []
        self.timeouts_ms: list[int] = []
        self.functions: dict[str, object] = {}  # name -> the fake's function (for signature checks)
        self.module = self._module()

    # --- what tests call ------------------------------------------------------------

    def push(self, index: int, type_bits: int, data: int = 0, gi: int = NOT_ATTRIBUTED,
             ci: int = NOT_ATTRIBUTED) -> None:
        self.events.put((index, type_bits, data, gi, ci))

    def fail(self, function: str, code: int, always: bool = False) -> None:
        with self.lock:
            self.failures.setdefault(function, []).append((code, always))

    # --- the module -----------------------------------------------------------------

    def _check(self, function: str) -> None:
        with self.lock:
            pending = self.failures.get(function)
            if pending:
                code, always = pending[0]
                if not always:
                    pending.pop(0)
                raise NVMLError(code)

    def _gpu(self, handle: Handle) -> FakeGpu:
        return self.gpus[handle.index]

    def _module(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvmlEventType")) or name == "NVMLError":
                setattr(m, name, value)
        fake = self

        def checked(fn):
            def call(*args):
                fake._check(fn.__name__)
                return fn(*args)
            call.__name__ = fn.__name__
            setattr(m, fn.__name__, call)
            fake.functions[fn.__name__] = fn
            return fn

        @checked
        def nvmlInit():
            fake.inits += 1

        @checked
        def nvmlShutdown():
            fake.shutdowns += 1

        @checked
        def nvmlDeviceGetCount():
            return len(fake.gpus)

        @checked
        def nvmlDeviceGetHandleByIndex(index):
            return Handle(index)

        @checked
        def nvmlDeviceGetIndex(handle):
            return handle.index

        @checked
        def nvmlDeviceGetUUID(handle):
            return fake._gpu(handle).uuid

        @checked
        def nvmlDeviceGetPciInfo(handle):
            return types.SimpleNamespace(busId=fake._gpu(handle).bus_id)

        @checked
        def nvmlDeviceGetMemoryInfo(handle, version=None):
            g = fake._gpu(handle)
            return types.SimpleNamespace(total=g.total, free=g.total - g.used, used=g.used)

        @checked
        def nvmlDeviceGetComputeRunningProcesses(handle):
            return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=NOT_ATTRIBUTED,
                                          computeInstanceId=NOT_ATTRIBUTED)
                    for pid, mem in fake._gpu(handle).procs]

        @checked
        def nvmlDeviceGetSupportedEventTypes(handle):
            return fake._gpu(handle).supported

        @checked
        def nvmlEventSetCreate():
            with fake.lock:
                es = len(fake.sets) + 1
                fake.sets[es] = {}
            return es

        @checked
        def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):
            if eventTypes & ~fake._gpu(handle).supported:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            fake.sets[eventSet][handle.index] = fake.sets[eventSet].get(handle.index, 0) | eventTypes

        @checked
        def nvmlEventSetWait_v2(eventSet, timeoutms):
            fake.timeouts_ms.append(timeoutms)
            try:
                index, bits, data, gi, ci = fake.events.get(timeout=timeoutms / 1000)
            except queue.Empty:
                raise NVMLError(NVML_ERROR_TIMEOUT) from None
            if not bits & fake.sets[eventSet].get(index, 0):
                raise NVMLError(NVML_ERROR_TIMEOUT)  # not registered: NVML never delivers it
            return types.SimpleNamespace(device=Handle(index), eventType=bits, eventData=data,
                                         gpuInstanceId=gi, computeInstanceId=ci)

        @checked
        def nvmlEventSetFree(eventSet):
            fake.freed.append(eventSet)

        return m


def install(monkeypatch, fake: FakeNvml) -> FakeNvml:
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return fake
