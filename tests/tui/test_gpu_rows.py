"""GPU rows in the memory panel from NVML (issue 24): figures as NVML reports them, "?" for a
query the device does not support, nothing at all where NVML finds no device."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from ninfer_tui.app import NinferConsole
from ninfer_tui.fake_feed import FakeSupervisor, play_all
from ninfer_tui.gpu import GpuMonitor, GpuReading
from ninfer_tui.widgets.memory import MemoryPanel

GIB = 1 << 30


class NotSupported(Exception):
    pass


class FakeNvml:
    """Two devices; the second answers no power query. Counts the utilization reads."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.reads = 0
        self.shut = False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NotSupported("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return f"NVIDIA Fake {h}".encode()

    def nvmlDeviceGetUtilizationRates(self, h: int):
        self.reads += 1
        return SimpleNamespace(gpu=37 + h)

    def nvmlDeviceGetMemoryInfo(self, h: int):
        return SimpleNamespace(used=(20 + h) * GIB, total=80 * GIB)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h:
            raise NotSupported(h)
        return 351_250

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        if h:
            raise NotSupported(h)
        return 700_000

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return {self.NVML_CLOCK_SM: 1980, self.NVML_CLOCK_MEM: 2619}[kind] - h

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        assert kind == self.NVML_TEMPERATURE_GPU
        return 54 + h


def test_readings_are_nvml_figures_and_unsupported_ones_are_none():
    now = [0.0]
    nvml = FakeNvml()
    monitor = GpuMonitor(nvml, every_s=1.0, clock=lambda: now[0])
    first, second = monitor.read()
    assert first == GpuReading(0, "NVIDIA Fake 0", 37, 20 * GIB, 80 * GIB, 351.25, 700.0,
                               1980, 2619, 54)
    assert (second.name, second.util_pct, second.mem_used, second.temp_c) == (
        "NVIDIA Fake 1", 38, 21 * GIB, 55)
    assert second.power_w is None and second.power_limit_w is None
    reads = nvml.reads
    now[0] = 0.5
    assert monitor.read() == (first, second) and nvml.reads == reads  # once a second
    now[0] = 1.0
    monitor.read()
    assert nvml.reads == reads + 2
    monitor.close()
    assert nvml.shut and monitor.read() == ()


def test_no_library_or_no_device_gives_no_readings():
    monitor = GpuMonitor(FakeNvml(fail_init=True))
    assert not monitor.available and monitor.read() == ()


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this machine has an NVIDIA driver")
def test_this_cpu_only_machine_has_no_gpu_rows():
    assert GpuMonitor().read() == ()


def panel_text(app: NinferConsole) -> str:
    console = Console(width=160, record=True)
    console.print(app.query_one(MemoryPanel).render())
    return console.export_text()


@pytest.mark.anyio
@pytest.mark.parametrize("size", [(160, 50), (80, 24)])
async def test_memory_panel_shows_one_row_per_gpu_and_none_without(size):
    feed = FakeSupervisor("cpu_only")
    with_gpus = NinferConsole(feed, title_info="test", gpu_monitor=GpuMonitor(FakeNvml()))
    async with with_gpus.run_test(size=size):
        play_all(with_gpus, feed)
        shown = panel_text(with_gpus)
    plain_feed = FakeSupervisor("cpu_only")
    without = NinferConsole(plain_feed, title_info="test")
    async with without.run_test(size=size):
        play_all(without, plain_feed)
        bare = panel_text(without)
    assert "gpu" not in bare
    if size[0] >= 120:
        assert "gpu0    util 37%  mem 20.0/80.0 GiB  power 351/700 W  clocks 1980/2619 MHz  54°C" \
            in shown
        assert "gpu1    util 38%  mem 21.0/80.0 GiB  power ? W  clocks 1979/2618 MHz  55°C" \
            in shown
    else:  # the compact line: utilization and temperature
        assert "gpu0 37% 54°C" in shown and "gpu1 38% 55°C" in shown
