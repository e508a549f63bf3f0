import pytest
import torch
import torch.nn.functional as F

from ninfer_engine.kernels.moe_down import (moe_down_combine, moe_down_combine_ref,
                                            moe_down_combine_triton)
from ninfer_engine.kernels.moe_fused import (moe_gate_up_silu, moe_gate_up_silu_ref,
                                             moe_gate_up_silu_triton, route_topk, route_topk_ref,
                                             route_topk_triton)
from ninfer_engine.kernels.moe_dequant import dequantize_experts
from ninfer_engine.kernels.moe_gemv import moe_gemv_ref

from tests.tolerance import TRANSCENDENTAL, assert_rounded_once, assert_within, bound

from .conftest import down_exact, gate_up_exact, rel_err, softmax_depth
from .test_moe_fp8 import fp8_stack

F32, BF16 = torch.float32, torch.bfloat16


def _fp32_gate_up(x, w_gu, ids):
    return gate_up_exact(x, w_gu[ids].double(), ids)


def _assert_rounded_once(out, exact_noise):
    """out is the exact value rounded once to bf16 (to nearest: a truncating cast, or a second
    rounding, breaks this), up to the fp32 accumulation noise."""
    assert_rounded_once(out, *exact_noise)


def _current_gate_up(x, w_gu, ids):
    """The torch sequence of `HybridStep._experts` (bf16 g, u, SiLU and product)."""
    g, u = moe_gemv_ref(x, w_gu, ids).chunk(2, -1)
    return F.silu(g) * u


def _fp64_down(act, w_down, ids, weights, B, k):
    terms, noise = down_exact(act, w_down[ids].double(), weights, B, k)
    return terms.sum(1), noise


def _current_down(act, w_down, ids, weights, B, k):
    down = moe_gemv_ref(act, w_down, ids)
    return (down.view(B, k, -1) * weights.to(act.dtype)[..., None]).float().sum(1).to(act.dtype)


# ---------------------------------------------------------------------------------- route_topk

@pytest.mark.parametrize("B,E,k,renorm,dtype", [
    (1, 8, 2, True, torch.float32), (3, 16, 4, False, torch.bfloat16),
    (3, 256, 8, True, torch.bfloat16),  # the real 35B-A3B router
    (2, 200, 5, True, torch.float32),   # E, k not powers of two
    (2, 512, 16, False, torch.float32)])
def test_route_topk_matches_softmax_topk(device, B, E, k, renorm, dtype):
    g = torch.Generator().manual_seed(E + k)
    logits = (torch.randn(B, E, generator=g) * 3).to(dtype)
    w_ref, ids_ref = route_topk_ref(logits, k, renorm)
    w, ids = route_topk_triton(logits.to(device), k, renorm)
    assert w.dtype == torch.float32 and ids.dtype == torch.int64 and w.shape == (B, k)
    w, ids = w.cpu(), ids.cpu()
    torch.testing.assert_close(w, w_ref, rtol=bound(F32, softmax_depth(logits, k)), atol=0)
    assert (w[:, :-1] >= w[:, 1:]).all()
    # bf16 logits do tie (here three equal logits compete for the 8th slot of a row of 256):
    # any order of equal probabilities is a correct top-k (torch's own differs by device), the
    # kernel takes the lowest index first. Elsewhere the ids are torch's, in torch's order.
    probs = torch.softmax(logits.float(), -1)
    torch.testing.assert_close(probs.gather(1, ids), probs.gather(1, ids_ref), rtol=0, atol=0)
    assert all(len(set(row.tolist())) == k for row in ids)
    untied = probs.gather(1, ids_ref)[:, :, None] != probs[:, None, :]  # [B, k, E]
    untied = untied.sum(-1) == E - 1  # slots whose probability no other expert shares
    assert torch.equal(ids[untied], ids_ref[untied])
    if dtype == torch.float32:
        assert torch.equal(ids, ids_ref)


