"""The grouped expert GEMMs with e4m3 activations (`fp8_act`, `kernels.act_quant`): the row
quantizer bit-equal to its torch reference and within half a code step of its input, and each
GEMM against a float64 reference over the activations its codes stand for.

On a GPU the dots multiply e4m3 codes in the tensor cores, whose fp8 accumulation keeps about
14 bits between promotions (DeepSeek-V3 technical report, §3.3.2: "around 14 bits" on Hopper),
so there the accumulator's unit roundoff is taken as 2⁻¹³; under the interpreter the codes are
exact fp32 operands of an fp32 dot (2⁻²⁴)."""
import pytest
import torch

from ninfer_engine.kernels._dispatch import interpreting
from ninfer_engine.kernels.act_quant import quantize_rows, quantize_rows_ref
from ninfer_engine.kernels.moe_grouped import moe_grouped_down, moe_grouped_swiglu, tile_plan

from .conftest import compile_in_child, down_exact, gate_up_exact
from .test_moe_grouped import _routing, _stack
from tests.tolerance import E4M3_HALF_STEP, E4M3_HALF_STEP_SUBNORMAL, assert_rounded_once


def _acc_unit(device) -> float | None:
    return 2.0 ** -13 if device == "cuda" and not interpreting() else None


def _dequantized(x, device):
    """The activations the kernels' codes stand for (`quantize_rows`, which they call)."""
    codes, scale = quantize_rows(x.to(device))
    return codes.cpu().double() * scale.cpu().double()[:, None]


def test_quantize_rows_matches_the_reference_within_half_a_step(device):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 300, generator=gen) * torch.logspace(-3, 3, 9)[:, None]
    x[4] = 0.0  # an all-zero row: codes 0, a finite scale
    x[6, 7] = 1e4  # one large value: the rest of its row falls into the subnormal codes
    x = x.bfloat16()
    codes, scale = quantize_rows(x.to(device))
    want_codes, want_scale = quantize_rows_ref(x)
    assert codes.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert torch.equal(codes.cpu().view(torch.uint8), want_codes.view(torch.uint8))
    assert torch.equal(scale.cpu(), want_scale)
    assert not codes.cpu().float()[4].any() and torch.isfinite(scale.cpu()).all()
    # powers of two that put each nonzero row's largest magnitude in (224, 448]
    assert torch.equal(torch.frexp(scale.cpu())[0], torch.full((9,), 0.5))
    top = x.double().abs().amax(-1) / scale.cpu().double()
    assert ((top > 224) & (top <= 448))[x.abs().amax(-1) > 0].all()
    deq, exact = codes.cpu().double() * scale.cpu().double()[:, None], x.double()
    limit = torch.maximum(E4M3_HALF_STEP * exact.abs(),
                          E4M3_HALF_STEP_SUBNORMAL * scale.cpu().double()[:, None])
    assert ((deq - exact).abs() <= limit).all()


@pytest.mark.parametrize("T,k,E,I,H,blocks", [
    (37, 3, 8, 48, 80, None), (70, 2, 4, 32, 64, (64, 32, 32)),
    (70, 2, 4, 32, 64, (128, None, None))])
def test_fp8_activation_gemms_match_float64(device, T, k, E, I, H, blocks):
    gen = torch.Generator().manual_seed(T + E + 1)
    ids, order, counts = _routing(T, k, E, gen)
    x = (torch.randn(T, H, generator=gen) * torch.logspace(-1, 1, H)).bfloat16()
    gu, gu_s, gu_exact = _stack("row", E + 1, 2 * I, H, gen)
    bm, bn, bk = blocks or (None, None, None)
    tiles = tile_plan(counts.to(device), T * k, bm)
    act = moe_grouped_swiglu(x.to(device), order.to(device), k, tiles, gu.to(device),
                             gu_s.to(device), bn, bk, fp8_act=True)
    assert act.dtype == torch.bfloat16 and act.shape == (T * k, I)
    rows, experts = order // k, ids.reshape(-1)[order]
    exact, noise = gate_up_exact(_dequantized(x, device)[rows], gu_exact[experts], None,
                                 _acc_unit(device))
    assert_rounded_once(act.cpu(), exact, noise)

    dn, dn_s, dn_exact = _stack("row", E + 1, H, I, gen)
    weights = torch.softmax(torch.randn(T, k, generator=gen), -1).bfloat16()
    slots = moe_grouped_down(act, order.to(device), weights.reshape(-1).to(device), tiles,
                             dn.to(device), dn_s.to(device), bn, bk, fp8_act=True)
    back = torch.empty_like(order)
    back[order] = torch.arange(T * k)
    terms, noise = down_exact(_dequantized(act, device).cpu()[back], dn_exact[ids.reshape(-1)],
                              weights.reshape(-1, 1).float(), T * k, 1, _acc_unit(device))
    assert_rounded_once(slots.cpu(), terms[:, 0], noise)


