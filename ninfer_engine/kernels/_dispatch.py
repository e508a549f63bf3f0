"""Backend choice shared by the kernel modules."""

from __future__ import annotations

import importlib.util
import os

import torch

# CPU-only torch wheels come without Triton; the tests then skip
HAVE_TRITON = importlib.util.find_spec("triton") is not None


def use_triton(tensor: torch.Tensor) -> bool:
    """True when `tensor` lives on a CUDA device and Triton is importable."""
    return HAVE_TRITON and tensor.is_cuda


def has_e4m3(device) -> bool:
    """Whether a CUDA device converts and multiplies e4m3 in hardware: sm89 and newer (Triton
    compiles no fp8e4nv code below, triton#4319)."""
    return torch.cuda.get_device_capability(device) >= (8, 9)


def interpreting() -> bool:
    """True under `TRITON_INTERPRET=1` (kernels run on the CPU through the interpreter)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_dtype():
    """Operand dtype for `tl.dot`: bf16 on GPUs; fp32 under the interpreter, whose dot
    multiplies bf16 operands' raw bit patterns (seen with Triton 3.9)."""
    import triton.language as tl

    return tl.float32 if interpreting() else tl.bfloat16
