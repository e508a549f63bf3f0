"""`kernels.gdn_prompt`: a prompt step's fused GDN prologue against float64, and its layout."""


import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ninfer_engine.kernels.gdn_prompt import (gdn_prompt_prep_ref, gdn_prompt_prep_triton,
                                              prompt_layout)
from tests.tolerance import TRANSCENDENTAL, assert_within, cast_roundings, gamma, unit_roundoff

from .conftest import SILU_SLOPE, compile_in_child

K = 4
F32, BF16 = torch.float32, torch.bfloat16


def test_layout_maps_every_token_to_its_rows_chunk():
    lay = prompt_layout((3, 70, 1), torch.device("cpu"), 64)
    P = lay.padded
    assert P == 64 * 4  # 1 + 2 + 1 chunks
    meta = lay.meta.numpy()
    token, row, pos = meta[:P], meta[P: 2 * P], meta[2 * P: 3 * P]
    assert meta[3 * P: 3 * P + 3].tolist() == [0, 3, 73]  # first tokens
    assert meta[3 * P + 3: 3 * P + 6].tolist() == [3, 70, 1]  # lengths
    assert lay.first.tolist() == [0, 1, 3, 4]
    assert lay.meta.data_ptr() % 16 == 0 and lay.first.data_ptr() % 16 == 0
    assert lay.at.tolist() == [0, 1, 2, *range(64, 134), 192]
    real = token >= 0
    assert real.sum() == 74 and np.array_equal(token[lay.at.numpy()], np.arange(74))
    assert np.array_equal(row[lay.at.numpy()], [0] * 3 + [1] * 70 + [2])
    assert (pos[~real] >= np.array([3, 70, 1])[row[~real]]).all()


def _exact(qkv, conv, w, lengths):
    """conv(state ++ tokens) in float64 before any rounding, and Σ|w·x| of each output."""
    s, terms, at = [], [], 0
    for r, n in enumerate(lengths):
        full = torch.cat([conv[r], qkv[at: at + n]]).double()
        win = full.unfold(0, K, 1)  # [n, C, K]
        s.append((win * w.double().t()).sum(-1))
        terms.append((win.abs() * w.double().abs().t()).sum(-1))
        at += n
    return torch.cat(s), torch.cat(terms)


def _bounds(s, terms, nk, dk):
    """One side's elementwise error of (q, k, v) against float64: the fp32 sum over K taps,
    a bf16 rounding, SiLU (its slope ≤ 1.1, its exp / add / division), a bf16 rounding; q and k
    then divided by their head's norm, whose own error is the error vector's norm, and rounded
    to bf16 (v is stored as it is: its values are bf16 already)."""
    ub, cr = unit_roundoff(BF16), cast_roundings()
    e = gamma(F32, K) * terms
    e = e + cr * ub * (s.abs() + e)
    f = F.silu(s)
    e = SILU_SLOPE * e + (gamma(F32, TRANSCENDENTAL + 2) + cr * ub) * (f.abs() + SILU_SLOPE * e)
    kg = nk * dk
    out = []
    for part in (slice(0, kg), slice(kg, 2 * kg)):
        fh, eh = f[:, part].reshape(-1, nk, dk), e[:, part].reshape(-1, nk, dk)
        n = (fh.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
        en = eh.norm(dim=-1, keepdim=True)
        assert (en < n / 2).all()
        exact = fh / n
        err = (eh + exact.abs() * en) / (n - en) + gamma(F32, dk + TRANSCENDENTAL + 3) * (
            exact.abs() + eh / (n - en))
        out.append((exact, err + cr * ub * (exact.abs() + err)))
    v = f[:, 2 * kg:]
    out.append((v, e[:, 2 * kg:]))
    return out


CASES = [  # nk, nv, dk, dv, rows' lengths: short rows read their conv state in the conv and
    (2, 4, 16, 16, (5, 1, 70)),  # carry part of it into the new one
    (2, 2, 24, 40, (2, 3)),  # a head narrower than its block (masked lanes), v's tail masked
    (2, 4, 32, 32, (130,)),
    pytest.param(16, 32, 128, 128, (40, 9), marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="real GDN heads: 33 s in the interpreter")),
]