@pytest.mark.parametrize("B", [1, 3])
def test_route_topk_appends_the_shared_slot(device, B):
    """`shared=True`: the last logit column is the shared-expert score; the routed slots come
    from the other E columns (as without it) and slot k is (sigmoid(score), E). Reads a
    row-strided view, as the decode step hands it a GEMV output's columns."""
    g = torch.Generator().manual_seed(B)
    E, k = 16, 4
    wide = (torch.randn(B, E + 9, generator=g) * 3).to(torch.bfloat16)
    logits = wide[:, 3 : 3 + E + 1]  # a column slice: row stride E + 9
    w, ids = route_topk_triton(logits.to(device), k, True, shared=True)
    w_plain, ids_plain = route_topk_ref(logits[:, :E], k, True)
    assert w.shape == ids.shape == (B, k + 1)
    routed = bound(F32, softmax_depth(logits[:, :E], k))
    torch.testing.assert_close(w[:, :k].cpu(), w_plain, rtol=routed, atol=0)
    assert torch.equal(ids[:, :k].cpu(), ids_plain) and (ids[:, k] == E).all()
    # sigmoid = 1 / (1 + exp(−l)): exp of an exact argument, an add, a division
    shared = bound(F32, TRANSCENDENTAL + 2)
    torch.testing.assert_close(w[:, k].cpu(), torch.sigmoid(logits[:, E].float()), rtol=shared,
                               atol=0)
    w_ref, ids_ref = route_topk_ref(logits, k, True, shared=True)
    torch.testing.assert_close(w.cpu(), w_ref, rtol=max(routed, shared), atol=0)
    assert torch.equal(ids.cpu(), ids_ref)


def test_route_topk_dispatches_to_torch_on_cpu():
    logits = torch.randn(2, 16)
    w, ids = route_topk(logits, 4, True)
    w_ref, ids_ref = route_topk_ref(logits, 4, True)
    assert torch.equal(ids, ids_ref) and torch.equal(w, w_ref)


# ---------------------------------------------------------------------------- moe_gate_up_silu

@pytest.mark.parametrize("x_rows", ["slot", "shared", "token"])
@pytest.mark.parametrize("use_dot", [False, True])
def test_gate_up_silu(device, x_rows, use_dot):
    g = torch.Generator().manual_seed(1)
    E, I, H, B, k = 8, 32, 64, 3, 2
    w_gu = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).bfloat16()
    ids = torch.tensor([5, 1, 1, 7, 0, 5])  # repeated experts are allowed
    n = {"slot": B * k, "shared": 1, "token": B}[x_rows]
    x = torch.randn(n, H, generator=g).bfloat16()
    out = moe_gate_up_silu_triton(x.to(device), w_gu.to(device), ids.to(device),
                                  block_i=16, block_k=32, use_dot=use_dot)
    assert out.dtype == torch.bfloat16 and out.shape == (B * k, I)
    exact = _fp32_gate_up(x, w_gu, ids)
    _assert_rounded_once(out, exact)
    depth = H + TRANSCENDENTAL + 3  # the dots, SiLU and the product, in fp32
    # the reference computes the same fp32 value, also rounded once to bf16
    assert rel_err(out, moe_gate_up_silu_ref(x, w_gu, ids)) < bound(BF16, depth, roundings=1)
    # the current torch sequence rounds g, u, SiLU(g) and the product to bf16: 4 roundings
    xs = x.repeat_interleave(B * k // n, 0) if n != 1 else x
    current = _current_gate_up(xs, w_gu, ids)
    assert rel_err(out, current) < (bound(BF16, depth, roundings=1, sides=1)
                                    + bound(BF16, depth, roundings=4, sides=1))
    exact = exact[0]
    assert rel_err(current, exact) > rel_err(out, exact)  # the fused path is the closer one


@pytest.mark.parametrize("use_dot", [False, True])
def test_gate_up_silu_masks_tails(device, use_dot):
    # H = 72 is not a multiple of the K block, I = 24 not a multiple of the I block
    g = torch.Generator().manual_seed(2)
    E, I, H = 4, 24, 72
    w_gu = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).bfloat16()
    ids = torch.tensor([3, 0, 2])
    x = torch.randn(3, H, generator=g).bfloat16()
    out = moe_gate_up_silu_triton(x.to(device), w_gu.to(device), ids.to(device),
                                  block_i=16, block_k=32, use_dot=use_dot)
    _assert_rounded_once(out, _fp32_gate_up(x, w_gu, ids))


def test_gate_up_silu_single_slot(device):
    g = torch.Generator().manual_seed(3)
    w_gu = (torch.randn(4, 64, 128, generator=g) / 11).bfloat16()
    ids, x = torch.tensor([2]), torch.randn(1, 128, generator=g).bfloat16()
    out = moe_gate_up_silu_triton(x.to(device), w_gu.to(device), ids.to(device))
    _assert_rounded_once(out, _fp32_gate_up(x, w_gu, ids))


# ---------------------------------------------------------------------------- moe_down_combine

