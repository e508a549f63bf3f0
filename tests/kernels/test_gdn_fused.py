from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from ninfer_engine.kernels.gdn_decode import gdn_decode_ref
from ninfer_engine.kernels.gdn_fused import (gdn_gated_norm, gdn_gated_norm_ref,
                                             gdn_gated_norm_triton, gdn_prep, gdn_prep_ref,
                                             gdn_prep_triton)

from tests.tolerance import (CAST, TRANSCENDENTAL, assert_within, bound, gamma,
                             gated_delta_depth)

from .conftest import SILU_SLOPE, compile_in_child, rel_err

K = 4
F32 = torch.float32


def _layer(nk, nv, dk, dv, gen, norm_dtype=torch.bfloat16, taps=K):
    """A GDN mixer's decode-time parameters, shaped as `GatedDeltaNet` holds them."""
    C = 2 * nk * dk + nv * dv
    return SimpleNamespace(
        nk=nk, nv=nv, dk=dk, dv=dv, taps=taps, conv_dim=C,
        conv=(torch.randn(taps, C, generator=gen) * 0.5).bfloat16(),
        a_log=torch.randn(nv, generator=gen) * 0.5,
        dt_bias=torch.randn(nv, generator=gen),
        norm=(1 + 0.1 * torch.randn(dv, generator=gen)).to(norm_dtype))


def _proj(B, m, gen):
    kg, vg = m.nk * m.dk, m.nv * m.dv
    p = torch.randn(B, 2 * kg + 2 * vg + 2 * m.nv, generator=gen) * 2
    # a spread of a + dt_bias across softplus's threshold (20) and its far-negative tail
    a = torch.linspace(-30, 30, m.nv)[None].expand(B, -1) + torch.randn(B, m.nv, generator=gen)
    p[:, -m.nv:] = a
    return p.bfloat16()


def _to(xs, device):
    return [x.to(device) for x in xs]


def _prep_bounds(proj, conv, m):
    """Elementwise fp32 error bounds of `gdn_prep`'s (q, k, v, g, beta), each side's:
    q, k, v = SiLU(Σ_taps window·w): γ_K·Σ|window·w| through SiLU's slope, then SiLU's exp,
    add and division relative to the result; g = −e^{a_log}·softplus(a + dt_bias): two exps, a
    log1p, the add, whose relative error softplus scales by up to |a + dt_bias| (its tail is
    e^y), and the product; β = sigmoid(b) of an exact b: an exp, an add, a division."""
    kg, vg = m.nk * m.dk, m.nv * m.dv
    window = torch.cat([conv, proj[:, None, : 2 * kg + vg]], 1).double()  # [B, K, C]
    terms = (window.abs() * m.conv.double().abs()).sum(1)
    exact = F.silu((window * m.conv.double()).sum(1))
    qkv = gamma(F32, m.taps) * SILU_SLOPE * terms + gamma(F32, TRANSCENDENTAL + 2) * exact.abs()
    y = proj[:, -m.nv:].double() + m.dt_bias.double()
    g_rel = gamma(F32, 3 * TRANSCENDENTAL + 2 + y.abs().clamp(min=1).max().item())
    return (qkv[:, :kg].view(-1, m.nk, m.dk), qkv[:, kg: 2 * kg].view(-1, m.nk, m.dk),
            qkv[:, 2 * kg:].view(-1, m.nv, m.dv), g_rel, gamma(F32, TRANSCENDENTAL + 2))


def _assert_fp32_close(out, ref, one_side):
    """fp32 both sides, each within `one_side` (absolute [tensor] or relative [float])."""
    assert out.dtype == torch.float32 and out.shape == ref.shape
    if isinstance(one_side, float):
        one_side = one_side * ref.double().abs()  # a product chain: no cancellation
    assert_within(out, ref, 2 * one_side)


