import pytest
import torch

from ninfer_engine.kernels.moe_gemv import moe_gemv_ref, moe_gemv_triton

from tests.tolerance import CAST, bound

from .conftest import rel_err, softmax_depth


def _tol(K):
    """bf16 operands (exact products in fp32), a length-K fp32 sum, the output cast once
    each side (the interpreter may truncate: CAST)."""
    return bound(torch.bfloat16, K, roundings=CAST)


@pytest.mark.parametrize("per_slot", [False, True])
def test_moe_gemv_reads_the_routed_experts(device, per_slot):
    g = torch.Generator().manual_seed(8)
    w = torch.randn(6, 40, 64, generator=g).bfloat16()
    ids = torch.tensor([4, 1, 4])  # a repeated expert is allowed
    x = torch.randn(3 if per_slot else 1, 64, generator=g).bfloat16()
    ref = moe_gemv_ref(x, w, ids)
    out = moe_gemv_triton(x.to(device), w.to(device), ids.to(device), block_n=16, block_k=32)
    assert rel_err(out, ref) < _tol(64)


def test_moe_gemv_masks_a_k_tail(device):
    # tiny-moe's down projection has K = 24, not a power of two
    g = torch.Generator().manual_seed(9)
    w = torch.randn(4, 40, 24, generator=g).bfloat16()
    ids = torch.tensor([3, 0])
    x = torch.randn(2, 24, generator=g).bfloat16()
    out = moe_gemv_triton(x.to(device), w.to(device), ids.to(device), block_n=16)
    assert rel_err(out, moe_gemv_ref(x, w, ids)) < _tol(24)


def test_route_topk_rounds_fp32_sums_to_the_bf16_logits(device):
    """`round_bf16`: fp32 router sums (a split GEMV's `out`) route as their bf16 rounding,
    the logits a bf16 GEMV stores, does; unrounded, sub-ulp differences reorder the slots."""
    from ninfer_engine.kernels.moe_route import route_topk_triton

    gen = torch.Generator().manual_seed(9)
    # pairs (2i, 2i+1): a bf16 value and the same plus a quarter ulp, which both rounding
    # to nearest (GPU) and truncation (interpreter) take back to it: a tie once rounded
    v = torch.randn(3, 33, generator=gen).bfloat16().float()
    ulp = torch.exp2(torch.floor(torch.log2(v.abs())) - 7)
    logits = torch.stack([v[:, :32], v[:, :32] + ulp[:, :32] / 4], -1).flatten(1)
    logits = torch.cat([logits, v[:, 32:]], 1)  # the shared score
    want_w, want_ids = route_topk_triton(logits.bfloat16().to(device), 8, True, shared=True)
    w, ids = route_topk_triton(logits.to(device), 8, True, shared=True, round_bf16=True)
    assert torch.equal(ids.cpu(), want_ids.cpu())
    # the same softmax over the same bf16 logits, γ of its chain relative to each weight
    rtol = bound(torch.float32, softmax_depth(logits.bfloat16(), 8))
    torch.testing.assert_close(w.cpu(), want_w.cpu(), rtol=rtol, atol=0)
    _, raw_ids = route_topk_triton(logits.to(device), 8, True, shared=True)
    assert not torch.equal(raw_ids.cpu(), want_ids.cpu())