@pytest.mark.parametrize("nk, nv, dk, dv, lengths", CASES)
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_prompt_prep_matches_float64(device, nk, nv, dk, dv, lengths, impl):
    if impl == "torch":
        device = "cpu"
    gen = torch.Generator().manual_seed(sum(lengths) + nk * dk)
    C, T, R = 2 * nk * dk + nv * dv, sum(lengths), len(lengths)
    qkv = (torch.randn(T, C, generator=gen) * 2).to(BF16)
    conv = torch.randn(R, K - 1, C, generator=gen).to(BF16)
    w = (torch.randn(K, C, generator=gen) * 0.5).to(BF16)
    a_log, dt_bias = torch.randn(nv, generator=gen) * 0.5, torch.randn(nv, generator=gen)
    # a, b: a spread of a + dt_bias across softplus's threshold and its far-negative tail
    a = (torch.linspace(-30, 30, nv)[None] + torch.randn(T, nv, generator=gen)).to(BF16)
    b = (torch.randn(T, nv, generator=gen) * 3).to(BF16)
    lay = prompt_layout(tuple(lengths), torch.device(device))
    args = [x.to(device) for x in (qkv, b, a, conv, w, a_log, dt_bias)]
    fn = gdn_prompt_prep_triton if impl == "triton" else gdn_prompt_prep_ref
    q, k, v, g, beta, new = (x.cpu() for x in fn(*args, nk, dk, lay))
    P, at = lay.padded, lay.at.cpu()
    real = torch.zeros(P, dtype=torch.bool)
    real[at] = True
    for x, dtype in zip((q, k, v, g, beta), (BF16, BF16, BF16, F32, F32)):
        # padding: exactly zero (no state change in the walk)
        assert x.shape[0] == P and x.dtype == dtype and not x[~real].any()
    s, terms = _exact(qkv, conv, w, lengths)
    for out, (exact, err) in zip((q, k, v), _bounds(s, terms, nk, dk)):
        assert_within(out[at].float().reshape(T, -1), exact.reshape(T, -1), err.reshape(T, -1))
    y = a.double() + dt_bias.double()
    g_exact = -a_log.double().exp() * F.softplus(y)
    g_rel = gamma(F32, 3 * TRANSCENDENTAL + 2 + y.abs().clamp(min=1).max().item())
    assert_within(g[at], g_exact, g_rel * g_exact.abs())
    b_exact = torch.sigmoid(b.double())
    assert_within(beta[at], b_exact, gamma(F32, TRANSCENDENTAL + 2) * b_exact)
    # the new conv states: the last K-1 inputs of state ++ tokens, bit for bit
    at_row = 0
    for r, n in enumerate(lengths):
        full = torch.cat([conv[r], qkv[at_row: at_row + n]])
        assert torch.equal(new[r], full[-(K - 1):])
        at_row += n


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.gdn_prompt import _prompt_prep_kernel as k

types = ["*bf16"] * 5 + ["*fp32"] * 2 + ["*i32", "*i64", "*bf16", "*fp32", "*bf16"] + ["i32"] * 6
consts = dict(NK=16, DK=128, VG=4096, NV=32, K=4, BT=16, BC=128, BLOCK_NV=32, LIBDEVICE=True,
              SLOTS=True)
signature = {**dict(zip(k.arg_names, types)), **dict.fromkeys(consts, "constexpr")}
triton.compile(ASTSource(k, signature, constexprs=consts), target=GPUTarget("cuda", 90, 32),
               options={"num_warps": 4})
"""


def test_the_kernel_compiles_for_the_gpu():
    """Compiled for an H200 (sm_90) at the 35B-A3B shape, no GPU needed: Triton's compiler
    checks what its interpreter does not (a name assigned in both branches of an `if` with
    two types failed on the device, not here). A child process: not under the interpreter."""
    compile_in_child(COMPILE)


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_rows_read_their_conv_state_from_pool_slots(device, impl):
    """With `slots`, row i's conv state is row slots[i] of a state pool: every output, the
    new conv states included, bit for bit those of the same states stacked."""
    if impl == "torch":
        device = "cpu"
    nk, nv, dk, dv, lengths = 2, 4, 16, 16, (5, 1, 70)
    gen = torch.Generator().manual_seed(5)
    C, T = 2 * nk * dk + nv * dv, sum(lengths)
    qkv = (torch.randn(T, C, generator=gen) * 2).to(BF16)
    pool = torch.randn(5, K - 1, C, generator=gen).to(BF16)
    w = (torch.randn(K, C, generator=gen) * 0.5).to(BF16)
    a_log, dt_bias = torch.randn(nv, generator=gen) * 0.5, torch.randn(nv, generator=gen)
    a, b = (torch.randn(T, nv, generator=gen).to(BF16) for _ in range(2))
    lay = prompt_layout(lengths, torch.device(device))
    slots = [3, 0, 4]
    fn = gdn_prompt_prep_triton if impl == "triton" else gdn_prompt_prep_ref
    args = [x.to(device) for x in (qkv, b, a)]
    rest = [x.to(device) for x in (w, a_log, dt_bias)]
    stacked = fn(*args, pool[slots].to(device), *rest, nk, dk, lay)
    index = torch.tensor(slots, dtype=torch.int64, device=device)
    by_slot = fn(*args, pool.to(device), *rest, nk, dk, lay, index)
    for want, got in zip(stacked, by_slot):
        assert torch.equal(got, want)