@pytest.mark.parametrize("nk, nv, dk, dv, B, block_c", [
    (2, 4, 16, 16, 1, 512),
    (2, 4, 16, 16, 3, 32),  # several channel blocks: block 0 alone writes g, beta
    (2, 4, 32, 32, 3, 512),
    (2, 4, 64, 64, 1, 512),
    (2, 4, 64, 64, 3, 64),
    (2, 2, 24, 40, 3, 64),  # C = 176: a masked channel tail
    (16, 32, 128, 128, 1, 512),  # 27B GDN heads
    (16, 48, 128, 128, 1, 512),  # 35B-A3B GDN heads
])
def test_gdn_prep_matches_reference(device, nk, nv, dk, dv, B, block_c):
    gen = torch.Generator().manual_seed(nk * 1000 + nv * 10 + dk + B)
    m = _layer(nk, nv, dk, dv, gen)
    proj = _proj(B, m, gen)
    conv = torch.randn(B, K - 1, m.conv_dim, generator=gen).bfloat16()
    conv_ref, conv_tri = conv.clone(), conv.clone().to(device)
    bounds = _prep_bounds(proj, conv, m)
    ref = gdn_prep_ref(proj, conv_ref, m.conv, m.a_log, m.dt_bias, nk, dk, nv, dv)
    proj_d = proj.to(device)
    out = gdn_prep_triton(proj_d, conv_tri, *_to((m.conv, m.a_log, m.dt_bias), device),
                          nk, dk, nv, dv, block_c=block_c)
    for o, r, b in zip(out[:5], ref[:5], bounds):  # q, k, v, g, beta
        assert o.is_contiguous()
        _assert_fp32_close(o, r, b)
    # the conv state shifted in place, bit for bit; the oldest row dropped
    assert torch.equal(conv_tri.cpu(), conv_ref)
    assert torch.equal(conv_ref[:, :-1], conv[:, 1:])
    # z: a view of proj, not a copy
    z = out[5]
    assert z.data_ptr() == proj_d.data_ptr() + m.conv_dim * proj_d.element_size()
    assert torch.equal(z.cpu(), ref[5])


def test_gdn_prep_two_steps_carry_conv_state(device):
    # the second step's window reads the rows the first step shifted in
    gen = torch.Generator().manual_seed(5)
    nk, nv, dk, dv, B = 2, 4, 16, 32, 2
    m = _layer(nk, nv, dk, dv, gen)
    conv_ref = torch.zeros(B, K - 1, m.conv_dim).bfloat16()
    conv_tri = conv_ref.clone().to(device)
    for _ in range(K + 1):
        proj = _proj(B, m, gen)
        bounds = _prep_bounds(proj, conv_ref, m)
        ref = gdn_prep_ref(proj, conv_ref, m.conv, m.a_log, m.dt_bias, nk, dk, nv, dv)
        out = gdn_prep_triton(proj.to(device), conv_tri,
                              *_to((m.conv, m.a_log, m.dt_bias), device), nk, dk, nv, dv)
        for o, r, b in zip(out[:3], ref[:3], bounds):
            _assert_fp32_close(o, r, b)
        assert torch.equal(conv_tri.cpu(), conv_ref)


# the models' width (the window held in registers) and another (the loop through memory)
@pytest.mark.parametrize("taps", [K, 3])
def test_gdn_prep_padding_tokens_past_valid_shift_nothing(device, taps):
    # rows of 4 tokens in slots 3 and 1 whose first 1 and 3 are real (`valid`): the windows
    # left and the real tokens' q, k, v are those of the rows cut to their real tokens
    gen = torch.Generator().manual_seed(9)
    nk, nv, dk, dv, T = 2, 4, 16, 32, 4
    m = _layer(nk, nv, dk, dv, gen, taps=taps)
    pool = torch.randn(4, taps - 1, m.conv_dim, generator=gen).bfloat16()
    index, valid = torch.tensor([3, 1]), torch.tensor([1, 3], dtype=torch.int32)
    proj = _proj(2 * T, m, gen)
    conv_tri = pool.clone().to(device)
    out = gdn_prep_triton(proj.to(device), conv_tri, *_to((m.conv, m.a_log, m.dt_bias), device),
                          nk, dk, nv, dv, index.to(device), valid=valid.to(device))
    conv_ref = pool.clone()
    ref = gdn_prep_ref(proj, conv_ref, m.conv, m.a_log, m.dt_bias, nk, dk, nv, dv, index,
                       valid=valid)
    for b, (slot, n) in enumerate(zip(index.tolist(), valid.tolist())):
        real = slice(b * T, b * T + n)
        cut = pool.clone()
        want = gdn_prep_ref(proj[real], cut, m.conv, m.a_log, m.dt_bias, nk, dk, nv, dv,
                            torch.tensor([slot]))
        for o, r, w in zip(out[:3], ref[:3], want[:3]):
            assert torch.equal(r[real], w)
        # token t convolves rows t .. t+K-1 of [its slot's window; its row's tokens]
        history = torch.cat([pool[slot], proj[real, : m.conv_dim]])
        before = torch.stack([history[t: t + taps - 1] for t in range(n)])
        for o, w, bound_ in zip(out[:3], want[:3], _prep_bounds(proj[real], before, m)):
            _assert_fp32_close(o[real], w, bound_)
        assert torch.equal(conv_tri[slot].cpu(), cut[slot]) and torch.equal(conv_ref[slot],
                                                                             cut[slot])
    assert torch.equal(conv_tri[torch.tensor([0, 2])].cpu(), pool[torch.tensor([0, 2])])


