"""nvml: GPU facts from NVML (nvidia-ml-py): Xid and ECC events as they arrive, memory per process.

Every NVML call goes through ``Nvml``, the one choke point: it imports ``pynvml``
(nvidia-ml-py) when opened, owns ``nvmlInit``/``nvmlShutdown``, and turns every
``pynvml.NVMLError`` into an ``NvmlError`` that names the function and the NVML
error (``nvmlDeviceRegisterEvents: Not Supported (NVML_ERROR_NOT_SUPPORTED)``), so
Not Supported is told apart from GPU lost. Nothing else here touches pynvml.

Events: one NVML event set (``nvmlEventSetCreate``); every GPU is registered
(``nvmlDeviceRegisterEvents``) for the types it supports
(``nvmlDeviceGetSupportedEventTypes``) among ``nvmlEventTypeXidCriticalError``,
``nvmlEventTypeDoubleBitEccError`` and ``nvmlEventTypeSingleBitEccError`` (ECC
events only on GPUs with ECC on). ``nvmlEventSetWait_v2`` waits at most
``WAIT_MS`` so a stop is seen within a second. An event carries no time and no
pid (``nvmlEventData_t``: device, eventType, eventData = the Xid for Xid events,
gpuInstanceId / computeInstanceId under MIG, 0xFFFFFFFF when not attributable),
so it is stamped on receipt (occurred_ns = observed_ns) and the compute processes
on that GPU are read at once. Emits, with fields ``gpu`` (NVML index), ``uuid``,
``pci_bus_id`` (NVML's ``00000000:3B:00.0``), ``event_type``:

- ``gpu.xid``, severity err: message ``NVML: Xid 79 on GPU 1 (PCI:00000000:3B:00.0
  GPU-8a47641b-...)`` (``on an unknown GPU`` when NVML cannot name the device); fields ``xid``, ``pids`` (comma-separated compute processes
  on that GPU then; ``pids_from`` = ``query``, or ``sample`` when the query failed
  and the last sample's are given; Record.pid = that process when it is the only
  one), ``gpu_instance_id``/``compute_instance_id`` where attributable.
- ``gpu.ecc``: ``event_type`` ``ecc_double_bit`` (severity err) or
  ``ecc_single_bit`` (warning); message ``NVML: double bit ECC error on GPU 1 (...)``.

Samples every ``interval_s`` (``nvmlDeviceGetMemoryInfo``,
``nvmlDeviceGetComputeRunningProcesses``), as ``gpu.memory`` records:

- one per GPU, pid nil: ``used_bytes``, ``total_bytes``, ``processes``, and
  ``events`` (the event types registered, comma-separated) or ``events_error``
  (why none are: a GPU without events makes no Xid records, which is no proof
  that it had none);
- one per compute process, with ``pid``: ``used_bytes`` (nil where NVML cannot
  say). A GPU that fails a read gives ``error`` (severity err) instead of values.

``unavailable()`` says why the source cannot run: nvidia-ml-py missing, NVML
failing to start (no driver: ``NVML Shared Library Not Found``), no GPU.

Known issues: NVML reports pids in the host's pid namespace: in a container the
agent needs the host's (as for procs). A GPU that falls off the bus makes
``nvmlEventSetWait_v2`` fail with GPU lost: the run fails, the runner records it
and starts again, and the lost GPU then gives ``error`` samples.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from dataclasses import dataclass, field

from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.sources.base import Draft, Emit, Source, SourceError, clip, emit_many, register
from firstfault.wire import KIND_GPU_ECC, KIND_GPU_MEMORY, KIND_GPU_XID, SOURCE_NVML

log = logging.getLogger(__name__)

WAIT_MS = 500  # nvmlEventSetWait_v2 timeout: how soon a stop is seen
NOT_ATTRIBUTED = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event no instance owns
EVENT_TYPES = {  # pynvml constant -> event_type field
    "nvmlEventTypeXidCriticalError": "xid",
    "nvmlEventTypeDoubleBitEccError": "ecc_double_bit",
    "nvmlEventTypeSingleBitEccError": "ecc_single_bit",
}
INSTALL_HINT = "pip install 'firstfault[nvml]' (nvidia-ml-py)"


class NvmlError(SourceError):
    """An NVML call failed; ``name`` is the NVML error (``NVML_ERROR_GPU_IS_LOST``)."""

    def __init__(self, function: str, name: str, text: str) -> None:
        super().__init__(f"{function}: {text} ({name})")
        self.function, self.name, self.text = function, name, text

    @property
    def not_supported(self) -> bool:
        return self.name == "NVML_ERROR_NOT_SUPPORTED"

    @property
    def gpu_lost(self) -> bool:
        return self.name == "NVML_ERROR_GPU_IS_LOST"


class NvmlMissing(SourceError):
    """nvidia-ml-py (module ``pynvml``) is not installed."""


@dataclass(frozen=True, slots=True)
class Event:
    """One delivered NVML event."""

    device: object
    type_bits: int
    data: int
    gpu_instance_id: int
    compute_instance_id: int


def _str(v) -> str:
    return v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)


class Nvml:
    """The one place that calls pynvml: init/shutdown, calls, errors translated."""

    def __init__(self) -> None:
        self.lib = None
        self._names: dict[int, str] = {}

    def open(self) -> Nvml:
        try:
            lib = importlib.import_module("pynvml")
        except ImportError as e:
            raise NvmlMissing(f"module pynvml not found: {INSTALL_HINT}") from e
        self.lib = lib
        self._names = {getattr(lib, n): n for n in dir(lib) if n.startswith("NVML_ERROR_")}
        try:
            self.call("nvmlInit")
        except BaseException:
            self.lib = None
            raise
        return self

    def close(self) -> None:
        if self.lib is not None:
            try:
                self.call("nvmlShutdown")
            finally:
                self.lib = None

    def call(self, function: str, *args):
        """``pynvml.<function>(*args)``; NvmlError on an NVML error or a missing function."""
        if self.lib is None:
            raise SourceError(f"{function}: NVML is not open")
        fn = getattr(self.lib, function, None)
        if fn is None:
            raise NvmlError(function, "missing", "not in this nvidia-ml-py (too old?)")
        try:
            return fn(*args)
        except self.lib.NVMLError as e:
            value = getattr(e, "value", None)
            raise NvmlError(function, self._names.get(value, f"NVML error {value}"), str(e)) from None

    def const(self, name: str) -> int:
        return getattr(self.lib, name)

    # --- the calls this source makes, results as plain values -------------------------

    def device_count(self) -> int:
        return self.call("nvmlDeviceGetCount")

    def handle(self, index: int):
        return self.call("nvmlDeviceGetHandleByIndex", index)

    def index(self, handle) -> int:
        return self.call("nvmlDeviceGetIndex", handle)

    def uuid(self, handle) -> str:
        return _str(self.call("nvmlDeviceGetUUID", handle))

    def pci_bus_id(self, handle) -> str:
        return _str(self.call("nvmlDeviceGetPciInfo", handle).busId)

    def memory(self, handle) -> tuple[int, int]:
        """(used, total) bytes of the GPU's memory."""
        m = self.call("nvmlDeviceGetMemoryInfo", handle)
        return m.used, m.total

    def processes(self, handle) -> list[tuple[int, int | None]]:
        """(pid, used bytes or None) of every compute process on the GPU."""
        return [(p.pid, p.usedGpuMemory) for p in self.call("nvmlDeviceGetComputeRunningProcesses", handle)]

    def supported_events(self, handle) -> int:
        return self.call("nvmlDeviceGetSupportedEventTypes", handle)

    def event_set(self):
        return self.call("nvmlEventSetCreate")

    def register(self, handle, type_bits: int, event_set) -> None:
        self.call("nvmlDeviceRegisterEvents", handle, type_bits, event_set)

    def wait(self, event_set, timeout_ms: int) -> Event | None:
        """The next event, or None when none came within ``timeout_ms``."""
        try:
            d = self.call("nvmlEventSetWait_v2", event_set, timeout_ms)
        except NvmlError as e:
            if e.name == "NVML_ERROR_TIMEOUT":
                return None
            raise
        return Event(d.device, d.eventType, d.eventData, d.gpuInstanceId, d.computeInstanceId)

    def free(self, event_set) -> None:
        self.call("nvmlEventSetFree", event_set)


