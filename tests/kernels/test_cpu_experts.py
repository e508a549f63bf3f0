"""The host's fp8-row expert kernel (`kernels/cpu_experts.c`) against a float64 reference over
the same codes, within the fp32 error its own operation counts allow (derived below, per
output), in each of its forms (AVX2, AVX-512, and for bf16 inputs the bf16 tables of
`cpu_experts_bf16.h`); the same bits at any thread count and prefetch distance; only fp8-row
stacks taken."""
import pytest
import torch

from ninfer_engine.kernels.cpu_experts import (ISAS, cpu_experts_unavailable, fp8_experts,
                                               fp8_experts_ref, takes, use_isa,
                                               use_prefetch)
from ninfer_engine.models.experts import ExpertStack

pytestmark = pytest.mark.skipif(cpu_experts_unavailable() is not None,
                                reason=str(cpu_experts_unavailable()))
U = 2.0 ** -24  # fp32 unit roundoff
U_BF16 = 2.0 ** -8  # bf16's


@pytest.fixture(params=ISAS)
def isa(request):
    """Each test in each of the kernel's forms (skipped where the CPU lacks it)."""
    if use_isa(request.param) != request.param:
        pytest.skip(f"this CPU does not run {request.param}")
    yield request.param
    use_isa(ISAS[-1])  # back to the default: the widest the CPU has


def _tables_form(isa, x, I, H) -> bool:
    """Whether `fp8_experts` takes the bf16 tables' form (which rounds act to bf16)."""
    return isa == "avx512-bf16" and x.dtype == torch.bfloat16 and I % 64 == 0 == H % 64


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def _codes(shape, gen):
    """e4m3 codes drawn over every byte but the two NaNs, so each table entry is read."""
    c = torch.randint(0, 254, shape, generator=gen, dtype=torch.int32)
    c = c + (c >= 0x7f).int()  # skip 0x7f; 0xfe is the largest drawn, 0xff never
    return c.to(torch.uint8).view(torch.float8_e4m3fn)


def _normal_codes(shape, gen):
    """e4m3 codes of normal weights (what fp8-row checkpoints hold: most codes near 0)."""
    return (torch.randn(shape, generator=gen) * 64).to(torch.float8_e4m3fn)


def _stacks(E, I, H, gen, codes=_codes):
    gu = ExpertStack(codes((E, 2 * I, H), gen),
                     (torch.rand(E, 2 * I, generator=gen) / 64).to(torch.bfloat16))
    dn = ExpertStack(codes((E, H, I), gen),
                     (torch.rand(E, H, generator=gen) / 64).to(torch.bfloat16))
    return gu, dn


def _bound(x, rows, experts, weights, gu, dn, act_bf16=False):
    """Per output, the fp32 kernel's worst-case error: each gate/up dot of H products and its
    scale γ(H+1)·Σ|terms| (the products are exact in every form); SiLU moves at most 1.1× its
    input's error, plus 5 roundings of its own (exp, add, divide, two multiplies), and with
    `act_bf16` one more to bf16 (U_BF16); each down dot γ(I+2)·Σ|terms| plus what its inputs
    carry; the sum over pairs into y one rounding a pair."""
    H, I = dn.w.shape[1], dn.w.shape[2]
    bound = torch.zeros(x.shape[0], H, dtype=torch.float64)
    total = torch.zeros_like(bound)
    for r, e, w in zip(rows, experts, weights):
        wg = gu.w[e].double() * gu.scale[e].double()[:, None]
        terms = (wg * x[r].double()).abs().sum(-1)
        h = wg @ x[r].double()
        a, b = h[:I], h[I:]
        err_a, err_b = gamma(H + 1) * terms[:I], gamma(H + 1) * terms[I:]
        silu = torch.nn.functional.silu(a)
        act = silu * b
        err_act = (1.1 * err_a * (b.abs() + err_b) + silu.abs() * err_b
                   + (5 * U + (U_BF16 if act_bf16 else 0)) * act.abs())
        wd = dn.w[e].double() * dn.scale[e].double()[:, None]
        down = (wd.abs() @ act.abs())
        bound[r] += abs(w) * (gamma(I + 2) * down + wd.abs() @ err_act)
        total[r] += abs(w) * down
    return bound + len(rows) * U * total


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("E,I,H,codes", [(6, 40, 72, _codes), (6, 64, 128, _codes),
                                         (4, 512, 2048, _normal_codes)])
