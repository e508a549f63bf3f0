"""Prefill's grouped expert GEMMs over stacks in their stored form (`kernels.moe_grouped`): each
sorted row through its expert, against a float64 reference, for bf16, fp8-row and fp8-group
stacks, experts with no rows, a row count that leaves partial tiles, and a stack holding one
expert more than the routing (the shared expert)."""
import pytest
import torch

from ninfer_engine.kernels.moe_dequant import dequantize_experts
from ninfer_engine.kernels.moe_grouped import moe_grouped_down, moe_grouped_swiglu, tile_plan

from .conftest import down_exact, gate_up_exact
from .test_moe_fp8 import fp8_stack
from tests.tolerance import assert_rounded_once

BF16 = torch.bfloat16


def _routing(T, k, E, gen):
    """Expert ids [T, k] (distinct per token) that leave expert 1 without rows, the stable
    expert order of the flat rows and the per-expert counts."""
    ids = torch.stack([torch.randperm(E - 1, generator=gen)[:k] for _ in range(T)])
    ids = torch.where(ids >= 1, ids + 1, ids)  # never expert 1
    flat = ids.reshape(-1)
    return ids, torch.argsort(flat, stable=True), torch.bincount(flat, minlength=E)


def _stack(layout, E, N, K, gen):
    if layout == "bf16":
        w = (torch.randn(E, N, K, generator=gen) / K ** 0.5).bfloat16()
        return w, None, w.double()
    codes, scale = fp8_stack(E, N, K, layout, gen, group=16)
    return codes, scale, dequantize_experts(codes, scale, dtype=torch.float64)


@pytest.mark.parametrize("layout", ["bf16", "row", "group"])
@pytest.mark.parametrize("T,k,E,I,H,blocks", [
    (5, 2, 6, 32, 64, None), (37, 3, 8, 48, 80, None), (70, 2, 4, 32, 64, None),
    # other tile sizes (`moe_grouped_bench.py --tiles` sweeps them): row and K tiles that
    # split the experts' rows and the widths differently
    (37, 3, 8, 48, 80, (32, 32, 32)), (70, 2, 4, 32, 64, (64, 16, 16)),
    # the 128-row tiles of long prompts, with `LAUNCH`'s sizes for them
    (70, 2, 4, 32, 64, (128, None, None))])
def test_grouped_swiglu_and_down_match_float64(device, layout, T, k, E, I, H, blocks):
    gen = torch.Generator().manual_seed(T + E)
    ids, order, counts = _routing(T, k, E, gen)
    assert counts[1] == 0
    x = torch.randn(T, H, generator=gen).bfloat16()
    # one stacked expert more than the routing's: the shared expert of a fused stack
    gu, gu_s, gu_exact = _stack(layout, E + 1, 2 * I, H, gen)
    bm, bn, bk = blocks or (None, None, None)  # None: tile_plan's and LAUNCH's choice
    tiles = tile_plan(counts.to(device), T * k, bm)
    act = moe_grouped_swiglu(x.to(device), order.to(device), k, tiles, gu.to(device),
                             None if gu_s is None else gu_s.to(device), bn, bk)
    assert act.dtype == BF16 and act.shape == (T * k, I)
    rows = order // k  # sorted row r is token order[r] // k through expert ids.flat[order[r]]
    experts = ids.reshape(-1)[order]
    exact, noise = gate_up_exact(x[rows], gu_exact[experts], torch.arange(T * k))
    assert_rounded_once(act.cpu(), exact, noise)

    dn, dn_s, dn_exact = _stack(layout, E + 1, H, I, gen)
    weights = torch.softmax(torch.randn(T, k, generator=gen), -1).bfloat16()
    slots = moe_grouped_down(act, order.to(device), weights.reshape(-1).to(device), tiles,
                             dn.to(device), None if dn_s is None else dn_s.to(device), bn, bk)
    assert slots.shape == (T * k, H)
    # slot order[r] holds sorted row r's product, times its own routing weight
    back = torch.empty_like(order)
    back[order] = torch.arange(T * k)
    terms, noise = down_exact(act.cpu()[back], dn_exact[ids.reshape(-1)],
                              weights.reshape(-1, 1).float(), T * k, 1)
    assert_rounded_once(slots.cpu(), terms[:, 0], noise)


def test_no_rows_give_empty_outputs(device):
    w = torch.zeros(3, 8, 16).bfloat16().to(device)
    order = torch.zeros(0, dtype=torch.long, device=device)
    counts = torch.zeros(3, dtype=torch.long, device=device)
    assert moe_grouped_swiglu(torch.zeros(0, 16).bfloat16().to(device), order, 2,
                              tile_plan(counts, 0), w).shape == (0, 4)
