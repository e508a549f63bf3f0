import pytest
import torch

from ninfer_engine.kernels.moe_gemv import moe_gemv_ref, moe_gemv_triton

from .conftest import rel_err


@pytest.mark.parametrize("per_slot", [False, True])
def test_moe_gemv_reads_the_routed_experts(device, per_slot):
    g = torch.Generator().manual_seed(8)
    w = torch.randn(6, 40, 64, generator=g).bfloat16()
    ids = torch.tensor([4, 1, 4])  # a repeated expert is allowed
    x = torch.randn(3 if per_slot else 1, 64, generator=g).bfloat16()
    ref = moe_gemv_ref(x, w, ids)
    out = moe_gemv_triton(x.to(device), w.to(device), ids.to(device), block_n=16, block_k=32)
    assert rel_err(out, ref) < 1e-2


def test_moe_gemv_masks_a_k_tail(device):
    # tiny-moe's down projection has K = 24, not a power of two
    g = torch.Generator().manual_seed(9)
    w = torch.randn(4, 40, 24, generator=g).bfloat16()
    ids = torch.tensor([3, 0])
    x = torch.randn(2, 24, generator=g).bfloat16()
    out = moe_gemv_triton(x.to(device), w.to(device), ids.to(device), block_n=16)
    assert rel_err(out, moe_gemv_ref(x, w, ids)) < 1e-2
