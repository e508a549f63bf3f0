"""Kernel tests run the Triton path on CUDA, or on the CPU through TRITON_INTERPRET=1."""

import pytest
import torch

from ninfer_engine.kernels._dispatch import HAVE_TRITON, interpreting


@pytest.fixture
def device():
    if not HAVE_TRITON:
        pytest.skip("Triton is not installed")
    if torch.cuda.is_available():
        return "cuda"
    if interpreting():
        return "cpu"
    pytest.skip("needs CUDA or TRITON_INTERPRET=1")


def rel_err(out, ref):
    """‖out − ref‖ / ‖ref‖ in fp64."""
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()