def test_fp8_activations_need_e4m3_tensor_cores(monkeypatch):
    """`fp8_act_supported`: an fp8-row stack at a swept row tile, and on CUDA an sm89+ device
    (below it Triton compiles no fp8 dot: an Ampere card keeps bf16 activations)."""
    from types import SimpleNamespace

    from ninfer_engine.kernels import moe_grouped

    gen = torch.Generator().manual_seed(0)
    w, scale, _ = _stack("row", 3, 8, 64, gen)
    assert moe_grouped.fp8_act_supported(w, scale, 64)
    assert not moe_grouped.fp8_act_supported(w, scale, 16)  # a row tile not swept
    on_cuda = SimpleNamespace(is_cuda=True, device="cuda:0", dtype=w.dtype, shape=w.shape)
    monkeypatch.setattr(moe_grouped, "scale_layout", lambda w, s: (1, 0, None))
    for capability, takes in (((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)
        assert moe_grouped.fp8_act_supported(on_cuda, scale, 128) is takes


def test_fp8_activations_need_an_fp8_row_stack_and_32_wide_k_tiles(device):
    gen = torch.Generator().manual_seed(0)
    counts = torch.tensor([1, 0, 0], device=device)
    order = torch.zeros(1, dtype=torch.long, device=device)
    x, tiles = torch.ones(1, 64).bfloat16().to(device), tile_plan(counts, 1)
    for layout, block_k, message in (("bf16", None, "fp8-row stack"),
                                     ("group", None, "fp8-row stack"),
                                     ("row", 16, "K tiles of 32")):
        w, scale, _ = _stack(layout, 3, 8, 64, gen)
        with pytest.raises(AssertionError, match=message):
            moe_grouped_swiglu(x, order, 1, tiles, w.to(device),
                               None if scale is None else scale.to(device), None, block_k,
                               fp8_act=True)


COMPILE = """
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.moe_grouped import LAUNCH_FP8
from ninfer_engine.kernels.moe_grouped_kernels import _down_kernel, _swiglu_kernel

moe = dict(E=256, EP=256, MODE=1, G=128, DOT=tl.float8e4nv, MANUAL_RNE=False, FP8_ACT=True)
types = {"swiglu": ["*fp8e4nv", "*fp32", "*i64", "*i32", "*i32", "*i64", "*fp8e4nv", "*bf16",
                    "*bf16", "i32"],
         "down": ["*fp8e4nv", "*fp32", "*i64", "*bf16", "*i32", "*i32", "*i64", "*fp8e4nv",
                  "*bf16", "*bf16"]}
for name, kernel in (("swiglu", _swiglu_kernel), ("down", _down_kernel)):
    for bm, (bn, bk, warps, stages) in LAUNCH_FP8[name].items():
        consts = dict(moe, I=512, H=2048, BM=bm, BN=bn, BK=bk)
        assert len(types[name]) + len(consts) == len(kernel.arg_names), kernel.arg_names
        signature = {**dict(zip(kernel.arg_names, types[name])),
                     **dict.fromkeys(consts, "constexpr")}
        triton.compile(ASTSource(kernel, signature, constexprs=consts),
                       target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
"""


def test_the_e4m3_launches_compile_for_the_gpu():
    """Both GEMMs at each of `LAUNCH_FP8`'s row tiles, compiled for an H200 (sm_90) at the
    35B-A3B shape with the model's dims compile-time, e4m3 dots; no GPU needed."""
    compile_in_child(COMPILE)
