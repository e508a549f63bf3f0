"""Triton decode kernels, each beside its torch reference.

Every public op dispatches with `use_triton(tensor)`: Triton on CUDA, the torch reference
elsewhere. The `*_triton` entry points also run on CPU tensors under `TRITON_INTERPRET=1`,
which is how the tests check them without a GPU.
"""

from ._dispatch import use_triton

__all__ = ["use_triton"]