@dataclass(slots=True)
class Gpu:
    """One GPU as this run knows it."""

    index: int | None  # None: an event's device whose index NVML could not say
    handle: object
    uuid: str | None = None
    pci_bus_id: str | None = None
    events: list[str] = field(default_factory=list)  # event_type names registered
    events_error: str | None = None
    pids: list[int] = field(default_factory=list)  # compute processes at the last sample
    error: str | None = None  # why it has no handle

    def ids(self) -> dict:
        return {"gpu": self.index, "uuid": self.uuid, "pci_bus_id": self.pci_bus_id}

    def label(self) -> str:
        if self.index is None:
            return "an unknown GPU"
        where = " ".join(x for x in (self.pci_bus_id and f"PCI:{self.pci_bus_id}", self.uuid) if x)
        return f"GPU {self.index}" + (f" ({where})" if where else "")


@register
class NvmlSource(Source):
    """GPU Xid/ECC events and memory samples through NVML; see the module docstring."""

    name = SOURCE_NVML

    def __init__(self, *, interval_s: float = 10.0, events: bool = True, **kw) -> None:
        super().__init__(**kw)
        if not interval_s > 0:
            raise ValueError(f"{self.name}: interval_s must be > 0, got {interval_s}")
        self.interval_s, self.events = float(interval_s), bool(events)

    @classmethod
    def unavailable(cls, paths: HostPaths) -> str | None:
        nvml = Nvml()
        try:
            nvml.open()
        except NvmlMissing as e:
            return f"nvidia-ml-py is not installed ({e})"
        except NvmlError as e:
            return f"NVML does not start ({e}): no NVIDIA driver or GPU on this machine?"
        try:
            return None if nvml.device_count() > 0 else "NVML sees no GPU"
        except NvmlError as e:
            return f"NVML cannot count the GPUs ({e})"
        finally:
            nvml.close()

    def run(self, emit: Emit, stop: threading.Event) -> None:
        nvml = Nvml().open()
        event_set = None
        try:
            gpus = self.gpus(nvml)
            if self.events and gpus:
                try:
                    event_set = nvml.event_set()
                except NvmlError as e:  # no events on this platform: samples only
                    log.warning("nvml no event set error=%s", e)
                    for g in gpus:
                        g.events_error = g.events_error or str(e)
                for g in gpus if event_set is not None else ():
                    self.register(nvml, g, event_set)
            many = emit_many(emit)
            next_sample = time.monotonic()
            while not stop.is_set():
                if time.monotonic() >= next_sample:
                    many(self.sample(nvml, gpus))
                    next_sample = time.monotonic() + self.interval_s
                timeout_ms = max(1, min(WAIT_MS, int((next_sample - time.monotonic()) * 1000)))
                if event_set is None or not any(g.events for g in gpus):
                    stop.wait(timeout_ms / 1000)
                    continue
                ev = nvml.wait(event_set, timeout_ms)
                if ev is not None:
                    emit(self.event_draft(nvml, gpus, ev, time.time_ns()))
        finally:
            try:
                if event_set is not None:
                    nvml.free(event_set)
            finally:
                nvml.close()

    def gpus(self, nvml: Nvml) -> list[Gpu]:
        """Every GPU NVML sees, with its UUID and PCI bus id where they can be read."""
        return [self._gpu(nvml, i) for i in range(nvml.device_count())]

    def _gpu(self, nvml: Nvml, index: int) -> Gpu:
        try:
            g = Gpu(index, nvml.handle(index))
        except NvmlError as e:
            log.warning("nvml gpu=%d no handle error=%s", index, e)
            return Gpu(index, None, error=str(e), events_error=str(e))
        for attr, read in (("uuid", nvml.uuid), ("pci_bus_id", nvml.pci_bus_id)):
            try:
                setattr(g, attr, read(g.handle))
            except NvmlError as e:
                log.warning("nvml gpu=%d %s unknown error=%s", index, attr, e)
        return g

    def register(self, nvml: Nvml, g: Gpu, event_set) -> None:
        """Register ``g`` in ``event_set`` for the Xid and ECC events it supports; why not in g.events_error."""
        if g.handle is None:
            return
        try:
            supported = nvml.supported_events(g.handle)
            wanted = {name: nvml.const(c) for c, name in EVENT_TYPES.items()}
            bits = sum(b for b in wanted.values() if supported & b)
            if not bits:
                g.events_error = "supports none of the Xid and ECC events"
                return
            nvml.register(g.handle, bits, event_set)
            g.events = [name for name, b in wanted.items() if bits & b]
        except NvmlError as e:
            g.events_error = str(e)
            log.warning("nvml gpu=%d events not registered error=%s", g.index, e)

    def sample(self, nvml: Nvml, gpus: list[Gpu]) -> list[Draft]:
        """gpu.memory drafts: one per GPU, one per compute process on it."""
        now, out = time.time_ns(), []
        for g in gpus:
            head = self.draft(KIND_GPU_MEMORY, observed_ns=now, fields=g.ids())
            out.append(head)
            if g.events:
                head.fields["events"] = ",".join(g.events)
            elif g.events_error:
                head.fields["events_error"] = clip(g.events_error)
            try:
                if g.handle is None:
                    raise SourceError(g.error)
                used, total = nvml.memory(g.handle)
                procs = nvml.processes(g.handle)
            except SourceError as e:  # NvmlError included
                head.fields["error"], head.severity = clip(str(e)), 3
                head.message = f"NVML: {g.label()} not read: {e}"
                continue
            g.pids = [pid for pid, _ in procs]
            head.fields.update(used_bytes=used, total_bytes=total, processes=len(procs))
            out += [self.draft(KIND_GPU_MEMORY, observed_ns=now, pid=pid,
                               fields={**g.ids(), "used_bytes": mem}) for pid, mem in procs]
        return out

    def event_draft(self, nvml: Nvml, gpus: list[Gpu], ev: Event, received_ns: int) -> Draft:
        """The gpu.xid / gpu.ecc draft of one event, received at ``received_ns``."""
        try:
            index = nvml.index(ev.device)
            g = next((x for x in gpus if x.index == index), None) or self._gpu(nvml, index)
        except NvmlError as e:
            log.warning("nvml event from an unknown GPU error=%s", e)
            g = Gpu(None, ev.device)
        kinds = [name for c, name in EVENT_TYPES.items() if ev.type_bits & nvml.const(c)]
        etype = kinds[0] if kinds else f"0x{ev.type_bits:x}"
        fields = {**g.ids(), "event_type": etype}
        for key, v in (("gpu_instance_id", ev.gpu_instance_id), ("compute_instance_id", ev.compute_instance_id)):
            if v != NOT_ATTRIBUTED:
                fields[key] = v
        stamp = {"occurred_ns": received_ns, "observed_ns": received_ns}
        if etype != "xid":
            words = {"ecc_double_bit": "double bit ECC error", "ecc_single_bit": "single bit ECC error"}
            return self.draft(KIND_GPU_ECC, f"NVML: {words.get(etype, 'event ' + etype)} on {g.label()}",
                              severity=3 if etype != "ecc_single_bit" else 4, fields=fields, **stamp)
        try:
            pids, fields["pids_from"] = [pid for pid, _ in nvml.processes(ev.device)], "query"
        except NvmlError:
            pids, fields["pids_from"] = g.pids, "sample"
        fields.update(xid=ev.data, pids=",".join(map(str, pids)))
        return self.draft(KIND_GPU_XID, f"NVML: Xid {ev.data} on {g.label()}", severity=3,
                          pid=pids[0] if len(pids) == 1 else None, fields=fields, **stamp)