@pytest.mark.parametrize("B,k,E,H,I", [(1, 2, 8, 64, 32), (3, 4, 16, 128, 64)])
@pytest.mark.parametrize("use_dot", [False, True])
def test_down_combine(device, B, k, E, H, I, use_dot):
    g = torch.Generator().manual_seed(B * k)
    w_down = (torch.randn(E, H, I, generator=g) / I ** 0.5).bfloat16()
    ids = torch.randint(0, E, (B * k,), generator=g)
    act = torch.randn(B * k, I, generator=g).bfloat16()
    weights = torch.softmax(torch.randn(B, k, generator=g), -1)
    out = moe_down_combine_triton(act.to(device), w_down.to(device), ids.to(device),
                                  weights.to(device), B, k, block_h=16, block_k=32,
                                  use_dot=use_dot)
    assert out.dtype == torch.bfloat16 and out.shape == (B, H)
    exact = _fp64_down(act, w_down, ids, weights, B, k)
    _assert_rounded_once(out, exact)
    depth = I + 1 + k  # the dots, the weight products and the slot sum, in fp32
    ref = moe_down_combine_ref(act, w_down, ids, weights, B, k)  # fp32, rounded once
    assert rel_err(out, ref) < bound(BF16, depth, roundings=1)
    # the current sequence rounds each slot's output, the weights, their product and the sum
    # to bf16: 4 roundings
    current = _current_down(act, w_down, ids, weights, B, k)
    assert rel_err(out, current) < (bound(BF16, depth, roundings=1, sides=1)
                                    + bound(BF16, depth, roundings=4, sides=1))
    exact = exact[0]
    assert rel_err(current, exact) > rel_err(out, exact)


@pytest.mark.parametrize("use_dot", [False, True])
def test_down_combine_masks_tails(device, use_dot):
    # I = 24 (tiny-moe's expert width) and H = 44: both tails masked
    g = torch.Generator().manual_seed(4)
    B, k, E, H, I = 2, 3, 5, 44, 24
    w_down = (torch.randn(E, H, I, generator=g) / 5).bfloat16()
    ids = torch.randint(0, E, (B * k,), generator=g)
    act = torch.randn(B * k, I, generator=g).bfloat16()
    weights = torch.rand(B, k, generator=g)
    out = moe_down_combine_triton(act.to(device), w_down.to(device), ids.to(device),
                                  weights.to(device), B, k, block_h=16, use_dot=use_dot)
    _assert_rounded_once(out, _fp64_down(act, w_down, ids, weights, B, k))


def test_down_combine_is_deterministic(device):
    g = torch.Generator().manual_seed(5)
    B, k, E, H, I = 2, 4, 8, 32, 32
    args = [(torch.randn(B * k, I, generator=g)).bfloat16().to(device),
            (torch.randn(E, H, I, generator=g) / 6).bfloat16().to(device),
            torch.randint(0, E, (B * k,), generator=g).to(device),
            torch.rand(B, k, generator=g).to(device)]
    a = moe_down_combine_triton(*args, B, k)
    assert torch.equal(a, moe_down_combine_triton(*args, B, k))


# ---------------------------------------------------------------------------------- end to end

def _current_experts(y, router, w_gu, w_down, k, renormalise):
    """`HybridStep._experts` with the torch references of its kernels."""
    B = y.shape[0]
    probs = torch.softmax(F.linear(y, router).float(), -1)
    weights, ids = torch.topk(probs, k, -1)
    if renormalise:
        weights = weights / weights.sum(-1, keepdim=True)
    ids = ids.reshape(B * k)
    rows = y[:, None].expand(B, k, y.shape[-1]).reshape(B * k, -1)
    g, u = moe_gemv_ref(rows, w_gu, ids).chunk(2, -1)
    down = moe_gemv_ref(F.silu(g) * u, w_down, ids)
    out = (down.view(B, k, -1) * weights.to(y.dtype)[..., None]).float().sum(1)
    return out.to(y.dtype)


def _fused_experts(y, router, w_gu, w_down, k, renormalise, gate_up, down_combine, route):
    B = y.shape[0]
    weights, ids = route(F.linear(y, router), k, renormalise)
    ids = ids.view(B * k)
    act = gate_up(y, w_gu, ids)  # [B, H] rows: slot s reads token row s // k
    return down_combine(act, w_down, ids, weights, B, k)


