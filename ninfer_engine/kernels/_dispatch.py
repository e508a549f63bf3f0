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


def interpreting() -> bool:
    """True under `TRITON_INTERPRET=1` (kernels run on the CPU through the interpreter)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_dtype():
    """Operand dtype for `tl.dot`: bf16 on GPUs; fp32 under the interpreter, whose dot
    multiplies bf16 operands' raw bit patterns (seen with Triton 3.9)."""
    import triton.language as tl

    return tl.float32 if interpreting() else tl.bfloat16
