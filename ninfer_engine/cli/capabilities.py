"""What this build and this machine can run: a flag whose feature is missing stops startup.

Each entry names the flags that ask for a feature and why it cannot run here. Flags are never
silently ignored: a user who asks for speculation or a quantized KV cache is told it is missing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from ..config import EngineConfig
from .flag_table import PROFILES, flag_field


class FeatureUnavailable(Exception):
    """One line naming the flag and the missing feature or device; startup exits 1."""


@dataclass(frozen=True)
class Machine:
    cuda_devices: int
    capability: tuple[tuple[int, int], ...] = ()  # each CUDA device's (major, minor), if known


@dataclass(frozen=True)
class _Gate:
    flags: tuple[str, ...]
    applies: Callable[[EngineConfig], bool]
    reason: Callable[[EngineConfig, Machine], str | None]  # None = runs here


def _not_built(what: str) -> Callable[[EngineConfig, Machine], str]:
    return lambda c, m: f"{what} is not available yet"


def _needs_cuda(
    what: str, then: str | None = None
) -> Callable[[EngineConfig, Machine], str | None]:
    def reason(c: EngineConfig, m: Machine) -> str | None:
        if m.cuda_devices == 0:
            return f"{what} needs a CUDA device; this machine has none"
        return f"{then or what} is not available yet"

    return reason


def _runs_on_cuda(what: str) -> Callable[[EngineConfig, Machine], str | None]:
    """Built, CUDA only: runs wherever a CUDA device exists."""
    def reason(c: EngineConfig, m: Machine) -> str | None:
        return None if m.cuda_devices else f"{what} needs a CUDA device; this machine has none"

    return reason


def _tensor_parallel(c: EngineConfig, m: Machine) -> str | None:
    """One rank per CUDA device of `--devices` (`parallel.launch`); the CPU's gloo ranks are
    for tests and failure drills, not a serving mode: only with `NINFER_TP_CPU=1` (ours) on a
    machine without CUDA."""
    if m.cuda_devices == 0 and os.environ.get("NINFER_TP_CPU") == "1":
        return None
    missing = [d for d in c.devices if d >= m.cuda_devices]
    if missing:
        return (f"tensor parallelism needs CUDA devices {','.join(map(str, c.devices))}; "
                f"this machine has {m.cuda_devices}")
    return None


def _spec(c: EngineConfig, m: Machine) -> str | None:
    """`--spec ngram` and `--spec mtp` run at any `--tp` (the MTP head is sharded like the text
    layers); `--spec dflash` and `dflash2` at `--tp 1`."""
    if c.spec in ("dflash", "dflash2") and c.tp != 1:
        return f"--spec {c.spec} under --tp above 1 is not built yet"
    return None


def _device_exists(c: EngineConfig, m: Machine) -> str | None:
    if c.device < m.cuda_devices:
        return None
    return f"CUDA device {c.device} does not exist (this machine has {m.cuda_devices})"


def _e4m3_kv(c: EngineConfig, m: Machine) -> str | None:
    """fp8 KV pages hold e4m3 codes, which the attention kernels convert in hardware
    (`kernels.paged_kv`): sm89 and newer (Triton compiles no e4m3 below); the CPU's torch path
    decodes them anywhere. nvfp4's e4m3 block scales are decoded from their bits (fp16 bit
    arithmetic) and encoded by torch, so it is not gated."""
    for device in (c.devices if c.tp == 2 else (c.device,)):
        if device < len(m.capability) and m.capability[device] < (8, 9):
            major, minor = m.capability[device]
            return (f"fp8 KV holds e4m3 codes, which need an sm89+ GPU; CUDA device {device} "
                    f"is sm{major}{minor} (int8, k8v4, nvfp4 and bf16 KV decode without them)")
    return None


def _vision_device(c: EngineConfig, m: Machine) -> str | None:
    """The encoder's CUDA device, or device 0 meaning the CPU on a machine without CUDA."""
    if c.vision_device < m.cuda_devices or (m.cuda_devices == 0 and c.vision_device == 0):
        return None
    return f"CUDA device {c.vision_device} does not exist (this machine has {m.cuda_devices})"


_GATES: tuple[_Gate, ...] = (
    _Gate(("--tp", "--devices"), lambda c: c.tp == 2, _tensor_parallel),
    _Gate(("--device",), lambda c: True, _device_exists),
    _Gate(("--spec", "--draft-tokens"), lambda c: c.spec != "ngram", _spec),
    _Gate(("--lm-head-draft",), lambda c: c.spec != "mtp",
          lambda c, m: "the draft head narrows MTP drafts: it needs --spec mtp"),
    _Gate(("--log-speculation-detail",), lambda c: c.spec is None,
          lambda c, m: "per-round speculation detail needs --spec"),
    _Gate(("--vision-device",), lambda c: True, _vision_device),
    _Gate(("--kv-dtype",), lambda c: c.kv_dtype == "fp8", _e4m3_kv),
    _Gate(("--kv-capacity", "--vram-headroom-mib"), lambda c: c.kv_capacity_auto,
          _runs_on_cuda("automatic KV sizing")),  # `kv.sizing`
    _Gate(("--context-cost-presets",), lambda c: True, _not_built("context cost presets")),
    _Gate(("--embedding-host",), lambda c: True, _needs_cuda("a host-resident embedding table")),
)


def check_features(config: EngineConfig, explicit: frozenset[str], machine: Machine) -> None:
    """Raise FeatureUnavailable for the first requested flag this build or machine cannot run."""
    for gate in _GATES:
        asked = [f for f in gate.flags if f in explicit]
        if asked and gate.applies(config):
            reason = gate.reason(config, machine)
            if reason:
                value = _flag_value(config, asked[0])
                where = f"`{asked[0]}{value}`"
                if config.profile and asked[0] in PROFILES[config.profile]:
                    # the user typed the profile, not the flag: name both
                    where = f"`--profile {config.profile}` ({where})"
                raise FeatureUnavailable(f"{where}: {reason}")


def _flag_value(config: EngineConfig, flag: str) -> str:
    field, takes_value = flag_field(flag)
    if not takes_value:
        return ""
    value = getattr(config, field)
    if isinstance(value, tuple):
        value = ",".join(map(str, value))
    return f" {value}"


def probe_machine() -> Machine:
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return Machine(count, tuple(torch.cuda.get_device_capability(i) for i in range(count)))
    except Exception:  # a broken CUDA install counts as no device
        return Machine(cuda_devices=0)
