"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's kernels.

A decode step is hundreds of short kernels back to back; without PDL each one's launch and
ramp-up wait for its predecessor to drain. A kernel launched with `launch_pdl` may start
while its predecessor finishes: it calls `pdl_wait` before its first load (which returns once
every kernel before it has completed and its writes are visible), and `pdl_release` once its
main loop is done, so that the next kernel's launch overlaps its epilogue. Measured on the
H200 (bench/results/h200-pdl-chain.md): 0.5-0.6 µs a GEMV in a chain of them; the
whole decode step 35B-A3B +8 %, 27B fp8-row +5 %.

Kernels take `PDL: tl.constexpr = 0` and are launched with `**pdl_launch(tensor)`: PDL on a
CUDA device of compute capability >= 9.0 when Triton has `gdc_wait`, never under the
interpreter; `set_pdl(False)` turns it off (to measure it).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._dispatch import interpreting

try:  # Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: PDL stays off
    gdc_launch_dependents = gdc_wait = None

_enabled = True


def set_pdl(enabled: bool) -> None:
    """Turn programmatic dependent launch on or off for launches from now on."""
    global _enabled
    _enabled = enabled


@functools.cache
def _capable(index: int) -> bool:
    return gdc_wait is not None and torch.cuda.get_device_capability(index) >= (9, 0)


def pdl_launch(tensor: torch.Tensor) -> dict:
    """Launch keywords for a kernel with a `PDL` parameter, on `tensor`'s device."""
    if _enabled and tensor.is_cuda and not interpreting() and _capable(tensor.device.index or 0):
        return {"PDL": 1, "launch_pdl": True}
    return {}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Block until the kernels before this one have completed (PDL launches only)."""
    if PDL:
        gdc_wait()


@triton.jit
def pdl_release(PDL: tl.constexpr):
    """Let the next PDL kernel launch now (it still waits for this one in `pdl_wait`)."""
    if PDL:
        gdc_launch_dependents()