def test_gdn_prep_addresses_conv_slots_by_index(device):
    # rows 0, 1 shift slots 3 and 1 of a 4-slot pool: the same as rows holding those windows,
    # and the other slots are left alone
    gen = torch.Generator().manual_seed(8)
    nk, nv, dk, dv = 2, 4, 16, 32
    m = _layer(nk, nv, dk, dv, gen)
    pool = torch.randn(4, K - 1, m.conv_dim, generator=gen).bfloat16()
    index = torch.tensor([3, 1])
    proj = _proj(2, m, gen)
    rows = pool[index].clone()
    ref = gdn_prep_ref(proj, rows, m.conv, m.a_log, m.dt_bias, nk, dk, nv, dv)
    conv_tri = pool.clone().to(device)
    out = gdn_prep_triton(proj.to(device), conv_tri, *_to((m.conv, m.a_log, m.dt_bias), device),
                          nk, dk, nv, dv, index.to(device))
    for o, r, b in zip(out[:3], ref[:3], _prep_bounds(proj, pool[index], m)):
        _assert_fp32_close(o, r, b)
    assert torch.equal(conv_tri[index].cpu(), rows)
    assert torch.equal(conv_tri[torch.tensor([0, 2])].cpu(), pool[torch.tensor([0, 2])])
    conv_ref = pool.clone()
    again = gdn_prep_ref(proj, conv_ref, m.conv, m.a_log, m.dt_bias, nk, dk, nv, dv, index)
    assert all(torch.equal(a, r) for a, r in zip(again, ref))
    assert torch.equal(conv_ref, conv_tri.cpu())


@pytest.mark.parametrize("taps", [K, 3])  # the window in registers; the loop through memory
def test_gdn_prep_walks_a_rows_tokens_and_keeps_the_windows(device, taps):
    # two rows of 3 tokens in slots 1 and 0: outputs, final windows and the window after
    # tokens 1 and 2 (trail) against the reference, which equals 3 one-token calls
    gen = torch.Generator().manual_seed(9)
    nk, nv, dk, dv, T = 2, 4, 16, 32, 3
    m = _layer(nk, nv, dk, dv, gen, taps=taps)
    pool = torch.randn(2, taps - 1, m.conv_dim, generator=gen).bfloat16()
    index = torch.tensor([1, 0])
    proj = _proj(2 * T, m, gen)
    conv_ref, trail_ref = pool.clone(), torch.zeros(T - 1, 2, taps - 1, m.conv_dim).bfloat16()
    ref = gdn_prep_ref(proj, conv_ref, m.conv, m.a_log, m.dt_bias, nk, dk, nv, dv, index,
                       trail_ref)
    one, steps = pool.clone(), []
    for t in range(T):
        steps.append(gdn_prep_ref(proj[t::T], one, m.conv, m.a_log, m.dt_bias, nk, dk, nv, dv,
                                  index))
        if t < T - 1:
            assert torch.equal(one[index], trail_ref[t])
    for i in range(3):  # the conv's outputs; g and beta do not depend on the window
        assert torch.equal(torch.stack([s[i] for s in steps], 1).flatten(0, 1), ref[i])
    conv_tri = pool.clone().to(device)
    trail = torch.zeros(T - 1, 3, taps - 1, m.conv_dim, device=device).bfloat16()
    out = gdn_prep_triton(proj.to(device), conv_tri, *_to((m.conv, m.a_log, m.dt_bias), device),
                          nk, dk, nv, dv, index.to(device), trail)
    # token row (b, t) convolves rows t .. t+K-1 of [its slot's window; its row's tokens]
    history = torch.cat([pool[index], proj[:, : m.conv_dim].view(2, T, -1)], 1)
    before = torch.stack([history[b, t: t + taps - 1] for b in range(2) for t in range(T)])
    for o, r, b in zip(out[:3], ref[:3], _prep_bounds(proj, before, m)):
        _assert_fp32_close(o, r, b)
    assert torch.equal(conv_tri.cpu(), conv_ref)
    assert torch.equal(trail[:, :2].cpu(), trail_ref) and not trail[:, 2:].any()


