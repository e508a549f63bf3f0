import pytest
import torch

from ninfer_engine.kernels._dispatch import interpreting, use_triton
from ninfer_engine.kernels.qk_norm_rope import (
    qk_norm_rope,
    qk_norm_rope_ref,
    qk_norm_rope_triton,
)
from ninfer_engine.kernels.rmsnorm import rms_norm_ref, rms_norm_triton
from ninfer_engine.kernels.rotary import inv_freq, rope_triton

from tests.tolerance import CAST, TRANSCENDENTAL, bound

from .conftest import rel_err

EPS, THETA = 1e-6, 1e7

# (B, nq, nkv, d, rd, positions): B = 1 and 3, d = 16/32/64, rd = d/4 and d, positions 0 and 40000
CASES = [
    (1, 4, 2, 16, 4, [40000]),
    (1, 2, 1, 32, 32, [0]),
    (3, 4, 2, 32, 8, [0, 7, 40000]),
    (3, 2, 2, 64, 64, [40000, 0, 123]),
    (3, 3, 1, 64, 16, [5, 40000, 0]),
    (2, 16, 2, 256, 64, [1023, 8191]),  # the 35B-A3B's attention heads (the 27B's: 24, 4)
]


def _inputs(device, B, nq, nkv, d, positions, seed, pad=0):
    """qkv [B, W] bf16 (a column slice of a [B, W + 2·pad] buffer when pad > 0), distinct
    q/k norm weights (so swapping them shows), positions [B] int64."""
    g = torch.Generator().manual_seed(seed)
    W = 2 * (nq + nkv) * d
    buf = (torch.randn(B, W + 2 * pad, generator=g) * 2).bfloat16().to(device)
    qkv = buf[:, pad : pad + W]
    q_norm = (torch.randn(d, generator=g) * 0.5).bfloat16().to(device)
    k_norm = (torch.randn(d, generator=g) * 0.5).bfloat16().to(device)
    pos = torch.tensor(positions, dtype=torch.int64).to(device)
    return buf, qkv, q_norm, k_norm, pos


def _unfused(qkv, nq, nkv, d, q_norm, k_norm, eps, pos, rd, theta):
    """HybridStep._attn's four launches."""
    B = qkv.shape[0]
    q, _, k, _ = qkv.split([nq * d, nq * d, nkv * d, nkv * d], -1)
    q, _ = rms_norm_triton(q.reshape(B * nq, d), q_norm, eps, None, True)
    k, _ = rms_norm_triton(k.reshape(B * nkv, d), k_norm, eps, None, True)
    return (rope_triton(q.view(B, nq, d), pos, rd, theta),
            rope_triton(k.view(B, nkv, d), pos, rd, theta))


def _normed(qkv, nq, nkv, d, q_norm, k_norm, norm):
    """The normed (not rotated) q [B, nq, d] and k [B, nkv, d] by `norm` (ref or triton)."""
    B = qkv.shape[0]
    q = qkv[:, : nq * d].reshape(B * nq, d)
    k = qkv[:, 2 * nq * d : (2 * nq + nkv) * d].reshape(B * nkv, d)
    return (norm(q, q_norm, EPS, None, True)[0].view(B, nq, d),
            norm(k, k_norm, EPS, None, True)[0].view(B, nkv, d))


@pytest.mark.parametrize("B, nq, nkv, d, rd, positions", CASES)
def test_bit_identical_to_the_unfused_launches(device, B, nq, nkv, d, rd, positions):
    # the same kernels' arithmetic in one launch: equal in every element, on GPU and interpreter
    _, qkv, qn, kn, pos = _inputs(device, B, nq, nkv, d, positions, seed=1)
    q, k = qk_norm_rope_triton(qkv, nq, nkv, d, qn, kn, EPS, pos, rd, THETA)
    q_u, k_u = _unfused(qkv, nq, nkv, d, qn, kn, EPS, pos, rd, THETA)
    assert q.shape == (B, nq, d) and k.shape == (B, nkv, d)
    assert q.dtype == k.dtype == torch.bfloat16 and q.is_contiguous() and k.is_contiguous()
    assert torch.equal(q.cpu(), q_u.cpu())
    assert torch.equal(k.cpu(), k_u.cpu())


