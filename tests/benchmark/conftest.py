"""Benchmark tests run the Triton kernels on the CPU through TRITON_INTERPRET=1 (no CUDA here)."""

import os

import torch

if not torch.cuda.is_available():
    # before any kernel module is imported: triton.jit picks the interpreter at decoration
    os.environ.setdefault("TRITON_INTERPRET", "1")
