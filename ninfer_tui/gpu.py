"""GPU readings for the console's memory panel from NVML (`pynvml`, the nvidia-ml-py package).

Per device: utilization, memory used/total, power draw and limit, SM and memory clocks and
temperature, as NVML reports them. Where NVML is missing or finds no device (a CPU-only
machine, no driver) `GpuMonitor.read()` returns nothing and the panel shows no GPU rows: no
figure is ever made up. A query a device does not support leaves that one figure None.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

READ_EVERY_S = 1.0  # NVML's own counters move about once a second


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    util_pct: int | None = None
    mem_used: int | None = None  # bytes
    mem_total: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    temp_c: int | None = None


def _load_nvml() -> Any:
    import pynvml  # the import alone never fails on a machine without a driver

    return pynvml


class GpuMonitor:
    """Opens NVML once; `read()` gives the devices' readings, at most once per `every_s`."""

    def __init__(self, nvml: Any | None = None, every_s: float = READ_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s, self._clock = every_s, clock
        self._last: tuple[GpuReading, ...] = ()
        self._read_at: float | None = None
        self._handles: list[Any] = []
        try:
            self._nvml = nvml or _load_nvml()
            self._nvml.nvmlInit()
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception:  # no library, no driver, no device: no GPU rows
            self._nvml, self._handles = None, []

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def read(self) -> tuple[GpuReading, ...]:
        if not self._handles:
            return ()
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._every_s:
            self._last = tuple(self._reading(i, h) for i, h in enumerate(self._handles))
            self._read_at = now
        return self._last

    def _reading(self, index: int, handle: Any) -> GpuReading:
        nvml = self._nvml

        def ask(query: Callable[[], Any]) -> Any:
            try:
                return query()
            except Exception:  # NVMLError_NotSupported and the like: that figure is unknown
                return None

        name = ask(lambda: nvml.nvmlDeviceGetName(handle))
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        util = ask(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        memory = ask(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        power = ask(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        limit = ask(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        return GpuReading(
            index=index, name=name or f"GPU {index}", util_pct=util,
            mem_used=None if memory is None else memory.used,
            mem_total=None if memory is None else memory.total,
            power_w=None if power is None else power / 1000.0,
            power_limit_w=None if limit is None else limit / 1000.0,
            sm_clock_mhz=ask(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            mem_clock_mhz=ask(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
            temp_c=ask(lambda: nvml.nvmlDeviceGetTemperature(handle,
                                                             nvml.NVML_TEMPERATURE_GPU)),
        )

    def close(self) -> None:
        if self._nvml is not None and self._handles:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
        self._handles = []