def _ref_rounding_as(qkv, nq, nkv, d, q_norm, k_norm, pos, rd, truncate):
    """qk_norm_rope_ref's arithmetic with its two fp32 -> bf16 roundings done as a backend
    does them: to nearest (torch, GPUs) or, with `truncate`, toward zero (the interpreter)."""
    def rnd(x):
        if truncate:
            return (x.contiguous().view(torch.int32) & -65536).view(torch.float32)
        return x.bfloat16().float()

    B, half = qkv.shape[0], rd // 2
    ang = pos.float()[:, None] * inv_freq(rd, THETA, qkv.device)
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    out = []
    for col, n, w in ((0, nq, q_norm), (2 * nq * d, nkv, k_norm)):
        x = qkv[:, col : col + n * d].float().reshape(B, n, d)
        y = rnd(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (w.float() + 1.0))
        a, b = y[..., :half], y[..., half:rd]
        out.append(rnd(torch.cat([a * cos - b * sin, b * cos + a * sin, y[..., rd:]], -1)))
    return [o.bfloat16() for o in out]


@pytest.mark.parametrize("B, nq, nkv, d, rd, positions", CASES)
def test_matches_reference(device, B, nq, nkv, d, rd, positions):
    _, qkv, qn, kn, pos = _inputs(device, B, nq, nkv, d, positions, seed=2)
    out = qk_norm_rope_triton(qkv, nq, nkv, d, qn, kn, EPS, pos, rd, THETA)
    ref = qk_norm_rope_ref(qkv, nq, nkv, d, qn, kn, EPS, pos, rd, THETA)
    # the interpreter truncates fp32 -> bf16 where torch and GPUs round to nearest: compare
    # bit for bit with the reference's arithmetic rounded the interpreter's way
    exact = _ref_rounding_as(qkv, nq, nkv, d, qn, kn, pos, rd, truncate=interpreting())
    nearest = _ref_rounding_as(qkv, nq, nkv, d, qn, kn, pos, rd, truncate=False)
    for o, r, e, n in zip(out, ref, exact, nearest):
        assert torch.equal(n.cpu(), r.cpu())  # the replica is the reference
        o, r, e = o.float().cpu(), r.float().cpu(), e.float().cpu()
        # the fp32 chain (sum of squares, rsqrt, the weight, cos / sin, products) with two
        # casts each side
        assert rel_err(o, r) < bound(torch.bfloat16, d + 2 * TRANSCENDENTAL + 6,
                                     roundings=2 * CAST)
        # two bf16 roundings (three ulps apart at worst when truncating): within four ulps of
        # the head's largest value
        assert ((o - r).abs() <= 2**-5 * r.abs().amax(-1, keepdim=True)).all()
        # equal but where rsqrt vs 1/sqrt, the sum order or cos/sin move a rounding boundary
        assert (o == e).float().mean() >= 0.99


@pytest.mark.parametrize("B, nq, nkv, d, rd, positions", [c for c in CASES if c[4] < c[3]])
def test_unrotated_dims_are_the_normed_values(device, B, nq, nkv, d, rd, positions):
    _, qkv, qn, kn, pos = _inputs(device, B, nq, nkv, d, positions, seed=3)
    out = qk_norm_rope_triton(qkv, nq, nkv, d, qn, kn, EPS, pos, rd, THETA)
    normed = _normed(qkv, nq, nkv, d, qn, kn, rms_norm_triton)
    normed_ref = _normed(qkv, nq, nkv, d, qn, kn, rms_norm_ref)
    for o, n, n_ref in zip(out, normed, normed_ref):
        assert torch.equal(o[..., rd:].cpu(), n[..., rd:].cpu())
        # the norm alone, one cast each side
        assert rel_err(o[..., rd:], n_ref[..., rd:]) < bound(
            torch.bfloat16, d + TRANSCENDENTAL + 3, roundings=CAST)