def test_the_kernel_is_within_its_fp32_error_of_the_float64_reference(E, I, H, codes, x_dtype,
                                                                      isa):
    """Every code byte drawn (small stacks: each table entry read; 64 | I, H takes the bf16
    tables), and a Flash-Next-sized expert's normal weights (uniform bytes would cancel so
    much over 2,048 products that the worst-case bound says little); each form (its own
    summation order, the same bound, plus act's bf16 rounding in the tables' form)."""
    gen = torch.Generator().manual_seed(E)
    gu, dn = _stacks(E, I, H, gen, codes)
    x = torch.randn(3, H, generator=gen).to(x_dtype)
    act_bf16 = _tables_form(isa, x, I, H)
    rows, experts, weights = [0, 2, 0, 1, 2], [E - 2, 1, E - 1, E - 2, 0], [0.5, 1.0, 0.25,
                                                                             0.75, -0.3]
    got = fp8_experts(x, rows, experts, weights, gu, dn, torch.zeros(3, H))
    want = fp8_experts_ref(x, rows, experts, weights, gu, dn, torch.zeros(3, H).double())
    bound = _bound(x, rows, experts, weights, gu, dn, act_bf16)
    assert ((got.double() - want).abs() <= bound).all()
    if codes is _normal_codes:  # worst-case over 2,048 products: ~20 % of an output here,
        return                  # which catches a wrong expert or stride, not a wrong code
    # the small stack's bound discriminates: one down code of the first pair one step off (the
    # code of its largest product at output h) moves that output by more than it allows
    r, e, h = rows[0], experts[0], 5
    wg = gu.w[e].double() * gu.scale[e].double()[:, None]
    g = wg @ x[r].double()
    wd = dn.w[e, h].double() * float(dn.scale[e, h])
    i = int((wd * torch.nn.functional.silu(g[:I]) * g[I:]).abs().argmax())
    codes = dn.w.view(torch.uint8).clone()
    codes[e, h, i] += 1 if codes[e, h, i] % 0x80 < 0x7e else -1
    off = fp8_experts_ref(x, rows, experts, weights, gu,
                          ExpertStack(codes.view(torch.float8_e4m3fn), dn.scale),
                          torch.zeros(3, H).double())
    assert (off[r, h] - want[r, h]).abs() > bound[r, h]


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_the_same_bits_at_any_thread_count_and_prefetch_distance(x_dtype, isa):
    gen = torch.Generator().manual_seed(7)
    gu, dn = _stacks(5, 64, 128, gen)
    x = torch.randn(2, 128, generator=gen).to(x_dtype)
    args = ([0, 1, 1, 0], [4, 0, 3, 2], [1.0, 0.5, 0.5, 2.0], gu, dn)
    default = use_prefetch(-1)
    try:
        use_prefetch(0)
        one = fp8_experts(x, *args, torch.zeros(2, 128), threads=1)
        # (1 MiB is past the stacks' end: a prefetch never faults)
        for threads, distance in ((2, 0), (3, 0), (0, 0), (1, 64), (2, 4096), (0, 1 << 20)):
            assert use_prefetch(distance) == distance
            assert torch.equal(one, fp8_experts(x, *args, torch.zeros(2, 128), threads=threads))
    finally:
        use_prefetch(default)


def test_only_fp8_row_stacks_are_taken():
    gen = torch.Generator().manual_seed(0)
    gu, dn = _stacks(2, 8, 16, gen)
    assert takes(gu, dn)
    assert not takes(ExpertStack(gu.w.float().to(torch.bfloat16)), dn)  # bf16 weights
    groups = ExpertStack(gu.w, gu.scale.float().repeat(1, 1, 1).view(2, 16, 1)
                         .to(torch.bfloat16))
    assert not takes(groups, dn)  # group scales
    assert not takes(gu, ExpertStack(dn.w, dn.scale.float()))  # fp32 scales