@pytest.mark.parametrize("B,renorm", [(1, True), (3, False)])
def test_fused_experts_match_the_torch_sequence(device, B, renorm):
    g = torch.Generator().manual_seed(10 + B)
    E, k, H, I = 16, 4, 128, 64
    y = torch.randn(B, H, generator=g).bfloat16()
    router = (torch.randn(E, H, generator=g) / H ** 0.5).bfloat16()
    w_gu = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).bfloat16()
    w_down = (torch.randn(E, H, I, generator=g) / I ** 0.5).bfloat16()
    ref = _current_experts(y, router, w_gu, w_down, k, renorm)
    dev = [t.to(device) for t in (y, router, w_gu, w_down)]
    out = _fused_experts(*dev, k, renorm, moe_gate_up_silu_triton, moe_down_combine_triton,
                         route_topk_triton)
    assert out.shape == (B, H) and out.dtype == torch.bfloat16
    # fp32 chain: router (H) and softmax (E), gate/up (H), SiLU·u, down (I) and the slot sum;
    # bf16 stores: the fused path rounds the router logits, the activation and the output (3),
    # the torch sequence the router logits, g, u, SiLU, the product, down, the weights, their
    # product and the output (9)
    depth = H + E + 2 * TRANSCENDENTAL + H + 3 + I + 1 + k
    assert rel_err(out, ref) < (bound(BF16, depth, roundings=3, sides=1)
                                + bound(BF16, depth, roundings=9, sides=1))
    # the dispatching entry points (torch references on CPU tensors) agree as well
    out_ref = _fused_experts(y, router, w_gu, w_down, k, renorm, moe_gate_up_silu,
                             moe_down_combine, route_topk)
    assert rel_err(out, out_ref) < bound(BF16, depth, roundings=3)


# ------------------------------------------------- moe_down_combine: slot / K split, fp32 `out`