@pytest.mark.parametrize("nv, dv, B, norm_dtype", [
    (4, 16, 1, torch.bfloat16),
    (4, 32, 3, torch.bfloat16),
    (4, 64, 3, torch.bfloat16),
    (2, 40, 3, torch.bfloat16),  # a masked tail
    (4, 32, 2, torch.float32),  # an fp32 weight: no bf16 rounding of norm · o
    (32, 128, 1, torch.bfloat16),
    (48, 128, 1, torch.bfloat16),
])
@pytest.mark.parametrize("rows", [None, 4, 16])
def test_gdn_gated_norm_matches_reference(device, nv, dv, B, norm_dtype, rows):
    gen = torch.Generator().manual_seed(nv + dv + B)
    o = torch.randn(B, nv, dv, generator=gen) * 3
    # z as _gdn passes it: a strided slice of the projection output
    proj = (torch.randn(B, 3 * nv * dv + 5, generator=gen) * 3).bfloat16()
    z = proj[:, nv * dv + 5: 2 * nv * dv + 5]
    norm = (1 + 0.1 * torch.randn(dv, generator=gen)).to(norm_dtype)
    eps = 1e-6
    ref = gdn_gated_norm_ref(o, z, norm, eps)
    zd = proj.to(device)[:, nv * dv + 5: 2 * nv * dv + 5]
    out = gdn_gated_norm_triton(o.to(device), zd, norm.to(device), eps,
                                rows_per_program=rows).cpu()
    _check_gated_norm(out, ref)


def _check_gated_norm(out, ref):
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape and out.is_contiguous()
    # the sum of squares' order differs (fp32, ~1e-5 relative), which can move the normed o's
    # bf16 rounding to the next value (≤ 2⁻⁷ relative); the product's and the output's
    # roundings can each add one more ulp: ≤ 3 · 2⁻⁷ elementwise
    rtol = 3 * 2 ** -7
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=1e-30)
    assert rel_err(out, ref) < rtol  # implied by the elementwise bound
    assert (out == ref).float().mean() > 0.99


@pytest.mark.parametrize("rows", [1, 8])
def test_gdn_gated_norm_gathers_padded_rows(device, rows):
    # a prompt step's o in its chunk-padded layout: output row b reads o[at[b]], the padding
    # rows (here filled with large values) are never read
    gen = torch.Generator().manual_seed(7)
    nv, dv, B = 4, 32, 11
    padded = torch.full((24, nv, dv), 1e4)
    at = torch.tensor([0, 1, 2, 3, 4, 16, 17, 18, 19, 20, 21])
    padded[at] = torch.randn(B, nv, dv, generator=gen) * 3
    z = (torch.randn(B, nv * dv, generator=gen) * 3).bfloat16()
    norm = (1 + 0.1 * torch.randn(dv, generator=gen)).bfloat16()
    ref = gdn_gated_norm_ref(padded[at], z, norm, 1e-6)
    assert torch.equal(gdn_gated_norm_ref(padded, z, norm, 1e-6, at), ref)
    out = gdn_gated_norm_triton(padded.to(device), z.to(device), norm.to(device), 1e-6,
                                at.to(device), rows_per_program=rows).cpu()
    _check_gated_norm(out, ref)


def _torch_gdn_tail(m, proj, conv, ssm, eps):
    """`HybridStep._gdn` minus its two GEMVs (proj = w_in(y); returns what w_out reads), with
    the torch reference recurrence."""
    B = proj.shape[0]
    kg, vg = m.nk * m.dk, m.nv * m.dv
    qkv, z, b, a = proj.split([2 * kg + vg, vg, m.nv, m.nv], -1)
    window = torch.cat([conv, qkv[:, None]], 1)  # [B, K, C]
    conv.copy_(window[:, 1:])
    qkv = F.silu((window.float() * m.conv.float()).sum(1))
    q, k, v = qkv.split([kg, kg, vg], -1)
    g = -m.a_log.exp() * F.softplus(a.float() + m.dt_bias)
    o = gdn_decode_ref(q.reshape(B, m.nk, m.dk), k.reshape(B, m.nk, m.dk),
                       v.reshape(B, m.nv, m.dv), g, torch.sigmoid(b.float()), ssm)
    o = o.to(torch.bfloat16).float()
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
    o = (m.norm * o.to(torch.bfloat16) * F.silu(z.reshape(B, m.nv, m.dv).float()))
    return o.to(torch.bfloat16).reshape(B, vg)


