"""Memory panel: each GPU's VRAM by category as a stacked bar, then host RAM and pinned RAM.

On the CPU the engine's memory is host RAM: one bar shows the machine's RAM split into what the
engine holds (weights, KV pool, the rest of its RSS), other processes and free; no second row
repeats it. Beside the engine process's RSS: its CPU use (% of one core, as top) and the machine's
(`engine RSS 1.1 GiB, CPU 36% (machine 100% of 2 cores)`: one line down to 140 columns).

Under the bars, one row per GPU that NVML reports (utilization, memory, power, clocks,
temperature; `gpu.GpuMonitor`); none where NVML finds no device."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive

from ninfer_engine.stats import DeviceMemory, EngineStats, HostMemory

from ..gpu import GpuReading
from .base import Panel
from .format import fraction_bar, gib, stacked_bar

# (field of DeviceMemory, label, style); the order is the order of the bar's segments.
CATEGORIES = (
    ("weights", "weights", "dodger_blue2"),
    ("kv_pool", "KV", "green3"),
    ("expert_slots", "experts", "magenta"),
    ("workspace", "work", "yellow3"),
    ("free", "free", "grey42"),
)
LABEL_WIDTH = 8
TAIL_WIDTH = 16


class MemoryPanel(Panel):
    # NVML's readings of the machine's GPUs (not the engine's: live in every engine state)
    nvml: reactive[tuple[GpuReading, ...]] = reactive((), layout=True)

    def __init__(self) -> None:
        super().__init__("memory", id="memory")

    def render_stats(self, stats: EngineStats) -> RenderableType:
        gpus = [d for d in stats.devices if d.name != "cpu"]
        cpu = next((d for d in stats.devices if d.name == "cpu"), None)
        if self.compact:
            line = compact_line(gpus, cpu, stats.host)
            for reading in self.nvml:
                line.append(f"  gpu{reading.index} ", style="dim")
                line.append(f"{_figure(reading.util_pct, '%')} {_figure(reading.temp_c, '°C')}")
            return line
        bar_width = max(10, self.size.width - LABEL_WIDTH - TAIL_WIDTH)
        lines: list[RenderableType] = []
        for device in gpus:
            lines.extend(device_lines(device, bar_width))
        if cpu is not None:
            lines.extend(cpu_lines(cpu, stats.host, bar_width))
        else:
            if not gpus:
                lines.append(Text("no device figures yet", style="dim"))
            lines.extend(host_lines(stats.host, bar_width))
        lines.extend(gpu_line(reading) for reading in self.nvml)
        return Group(*lines)


def _figure(value: float | None, unit: str, spec: str = ".0f") -> str:
    return "?" if value is None else f"{value:{spec}}{unit}"


def gpu_line(reading: GpuReading) -> Text:
    """`gpu0    util 37%  mem 80.1/139.8 GiB  power 351/700 W  clocks 1980/2619 MHz  54°C`."""
    line = Text(f"{'gpu' + str(reading.index):<{LABEL_WIDTH}}")
    memory = "?"
    if reading.mem_used is not None and reading.mem_total is not None:
        memory = f"{gib(reading.mem_used)}/{gib(reading.mem_total)} GiB"
    power = _figure(reading.power_w, "")
    if reading.power_limit_w is not None:
        power += f"/{reading.power_limit_w:.0f}"
    groups = (("util", _figure(reading.util_pct, "%")), ("mem", memory),
              ("power", f"{power} W"),
              ("clocks", f"{_figure(reading.sm_clock_mhz, '')}/"
                         f"{_figure(reading.mem_clock_mhz, '')} MHz"),
              ("", _figure(reading.temp_c, "°C")))
    for label, value in groups:
        if label:
            line.append(f"{label} ", style="dim")
        line.append(f"{value}  ")
    line.rstrip()
    return line


def compact_line(gpus: list[DeviceMemory], cpu: DeviceMemory | None, host: HostMemory) -> Text:
    line = Text("memory ", style="bold")
    for device in gpus:
        line.append(f"{device.name} ", style="dim")
        line.append(f"{gib(device.total - device.free)}/{gib(device.total)} GiB  ")
    if cpu is not None:
        line.append("engine ", style="dim")
        line.append(f"{gib(host.process_rss)} GiB ")
        line.append(f"(weights {gib(cpu.weights)}, KV {gib(cpu.kv_pool)})  ", style="dim")
    line.append("RAM ", style="dim")
    line.append(f"{gib(host.used)}/{gib(host.total)} GiB")
    if host.cpus:
        line.append("  CPU ", style="dim")
        line.append(f"{host.process_cpu:.0f}%")
    return line


def cpu_use(host: HostMemory) -> Text:
    """`, CPU 180% (machine 95% of 2 cores)`; nothing before the first reading."""
    if not host.cpus:
        return Text()
    return Text.assemble((", CPU ", "dim"), f"{host.process_cpu:.0f}%",
                         (f" (machine {host.machine_cpu:.0f}% of {host.cpus} cores)", "dim"))


def cpu_lines(cpu: DeviceMemory, host: HostMemory, bar_width: int) -> list[Text]:
    """Host RAM split into the engine's categories, other processes and free; then the legend."""
    engine = cpu.weights + cpu.kv_pool + cpu.workspace
    others = max(host.used - engine, 0)
    parts = [(cpu.weights, "dodger_blue2"), (cpu.kv_pool, "green3"), (cpu.workspace, "yellow3"),
             (others, "grey50"), (max(host.total - host.used, 0), "grey30")]
    bar = Text(f"{'RAM':<{LABEL_WIDTH}}")
    bar.append_text(stacked_bar(parts, bar_width))
    bar.append(f" {gib(host.used):>5}/{gib(host.total)} GiB")
    legend = Text(" " * LABEL_WIDTH)
    for (amount, style), label in zip(parts, ("weights", "KV", "engine other", "others", "free")):
        legend.append("■ ", style=style)
        legend.append(f"{label} ", style="dim")
        legend.append(f"{gib(amount)}  ")
    legend.rstrip()
    return [bar, legend, Text.assemble(" " * LABEL_WIDTH, ("engine RSS ", "dim"),
                                       f"{gib(host.process_rss)} GiB", cpu_use(host))]