def _split_case(dtype, B, k, E=12, H=48, I=64, seed=0):
    """Distinct experts for every slot of every row and weights in [0.5, 1.5): a slot dropped or
    counted twice moves the sum far beyond the tolerances (checked by `_assert_sensitive`)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(E, generator=g)[: B * k]
    act = torch.randn(B * k, I, generator=g).bfloat16()
    weights = 0.5 + torch.rand(B, k, generator=g)
    if dtype == "fp8":
        w_down, scale = fp8_stack(E, H, I, "row", g)
    else:
        w_down, scale = (torch.randn(E, H, I, generator=g) / I ** 0.5).bfloat16(), None
    return act, w_down, ids, weights, scale


def _exact_split(act, w_down, ids, weights, B, k, scale):
    """([B, k, H] per-slot terms in fp64, the fp32 accumulation bound of their sum); the
    dequantized weights (e4m3 or |q| ≤ 16 codes × a bf16 / fp16 scale) are exact in fp32."""
    return down_exact(act, dequantize_experts(w_down, scale, ids, torch.float64), weights, B, k)


def _assert_sensitive(out, terms):
    """`out` is far from the sum with any one slot left out or counted twice."""
    total = terms.sum(1)
    for j in range(terms.shape[1]):
        assert rel_err(out, total - terms[:, j]) > 0.05
        assert rel_err(out, total + terms[:, j]) > 0.05


def _run_split(device, case, B, k, out, **kw):
    act, w_down, ids, weights, scale = case
    buf = torch.zeros(B, w_down.shape[1], device=device) if out else None
    got = moe_down_combine_triton(
        act.to(device), w_down.to(device), ids.to(device), weights.to(device), B, k,
        scale=None if scale is None else scale.to(device), out=buf, **kw)
    if out:
        assert got is buf  # the caller's buffer itself, summed into
    return got


@pytest.mark.parametrize("out", [False, True], ids=["alloc", "out"])
@pytest.mark.parametrize("B", [1, 2])
@pytest.mark.parametrize("S", [2, 3, 4], ids=["S2", "S3-uneven", "S=k"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_down_combine_slot_split(device, dtype, S, B, out):
    """k = 4 slots in S groups of slots j ≡ g (mod S) (S = 3: groups of 2, 1, 1 and dead slots
    masked off), atomically summed: the sum of `moe_down_combine_ref`, each slot once. With
    `out` (zeroed fp32) the fp32 sums land in it and it is returned; without, bf16 rounded
    once."""
    k = 4
    case = _split_case(dtype, B, k, seed=10 * S + B)
    got = _run_split(device, case, B, k, out, slot_split=S, block_h=16, block_k=32)
    terms, noise = _exact_split(*case[:4], B, k, case[4])
    exact = terms.sum(1)
    act, w_down, ids, weights, scale = case
    assert got.shape == (B, w_down.shape[1])
    depth = w_down.shape[2] + 1 + k  # the dots, the weight products and the slot sum
    if out:
        assert got.dtype == torch.float32
        # fp32 sums, not rounded to bf16: the reference kept in fp32 (act given as fp32)
        assert_within(got, exact, noise)
        ref = moe_down_combine_ref(act.float(), w_down, ids, weights, B, k, scale)
        assert ref.dtype == torch.float32 and rel_err(got, ref) < bound(F32, depth)
    else:
        assert got.dtype == torch.bfloat16
        _assert_rounded_once(got, (exact, noise))
        ref = moe_down_combine_ref(act, w_down, ids, weights, B, k, scale)
        assert rel_err(got, ref) < bound(BF16, depth, roundings=1)
    _assert_sensitive(got, terms)


@pytest.mark.parametrize("S,k_split", [(1, 2), (2, 2), (3, 3), (5, 2)])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_down_combine_k_split(device, dtype, S, k_split):
    """I = 64 in block_k = 16 tiles over k_split chunks (k_split = 3: chunks of 2, 2 and 0
    tiles), also without a slot split; k = 5 slots, B = 2."""
    B, k = 2, 5
    case = _split_case(dtype, B, k, seed=S + 7 * k_split)
    got = _run_split(device, case, B, k, True, slot_split=S, k_split=k_split, block_h=16,
                     block_k=16)
    terms, noise = _exact_split(*case[:4], B, k, case[4])
    assert_within(got, terms.sum(1), noise)
    _assert_sensitive(got, terms)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("use_dot", [False, True])
def test_down_combine_split_masks_tails(device, dtype, use_dot):
    """H = 44 and I = 24 tails with a dead slot (k = 4, S = 3) and a K split, both variants."""
    B, k = 2, 4
    case = _split_case(dtype, B, k, H=44, I=24, seed=3 + use_dot)
    terms, noise = _exact_split(*case[:4], B, k, case[4])
    for out in (False, True):
        got = _run_split(device, case, B, k, out, slot_split=3, k_split=2, block_h=16,
                         block_k=16, use_dot=use_dot)
        if out:
            # the tl.dot variant multiplies bf16 operands on the GPU (fp32 under the
            # interpreter): their products are exact in fp32, the sums are the noise
            assert_within(got, terms.sum(1), noise)
        else:
            _assert_rounded_once(got, (terms.sum(1), noise))
        _assert_sensitive(got, terms)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_down_combine_out_without_split_stores_the_fp32_sums(device, dtype):
    """S = 1 with `out`: the unchanged kernel stores its fp32 sums in `out`, which rounded once
    to bf16 are the default call's output bit for bit; the default call (slot_split=1, no
    `out`) is the bf16 kernel as before."""
    B, k = 2, 3
    case = _split_case(dtype, B, k, seed=21)
    got = _run_split(device, case, B, k, True, block_h=16, block_k=32)
    default = _run_split(device, case, B, k, False, block_h=16, block_k=32)
    assert got.dtype == torch.float32 and default.dtype == torch.bfloat16
    assert torch.equal(got.bfloat16(), default)
    assert torch.equal(_run_split(device, case, B, k, False, slot_split=1, k_split=1,
                                  block_h=16, block_k=32), default)
    terms, noise = _exact_split(*case[:4], B, k, case[4])
    assert_within(got, terms.sum(1), noise)
    _assert_rounded_once(default, (terms.sum(1), noise))


def test_down_combine_split_rejects(device):
    B, k = 1, 3
    act, w_down, ids, weights, _ = _split_case("bf16", B, k)
    args = [t.to(device) for t in (act, w_down, ids, weights)]
    with pytest.raises(AssertionError):  # more groups than slots
        moe_down_combine_triton(*args, B, k, slot_split=4)
    with pytest.raises(AssertionError):  # `out` is fp32
        moe_down_combine_triton(*args, B, k, slot_split=3,
                                out=torch.zeros(B, w_down.shape[1], device=device).bfloat16())
    g = torch.Generator().manual_seed(0)
    codes, gscale = fp8_stack(12, w_down.shape[1], w_down.shape[2], "group", g, group=16)
    with pytest.raises(NotImplementedError):  # group scales: no split kernel
        moe_down_combine_triton(args[0], codes.to(device), args[2], args[3], B, k,
                                scale=gscale.to(device), slot_split=3)
