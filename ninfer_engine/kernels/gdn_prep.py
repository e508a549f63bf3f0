"""The chunked Gated DeltaNet precompute (`gdn_ref.chunk_prep`) in two Triton launches.

`chunk_prep_triton(q, k, v, g, beta, chunk=64, tf32=False)` returns what `gdn_ref.chunk_prep`
returns — (w, u, qd, ke, p, cd), n — as contiguous fp32 tensors `[nv, n, C, ·]`, `[nv, n]`
(`tiles_dtype=torch.bfloat16`: the first five in bf16).
q and k may hold fewer heads than v (`[T, nk, dk]`, nv a multiple of nk: value head j reads
q/k head j // (nv / nk)), so the caller need not expand them. The last dim of q, k, v must be
contiguous; other strides are free. q, k, v are fp32 or bf16 (the prompt step's), read as they
are and widened in registers.

Two launches: `kernels.gdn_solve` writes each chunk's (I + A)⁻¹ in 16-row blocks, then one
program per (chunk, value head) keeps the chunk in registers and writes each output once (the
torch version's 25 launches moved its `[nv, n, C, C]` intermediates through memory several
times and spent most of its time in `solve_triangular`: bench/results/h200-gdn-chunk.json).
Per program:

* in-chunk decays `e^{γ_i − γ_j}` from segment sums `Σ_{j<s≤i} g_s`, taken as one IEEE fp32
  dot of the masked g rows with a triangular ones matrix (differences of the two cumulative
  sums would lose the bits the reference keeps), or with `tf32` as those differences (their
  error is far below TF32's);
* `U = (I+A)⁻¹ β V`, `W = (I+A)⁻¹ β e^γ K`, `P = (Q Kᵀ) ⊙ decay / √dk`, `Q e^γ / √dk`,
  `K e^{γ_C − γ}` and `e^{γ_C}`.

`tf32=True` runs the K-contracting dots (P, and gdn_solve's) and the products with (I + A)⁻¹
in TF32, as `kernels.gdn_chunk` does its chunk walk; decay dots are always IEEE (their operands
are sums whose TF32 rounding would be an error in an exponent).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gdn_solve import _dot, chunk_inverse


@triton.jit
def chunk_decay(g, C: tl.constexpr, TF32: tl.constexpr):
    """A chunk's gates g [C] (zero past the prompt) → (the in-chunk decays [C, C],
    e^{γ_i − γ_j} for j ≤ i else 0; the cumulative gates γ [C])."""
    rc = tl.arange(0, C)
    below = rc[:, None] >= rc[None, :]  # j ≤ i
    gam = tl.cumsum(g, 0)
    if TF32:  # γ_i − γ_j's fp32 error (|γ|·2⁻²⁴ in an exponent) is far below TF32's 2⁻¹¹
        seg = gam[:, None] - gam[None, :]
    else:  # seg[i, j] = Σ_{j<s≤i} g_s = Σ_s [s ≤ i] g_s · [s > j]
        g_rows = tl.where(below, g[None, :], 0.0)
        after = tl.where(rc[:, None] > rc[None, :], 1.0, 0.0)  # [s, j]: s > j
        seg = tl.dot(g_rows, after, input_precision="ieee")
    return tl.where(below, tl.exp(tl.where(below, seg, 0.0)), 0.0), gam


@triton.jit
def chunk_carry(g, C: tl.constexpr):
    """A chunk's gates g [C] → (e^{γ_C − γ_j} [C], the weight of each row's key in the state
    the chunk leaves; e^{γ_C}, the decay of the state it found)."""
    rc = tl.arange(0, C)
    tail = tl.cumsum(g, 0, reverse=True) - g  # γ_C − γ_j = Σ_{s>j} g_s
    last = tl.sum(tl.where(rc == C - 1, tl.exp(tl.cumsum(g, 0)), 0.0), 0)
    return tl.exp(tail), last


# one compile for every step shape: T and n would specialise on == 1 and % 16 == 0
@triton.jit(do_not_specialize=["T", "n"])
def _gdn_prep_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, inv_ptr, w_ptr, u_ptr, qd_ptr, ke_ptr,
                     p_ptr, cd_ptr, T, n, sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, scale,
                     GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr,
                     BK: tl.constexpr, BV: tl.constexpr, BLOCK: tl.constexpr,
                     TF32: tl.constexpr, WALK: tl.constexpr):
    # WALK: also the tiles `gdn_chunk`'s walk reads (qd, ke, p, cd); without it only w and u,
    # for `gdn_split`, whose kernels derive the rest from q, k and g themselves
    c = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // GROUP
    rc = tl.arange(0, C)
    t = c * C + rc
    tmask = t < T  # padded rows load as zeros: k = 0, β = 0, g = 0 leave the state alone
    g = tl.load(g_ptr + t * sgt + h * sgh, mask=tmask, other=0.0)
    beta = tl.load(b_ptr + t * sbt + h * sbh, mask=tmask, other=0.0)
    eg = tl.exp(tl.cumsum(g, 0))

    # (I + A)⁻¹ from `kernels.gdn_solve`, which leaves the blocks above the diagonal unwritten
    inv = tl.load(inv_ptr + ((h * n + c) * C + rc[:, None]) * C + rc[None, :],
                  mask=rc[:, None] // 16 >= rc[None, :] // 16, other=0.0)
    out = h * n + c  # this program's [C, ·] tile in the [nv, n, C, ·] outputs
    if WALK:
        decay, _ = chunk_decay(g, C, TF32)
        carry, last = chunk_carry(g, C)
    p = tl.zeros((C, C), dtype=tl.float32)
    for d0 in tl.static_range(0, BK, BLOCK):  # dk in BLOCK-wide column blocks: fewer registers
        rk = d0 + tl.arange(0, BLOCK)
        km = (rk < DK)[None, :]
        k = tl.load(k_ptr + t[:, None] * skt + hk * skh + rk[None, :], mask=tmask[:, None] & km,
                    other=0.0).to(tl.float32)
        ko = (out * C + rc[:, None]) * DK + rk[None, :]
        tl.store(w_ptr + ko, _dot(inv, k * beta[:, None] * eg[:, None], TF32).to(
            w_ptr.dtype.element_ty), mask=km)
        if WALK:
            q = tl.load(q_ptr + t[:, None] * sqt + hk * sqh + rk[None, :],
                        mask=tmask[:, None] & km, other=0.0).to(tl.float32)
            p += _dot(q, tl.trans(k), TF32)
            tl.store(qd_ptr + ko, (q * (eg * scale)[:, None]).to(qd_ptr.dtype.element_ty),
                     mask=km)
            tl.store(ke_ptr + ko, (k * carry[:, None]).to(ke_ptr.dtype.element_ty), mask=km)
    if WALK:
        tl.store(p_ptr + (out * C + rc[:, None]) * C + rc[None, :],
                 (p * decay * scale).to(p_ptr.dtype.element_ty))
        tl.store(cd_ptr + out, last)
    for d0 in tl.static_range(0, BV, BLOCK):
        rv = d0 + tl.arange(0, BLOCK)
        vm = (rv < DV)[None, :]
        v = tl.load(v_ptr + t[:, None] * svt + h * svh + rv[None, :], mask=tmask[:, None] & vm,
                    other=0.0).to(tl.float32)
        tl.store(u_ptr + (out * C + rc[:, None]) * DV + rv[None, :],
                 _dot(inv, v * beta[:, None], TF32).to(u_ptr.dtype.element_ty), mask=vm)


def chunk_prep_triton(q, k, v, g, beta, chunk: int = 64, *, tf32: bool = False,
                      num_warps: int = 4, solve_warps: int = 1, block: int = 64,
                      walk: bool = True, tiles_dtype: torch.dtype = torch.float32):
    """Triton path of `gdn_ref.chunk_prep` (see the module docstring). `walk=False`: only
    (w, u), n — what `kernels.gdn_split`'s walk reads. `tiles_dtype` torch.bfloat16: w, u, qd,
    ke and p stored in bf16 (each rounded once from its fp32 value; cd stays fp32), half the
    bytes this launch writes and `gdn_chunk`'s walk reads, as FLA stores them."""
    assert walk or tiles_dtype == torch.float32, "the split walk reads fp32 tiles"
    T, nk, dk = k.shape
    nv, dv = v.shape[1], v.shape[2]
    assert q.shape == k.shape and v.shape[0] == T and nv % nk == 0
    assert g.shape == (T, nv) and beta.shape == (T, nv)
    # q, k, v fp32 or bf16 (the prompt step's, `gdn_prompt`), read as they are
    assert all(x.dtype in (torch.float32, torch.bfloat16) for x in (q, k, v))
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    g, beta = g.float(), beta.float()
    n = triton.cdiv(T, chunk)
    dev = v.device
    w = torch.empty(nv, n, chunk, dk, dtype=tiles_dtype, device=dev)
    u = torch.empty(nv, n, chunk, dv, dtype=tiles_dtype, device=dev)
    if walk:
        qd, ke = torch.empty_like(w), torch.empty_like(w)
        p = torch.empty(nv, n, chunk, chunk, dtype=tiles_dtype, device=dev)
        cd = torch.empty(nv, n, dtype=torch.float32, device=dev)
    else:  # unread pointers
        qd = ke = p = cd = w
    assert p.numel() < 2**31 and w.numel() < 2**31 and u.numel() < 2**31, "int32 offsets"
    inv = chunk_inverse(k, g, beta, chunk, tf32=tf32, num_warps=solve_warps)
    bk, bv = (max(16, triton.next_power_of_2(d)) for d in (dk, dv))
    _gdn_prep_kernel[(n, nv)](
        q, k, v, g, beta, inv, w, u, qd, ke, p, cd, T, n, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1), beta.stride(0),
        beta.stride(1), dk**-0.5, GROUP=nv // nk, DK=dk, DV=dv, C=chunk,
        BK=bk, BV=bv, BLOCK=min(block, bk, bv), TF32=tf32, WALK=walk, num_warps=num_warps)
    return ((w, u, qd, ke, p, cd) if walk else (w, u)), n