@pytest.mark.parametrize("nk, nv, dk, dv, B", [(2, 4, 16, 16, 3), (2, 4, 32, 64, 2)])
def test_fused_chain_matches_torch_gdn(device, nk, nv, dk, dv, B):
    gen = torch.Generator().manual_seed(11)
    m = _layer(nk, nv, dk, dv, gen)
    eps = 1e-6
    conv_ref = torch.zeros(B, K - 1, m.conv_dim).bfloat16()
    ssm_ref = torch.zeros(B, nv, dk, dv)
    conv_tri, ssm_tri = conv_ref.clone().to(device), ssm_ref.clone()
    w = _to((m.conv, m.a_log, m.dt_bias), device)
    norm = m.norm.to(device)
    gates = []
    for _ in range(3):
        proj = _proj(B, m, gen)
        proj[:, -m.nv:] = proj[:, -m.nv:] / 10  # a realistic decay range for the recurrence
        ref = _torch_gdn_tail(m, proj, conv_ref, ssm_ref, eps)
        q, k, v, g, beta, z = gdn_prep_triton(proj.to(device), conv_tri, *w, nk, dk, nv, dv)
        o = gdn_decode_ref(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), ssm_tri)
        out = gdn_gated_norm_triton(o.to(device), z, norm, eps).cpu()
        assert out.dtype == torch.bfloat16 and out.shape == ref.shape
        # fp32: the prep (conv taps, SiLU; the gate's exps and softplus, whose argument here
        # stays within |a + dt_bias| ≲ 6) then the recurrence (both sides the torch rule, fed
        # the two preps' inputs) over the steps so far
        gates.append(g.cpu())
        y = (proj[:, -nv:].float() + m.dt_bias).abs().max().item()
        depth = (K + TRANSCENDENTAL + 2 + 3 * TRANSCENDENTAL + 2 + y
                 + gated_delta_depth(torch.cat(gates).view(-1, B * nv), dk, normalize=True))
        # bf16: the torch tail rounds o, the normalised o and the gated product (3 casts), the
        # kernel as many; plus the gated norm's dv-term sum of squares and rsqrt
        assert rel_err(out, ref) < bound(torch.bfloat16, depth + dv + TRANSCENDENTAL,
                                         roundings=3 * CAST)
        assert torch.equal(conv_tri.cpu(), conv_ref)
        assert rel_err(ssm_tri, ssm_ref) < bound(F32, depth)


def test_dispatch_takes_reference_on_cpu_tensors():
    gen = torch.Generator().manual_seed(2)
    m = _layer(2, 4, 16, 16, gen)
    proj = _proj(2, m, gen)
    c1, c2 = torch.zeros(2, 2, K - 1, m.conv_dim).bfloat16()
    a = gdn_prep(proj, c1, m.conv, m.a_log, m.dt_bias, 2, 16, 4, 16)
    b = gdn_prep_ref(proj, c2, m.conv, m.a_log, m.dt_bias, 2, 16, 4, 16)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    o = torch.randn(2, 4, 16, generator=gen)
    assert torch.equal(gdn_gated_norm(o, a[5], m.norm, 1e-6),
                       gdn_gated_norm_ref(o, a[5], m.norm, 1e-6))


COMPILE_PREP = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.gdn_fused_kernels import _gdn_prep_kernel as k

types = ["*bf16", "*bf16", "*i64", "*bf16", "*fp32", "*fp32", "*fp32", "*bf16", "*i32"]
types += ["i32"] * 5
for taps, T, trail, valid in ((4, 4, True, 0), (4, 64, False, 1), (3, 4, True, 0)):
    consts = dict(KG=2048, VG=4096, NV=32, K=taps, BLOCK_C=512, BLOCK_NV=32, EVEN=True,
                  LIBDEVICE=True, INDEXED=True, T=T, TRAIL=trail, VALID=valid, PDL=0)
    signature = {**dict(zip(k.arg_names, types)), **dict.fromkeys(consts, "constexpr")}
    triton.compile(ASTSource(k, signature, constexprs=consts),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
"""


def test_the_prep_kernel_compiles_for_the_gpu():
    """Compiled for an H200 (sm_90) at the 35B-A3B GDN shape, no GPU needed (the interpreter
    checks less than Triton's compiler): the width-4 window in registers for a verify row
    with its trail and a padded prompt row, and the loop through memory (another width)."""
    compile_in_child(COMPILE_PREP)