@pytest.mark.parametrize("B, nq, nkv, d, rd, positions", CASES)
def test_position_zero_is_the_identity_rotation(device, B, nq, nkv, d, rd, positions):
    # cos 0 = 1, sin 0 = 0: rows at position 0 are exactly the normed values, others are not
    _, qkv, qn, kn, pos = _inputs(device, B, nq, nkv, d, positions, seed=4)
    out = qk_norm_rope_triton(qkv, nq, nkv, d, qn, kn, EPS, pos, rd, THETA)
    normed = _normed(qkv, nq, nkv, d, qn, kn, rms_norm_triton)
    for o, n in zip(out, normed):
        for b, p in enumerate(positions):
            same = torch.equal(o[b, :, :rd].cpu(), n[b, :, :rd].cpu())
            assert same if p == 0 else not same


def test_strided_rows_and_input_untouched(device):
    # B > 1 rows of a wider buffer: the kernel reads the row stride and writes nothing into it
    B, nq, nkv, d, rd, positions = 3, 4, 2, 32, 8, [40000, 0, 9]
    buf, qkv, qn, kn, pos = _inputs(device, B, nq, nkv, d, positions, seed=5, pad=8)
    assert qkv.stride(0) != qkv.shape[1] and qkv.storage_offset() == 8
    before = buf.clone()
    q, k = qk_norm_rope_triton(qkv, nq, nkv, d, qn, kn, EPS, pos, rd, THETA)
    assert torch.equal(buf.cpu(), before.cpu())  # gate and v columns, and the padding
    q_c, k_c = qk_norm_rope_triton(qkv.contiguous(), nq, nkv, d, qn, kn, EPS, pos, rd, THETA)
    assert torch.equal(q.cpu(), q_c.cpu()) and torch.equal(k.cpu(), k_c.cpu())
    q_u, k_u = _unfused(qkv, nq, nkv, d, qn, kn, EPS, pos, rd, THETA)
    assert torch.equal(q.cpu(), q_u.cpu()) and torch.equal(k.cpu(), k_u.cpu())


def test_dispatch_and_shape_checks(device):
    _, qkv, qn, kn, pos = _inputs(device, 1, 2, 1, 16, [3], seed=6)
    want = (qk_norm_rope_triton if use_triton(qkv) else qk_norm_rope_ref)(
        qkv, 2, 1, 16, qn, kn, EPS, pos, 4, THETA)
    got = qk_norm_rope(qkv, 2, 1, 16, qn, kn, EPS, pos, 4, THETA)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(got, want))
    with pytest.raises(AssertionError):  # d = 24 is not a power of two
        qk_norm_rope_triton(torch.zeros(1, 144, dtype=torch.bfloat16, device=device), 2, 1, 24,
                            torch.zeros(24), torch.zeros(24), EPS, pos, 8, THETA)


@pytest.mark.parametrize("B, nq, nkv, d, rd, positions", CASES[2:])
def test_kv_rows_written_in_place(device, B, nq, nkv, d, rd, positions):
    """With `kv_rows`, the rotated k and the v columns land in rows `slots` of the pool, the
    same bits as the k output and the v view the unfused write copies; q is unchanged; the
    other rows are not touched."""
    _, qkv, q_norm, k_norm, pos = _inputs(device, B, nq, nkv, d, positions, seed=11)
    args = (qkv, nq, nkv, d, q_norm, k_norm, EPS, pos, rd, THETA)
    q, k = qk_norm_rope_triton(*args)
    pool = [torch.full((2 * B + 5, nkv, d), 7.0, dtype=qkv.dtype, device=device)
            for _ in range(2)]
    slots = torch.randperm(2 * B + 5)[:B].to(device)
    q2, k2 = qk_norm_rope_triton(*args, kv_rows=pool, slots=slots)
    assert k2 is None and torch.equal(q2, q)
    v = qkv[:, 2 * nq * d + nkv * d:].reshape(B, nkv, d)
    assert torch.equal(pool[0][slots], k) and torch.equal(pool[1][slots], v)
    others = torch.ones(2 * B + 5, dtype=torch.bool)
    others[slots.cpu()] = False
    assert all((t[others.to(device)] == 7.0).all() for t in pool)