def device_lines(device: DeviceMemory, bar_width: int) -> list[Text]:
    """The stacked bar, then each category's GiB behind a swatch of its colour (the legend)."""
    parts = [(getattr(device, name), style) for name, _, style in CATEGORIES]
    used = device.total - device.free
    bar = Text(f"{device.name:<{LABEL_WIDTH}}")
    bar.append_text(stacked_bar(parts, bar_width))
    bar.append(f" {gib(used):>5}/{gib(device.total)} GiB")
    amounts = Text()
    for name, label, style in CATEGORIES:
        amounts.append("■ ", style=style)
        amounts.append(f"{label} ", style="dim")
        amounts.append(f"{gib(getattr(device, name))}  ")
    amounts.rstrip()
    return [bar, amounts]


def host_lines(host: HostMemory, bar_width: int) -> list[Text]:
    """RAM use of the machine and of the engine process, then the page-locked tiers in use."""
    fraction = host.used / host.total if host.total else 0.0
    ram = Text(f"{'RAM':<{LABEL_WIDTH}}")
    ram.append_text(fraction_bar(fraction, bar_width, "cyan"))
    ram.append(f" {gib(host.used):>5}/{gib(host.total)} GiB")
    rss = Text.assemble(
        " " * LABEL_WIDTH, ("engine RSS ", "dim"), gib(host.process_rss), " GiB",
        cpu_use(host))
    pinned = Text(f"{'pinned':<{LABEL_WIDTH}}")
    tiers = (
        ("experts", host.pinned_experts),
        ("KV tier", host.pinned_kv_tier),
        ("state tier", host.pinned_state_tier),
    )
    shown = [(label, amount) for label, amount in tiers if amount]
    for label, amount in shown:
        pinned.append(f"{label} ", style="dim")
        pinned.append(f"{gib(amount)} GiB   ")
    if not shown:
        pinned.append("none", style="dim")
    pinned.rstrip()
    return [ram, rss, pinned]
