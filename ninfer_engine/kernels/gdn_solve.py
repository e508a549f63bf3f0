"""(I + A)⁻¹ of every chunk of a chunked Gated DeltaNet prefill, in 16-row blocks.

`chunk_inverse(k, g, beta, chunk, tf32)` returns `[nv, n, C, C]` fp32: for chunk c of value
head h, the inverse of the unit lower triangular `I + A`, `A = tril(β K Kᵀ ⊙ e^{γᵢ−γⱼ}, −1)`
(`gdn_ref.chunk_prep`'s matrix), whose product with β V and β e^γ K gives the chunk's U and W.
Only the blocks on and below the diagonal are written: a reader masks the 16 × 16 blocks above
it (`kernels.gdn_prep` does). k `[T, nk, dk]` (value head j reads k head j // (nv / nk)),
g / beta `[T, nv]`; C is 16, 32 or 64.

FLA's fused `kkt + solve_tril` design (flash-linear-attention, `chunk_gated_delta_rule_fwd_kkt_
solve_kernel`, MIT): the chunk's 16 × 16 blocks of A, each diagonal block inverted by forward
substitution in vector sums over its 16 rows, then the blocks below merged by block forward
substitution (`X_ij = −X_ii Σ_{j≤m<i} A_im X_mj`, twelve 16 × 16 dots). Against inverting the
whole 64 × 64 tile with full-size dots (this kernel's predecessor inside `gdn_prep`), it does a
tenth of the arithmetic. The decays come from segment sums of g, never from differences of
two cumulative sums that both hold a large gate (whose rounding would be an error in an
exponent): a diagonal block's by one IEEE dot with a triangular ones matrix, a block below it's
as the sum of the column block's tail, the whole blocks between and the row block's head (all
≤ 0: no cancellation).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

B = tl.constexpr(16)  # rows of a block


@triton.jit
def _dot(a, b, TF32: tl.constexpr):  # the GDN prefill kernels' dot: TF32 or IEEE fp32
    if TF32:
        c = tl.dot(a, b, input_precision="tf32")
    else:
        c = tl.dot(a, b, input_precision="ieee")
    return c


@triton.jit
def _gates(g_ptr, b_ptr, t, tm, h, sgt, sgh, sbt, sbh):
    g = tl.load(g_ptr + t * sgt + h * sgh, mask=tm, other=0.0)
    beta = tl.load(b_ptr + t * sbt + h * sbh, mask=tm, other=0.0)
    head = tl.cumsum(g, 0)  # Σ_{s ≤ i} g_s in the block
    tail = tl.cumsum(g, 0, reverse=True) - g  # Σ_{s > j} g_s in the block
    return g, beta, head, tail, tl.sum(g, 0)


@triton.jit
def _diagonal(kk, g, beta):
    """A's diagonal block from its K Kᵀ: β_i·(k_i·k_j)·e^{Σ_{j<s≤i} g_s} for j < i, else 0."""
    r = tl.arange(0, B)
    below = r[:, None] > r[None, :]
    g_rows = tl.where(r[:, None] >= r[None, :], g[None, :], 0.0)  # [i, s]: s ≤ i
    after = tl.where(below, 1.0, 0.0)  # [s, j]: s > j
    seg = tl.dot(g_rows, after, input_precision="ieee")
    return tl.where(below, kk * tl.exp(tl.where(below, seg, 0.0)), 0.0) * beta[:, None]


@triton.jit
def _below(kk, beta_i, head_i, tail_j, between):
    """A block below the diagonal: β_i·(k_i·k_j)·e^{tail_j + between + head_i}."""
    return kk * tl.exp((tail_j[None, :] + between) + head_i[:, None]) * beta_i[:, None]


@triton.jit
def _inverse(a):
    """(I + a)⁻¹ of a strictly lower triangular 16 × 16 block, row by row (FLA's solve_tril)."""
    r = tl.arange(0, B)
    x = -a  # (I + a)⁻¹ − I; rows 0 and 1 are final
    for i in range(2, B):
        row = tl.where(r < i, tl.sum(tl.where((r == i)[:, None], -a, 0.0), 0), 0.0)
        row = row + tl.sum(row[:, None] * x, 0)
        x = tl.where((r == i)[:, None], row, x)
    return x + tl.where(r[:, None] == r[None, :], 1.0, 0.0)


@triton.jit
def _store(ptr, x, rows, cols, C: tl.constexpr):
    tl.store(ptr + rows[:, None] * C + cols[None, :], x)


# one compile for every step shape: T and n would specialise on == 1 and % 16 == 0
@triton.jit(do_not_specialize=["T", "n"])
def _gdn_solve_kernel(k_ptr, g_ptr, b_ptr, inv_ptr, T, n, skt, skh, sgt, sgh, sbt, sbh,
                      GROUP: tl.constexpr, DK: tl.constexpr, C: tl.constexpr,
                      BK: tl.constexpr, TF32: tl.constexpr):
    c = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // GROUP
    NB: tl.constexpr = C // B
    r = tl.arange(0, B)
    rk = tl.arange(0, BK)
    # the chunk's blocks of rows (NB of them: a chunk of 16 or 32 rows computes only its own);
    # rows past T load as zeros
    t0 = c * C + r
    t1, t2, t3 = t0 + B, t0 + 2 * B, t0 + 3 * B
    g0, b0, head0, tail0, s0 = _gates(g_ptr, b_ptr, t0, t0 < T, h, sgt, sgh, sbt, sbh)
    if NB > 1:
        g1, b1, head1, tail1, s1 = _gates(g_ptr, b_ptr, t1, t1 < T, h, sgt, sgh, sbt, sbh)
    if NB > 2:
        g2, b2, head2, tail2, s2 = _gates(g_ptr, b_ptr, t2, t2 < T, h, sgt, sgh, sbt, sbh)
    if NB > 3:
        g3, b3, head3, tail3, s3 = _gates(g_ptr, b_ptr, t3, t3 < T, h, sgt, sgh, sbt, sbh)

    z = tl.zeros((B, B), dtype=tl.float32)
    a00, a11, a22, a33, a10, a20, a21, a30, a31, a32 = z, z, z, z, z, z, z, z, z, z
    for d0 in range(0, DK, BK):  # K Kᵀ's blocks on and below the diagonal
        dm = (d0 + rk < DK)[None, :]
        kp = k_ptr + hk * skh + d0 + rk[None, :]
        k0 = tl.load(kp + t0[:, None] * skt, mask=(t0 < T)[:, None] & dm,
                     other=0.0).to(tl.float32)
        a00 += _dot(k0, tl.trans(k0), TF32)
        if NB > 1:
            k1 = tl.load(kp + t1[:, None] * skt, mask=(t1 < T)[:, None] & dm,
                         other=0.0).to(tl.float32)
            a11 += _dot(k1, tl.trans(k1), TF32)
            a10 += _dot(k1, tl.trans(k0), TF32)
        if NB > 2:
            k2 = tl.load(kp + t2[:, None] * skt, mask=(t2 < T)[:, None] & dm,
                         other=0.0).to(tl.float32)
            a22 += _dot(k2, tl.trans(k2), TF32)
            a20 += _dot(k2, tl.trans(k0), TF32)
            a21 += _dot(k2, tl.trans(k1), TF32)
        if NB > 3:
            k3 = tl.load(kp + t3[:, None] * skt, mask=(t3 < T)[:, None] & dm,
                         other=0.0).to(tl.float32)
            a33 += _dot(k3, tl.trans(k3), TF32)
            a30 += _dot(k3, tl.trans(k0), TF32)
            a31 += _dot(k3, tl.trans(k1), TF32)
            a32 += _dot(k3, tl.trans(k2), TF32)
    # each diagonal block's inverse, then the blocks below it by block forward substitution:
    # X_ij = −X_ii Σ_{j≤m<i} A_im X_mj
    out = inv_ptr + (h * n + c) * C * C  # this program's [C, C] tile of [nv, n, C, C]
    x00 = _inverse(_diagonal(a00, g0, b0))
    _store(out, x00, r, r, C)
    if NB > 1:
        x11 = _inverse(_diagonal(a11, g1, b1))
        a10 = _below(a10, b1, head1, tail0, 0.0)
        x10 = -_dot(_dot(x11, a10, TF32), x00, TF32)
        _store(out, x10, r + B, r, C)
        _store(out, x11, r + B, r + B, C)
    if NB > 2:
        x22 = _inverse(_diagonal(a22, g2, b2))
        a20 = _below(a20, b2, head2, tail0, s1)
        a21 = _below(a21, b2, head2, tail1, 0.0)
        x21 = -_dot(_dot(x22, a21, TF32), x11, TF32)
        x20 = -_dot(x22, _dot(a20, x00, TF32) + _dot(a21, x10, TF32), TF32)
        _store(out, x20, r + 2 * B, r, C)
        _store(out, x21, r + 2 * B, r + B, C)
        _store(out, x22, r + 2 * B, r + 2 * B, C)
    if NB > 3:
        x33 = _inverse(_diagonal(a33, g3, b3))
        a30 = _below(a30, b3, head3, tail0, s1 + s2)
        a31 = _below(a31, b3, head3, tail1, s2)
        a32 = _below(a32, b3, head3, tail2, 0.0)
        x32 = -_dot(_dot(x33, a32, TF32), x22, TF32)
        x31 = -_dot(x33, _dot(a31, x11, TF32) + _dot(a32, x21, TF32), TF32)
        x30 = -_dot(x33, _dot(a30, x00, TF32) + _dot(a31, x10, TF32) + _dot(a32, x20, TF32),
                    TF32)
        _store(out, x30, r + 3 * B, r, C)
        _store(out, x31, r + 3 * B, r + B, C)
        _store(out, x32, r + 3 * B, r + 2 * B, C)
        _store(out, x33, r + 3 * B, r + 3 * B, C)


def chunk_inverse(k, g, beta, chunk: int = 64, *, tf32: bool = False,
                  num_warps: int = 1) -> torch.Tensor:
    """[nv, n, C, C] fp32, the blocks above the diagonal unwritten (see the module
    docstring). k fp32 or bf16 with a contiguous last dim; g, beta fp32."""
    T, nk, dk = k.shape
    nv = g.shape[1]
    assert chunk in (16, 32, 64), "chunk must be 16, 32 or 64"
    assert k.dtype in (torch.float32, torch.bfloat16) and k.stride(-1) == 1
    assert g.dtype == beta.dtype == torch.float32
    assert g.shape == beta.shape == (T, nv) and nv % nk == 0
    n = triton.cdiv(T, chunk)
    inv = torch.empty(nv, n, chunk, chunk, device=k.device)
    assert inv.numel() < 2**31, "int32 offsets"
    _gdn_solve_kernel[(n, nv)](
        k, g, beta, inv, T, n, k.stride(0), k.stride(1), g.stride(0), g.stride(1),
        beta.stride(0), beta.stride(1), GROUP=nv // nk, DK=dk, C=chunk,
        BK=max(16, min(64, triton.next_power_of_2(dk))), TF32=tf32, num_warps=num_warps)
    return inv
