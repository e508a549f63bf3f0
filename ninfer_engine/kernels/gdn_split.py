"""The chunked Gated DeltaNet prefill with its chunk walk split in two: the state recurrence
alone in order, the output in parallel over the chunks (flash-linear-attention's forward:
`chunk_gated_delta_rule_fwd_h`, then `chunk_fwd_o`, MIT).

`gdn_chunk`'s walk computes each chunk's output inside the sequential loop (four `tl.dot`s a
chunk, two of them off the state's chain) and reads five fp32 tiles a chunk that the precompute
wrote (w, u, qd, ke, p). Here:

* `chunk_prep_triton(..., walk=False)` writes only W and U;
* `_state_walk_kernel` (grid (row ×) head × value block, in order over the chunks):
  `V' = U − W S`, stored, and S as the chunk found it, stored, then
  `S ← e^{γ_C} S + (K e^{γ_C − γ})ᵀ V'` — two dots a chunk, the weights read from k and g;
* `_chunk_out_kernel` (grid chunk × head × value block, every chunk at once):
  `O = (Q e^γ / √dk) S_c + ((Q Kᵀ) ⊙ decay / √dk) V'`; with a `GatedNorm` (a whole head a
  program) also `gdn_fused.gdn_gated_norm`'s `norm · rmsnorm(O) · silu(z)`, stored in bf16 at
  the rows' tokens, so neither the fp32 O nor the norm's launch remains.

Same arithmetic as `gdn_chunk` (the same tiles, decays and weights, made by the same helpers);
the output's sums are taken in another order (q·S and q·kᵀ over dk in `block`-wide column
blocks). Costs: the stored states, fp32 [nv, n, dk, dv] (twice a chunk's k tile a head), and
V' [n·C, nv, dv] instead of qd, ke and p. The contracts are `gdn_chunk`'s: `split_walk` is its
`_walk` with q, k, g beside the tiles. Registers: bench/results/sm90-prompt-kernel-resources.md.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._dispatch import interpreting
from .gdn_chunk import walk_program, walk_setup
from .gdn_fused_kernels import gated_rms
from .gdn_prep import chunk_carry, chunk_decay
from .gdn_solve import _dot


@triton.jit
def _get(ptr, rows, cols, stride, NR, NC: tl.constexpr, EVEN: tl.constexpr):
    """The tile ptr[rows, cols] of rows `stride` apart (rows < NR, cols < NC; EVEN: all)."""
    if EVEN:
        x = tl.load(ptr + rows[:, None] * stride + cols[None, :])
    else:
        x = tl.load(ptr + rows[:, None] * stride + cols[None, :],
                    mask=(rows < NR)[:, None] & (cols < NC)[None, :], other=0.0)
    return x


@triton.jit
def _put(ptr, x, rows, cols, stride, NR, NC: tl.constexpr, EVEN: tl.constexpr):
    if EVEN:
        tl.store(ptr + rows[:, None] * stride + cols[None, :], x)
    else:
        tl.store(ptr + rows[:, None] * stride + cols[None, :], x,
                 mask=(rows < NR)[:, None] & (cols < NC)[None, :])


# one compile for every step shape (as `gdn_chunk`'s walk)
@triton.jit(do_not_specialize=["n", "T"])
def _state_walk_kernel(w_ptr, u_ptr, k_ptr, g_ptr, s_ptr, s_out_ptr, hs_ptr, vn_ptr, n, T,
                       first_ptr, slot_ptr, n_all, skt, skh, sgt, sgh,
                       NV: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr,
                       DV: tl.constexpr, C: tl.constexpr, KB: tl.constexpr, TWO: tl.constexpr,
                       BV: tl.constexpr, EVEN: tl.constexpr, TF32: tl.constexpr,
                       ROWS: tl.constexpr, SLOTS: tl.constexpr):
    # the state tile [dk, BV] is held as rows 0..KB-1 and (TWO) KB..2KB-1, two register
    # tensors, and w / k are read in the same column halves (FLA's b_h1, b_h2), with every
    # offset from compile-time strides: fewer registers spilled
    # (bench/results/sm90-prompt-kernel-resources.md)
    h, c0, n, at = walk_program(first_ptr, slot_ptr, n, NV, ROWS, SLOTS)
    vb = tl.program_id(1)
    s_ptr += at * NV * DK * DV
    s_out_ptr += at * NV * DK * DV
    hk = h // GROUP
    rc = tl.arange(0, C)
    r0 = tl.arange(0, KB)
    r1 = KB + r0
    rv = vb * BV + tl.arange(0, BV)
    s_ptr += h * DK * DV
    s0 = _get(s_ptr, r0, rv, DV, DK, DV, EVEN)  # fp32, lives in registers
    if TWO:
        s1 = _get(s_ptr, r1, rv, DV, DK, DV, EVEN)

    w_ptr += (h * n_all + c0) * C * DK  # chunk c0 of [nv, n, C, dk]
    u_ptr += (h * n_all + c0) * C * DV
    hs_ptr += (h * n_all + c0) * DK * DV  # chunk c0's state of [nv, n, dk, dv]
    vn_ptr += c0 * C * NV * DV + h * DV  # chunk c0's rows of [n·C, nv, dv]
    for i in range(n):
        _put(hs_ptr + i * DK * DV, s0, r0, rv, DV, DK, DV, EVEN)
        w = _get(w_ptr + i * C * DK, rc, r0, DK, C, DK, EVEN)
        v_corr = _get(u_ptr + i * C * DV, rc, rv, DV, C, DV, EVEN) - _dot(w, s0, TF32)
        if TWO:
            _put(hs_ptr + i * DK * DV, s1, r1, rv, DV, DK, DV, EVEN)
            w = _get(w_ptr + i * C * DK, rc, r1, DK, C, DK, EVEN)
            v_corr -= _dot(w, s1, TF32)
        _put(vn_ptr + i * C * NV * DV, v_corr, rc, rv, NV * DV, C, DV, EVEN)
        t = (c0 + i) * C + rc
        tm = t < T  # past the prompt: k = 0 and g = 0 leave the state alone
        carry, last = chunk_carry(tl.load(g_ptr + t * sgt + h * sgh, mask=tm, other=0.0), C)
        k = _get(k_ptr + hk * skh, t, r0, skt, T, DK, False)
        s0 = s0 * last + _dot(tl.trans(k * carry[:, None]), v_corr, TF32)
        if TWO:
            k = _get(k_ptr + hk * skh, t, r1, skt, T, DK, False)
            s1 = s1 * last + _dot(tl.trans(k * carry[:, None]), v_corr, TF32)
    s_out_ptr += h * DK * DV
    _put(s_out_ptr, s0, r0, rv, DV, DK, DV, EVEN)
    if TWO:
        _put(s_out_ptr, s1, r1, rv, DV, DK, DV, EVEN)


@triton.jit(do_not_specialize=["T", "n_all"])
def _chunk_out_kernel(q_ptr, k_ptr, g_ptr, hs_ptr, vn_ptr, o_ptr, tok_ptr, z_ptr, w_ptr, T,
                      n_all, sqt, sqh, skt, skh, sgt, sgh, szt, scale, eps,
                      NV: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr,
                      DV: tl.constexpr, C: tl.constexpr, BV: tl.constexpr,
                      BLOCK: tl.constexpr, EVEN: tl.constexpr, TF32: tl.constexpr,
                      GATED: tl.constexpr, ROUND_PROD: tl.constexpr, LIBDEVICE: tl.constexpr):
    # GATED (a whole head a program: BV ≥ DV): `gdn_fused.gdn_gated_norm` of the output
    # rows too, stored in bf16 at their tokens (tok: each padded position's, −1 for padding)
    c = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    hk = h // GROUP
    rc = tl.arange(0, C)
    rv = vb * BV + tl.arange(0, BV)
    t = c * C + rc
    g = tl.load(g_ptr + t * sgt + h * sgh, mask=t < T, other=0.0)
    decay, gam = chunk_decay(g, C, TF32)
    qs = tl.exp(gam) * scale
    p = tl.zeros((C, C), dtype=tl.float32)
    o = tl.zeros((C, BV), dtype=tl.float32)
    hs_ptr += (h * n_all + c) * DK * DV  # the state chunk c found
    for d0 in tl.static_range(0, DK, BLOCK):  # dk in BLOCK-wide column blocks: fewer registers
        rk = d0 + tl.arange(0, BLOCK)
        q = _get(q_ptr + hk * sqh, t, rk, sqt, T, DK, False)
        k = _get(k_ptr + hk * skh, t, rk, skt, T, DK, False)
        p += _dot(q, tl.trans(k), TF32)
        o += _dot(q * qs[:, None], _get(hs_ptr, rk, rv, DV, DK, DV, EVEN), TF32)
    vn = _get(vn_ptr + h * DV, t, rv, NV * DV, n_all * C, DV, EVEN)
    o += _dot(p * decay * scale, vn, TF32)
    if GATED:
        tok = tl.load(tok_ptr + t)
        m = (tok >= 0)[:, None] & (rv < DV)[None, :]
        z = tl.load(z_ptr + tok[:, None] * szt + h * DV + rv[None, :], mask=m,
                    other=0.0).to(tl.float32)
        y = gated_rms(o, tl.load(w_ptr + rv, mask=rv < DV, other=0.0).to(tl.float32), z, eps,
                      DV, ROUND_PROD, LIBDEVICE)
        tl.store(o_ptr + tok[:, None] * (NV * DV) + h * DV + rv[None, :], y.to(tl.bfloat16),
                 mask=m)
    else:
        _put(o_ptr + h * DV, o, t, rv, NV * DV, n_all * C, DV, EVEN)


def split_walk(tiles, n: int, q: torch.Tensor, k: torch.Tensor, g: torch.Tensor,
               states: torch.Tensor, firsts: torch.Tensor | None, chunk: int, tf32: bool,
               block_v: int | None = None, num_warps: int = 4, *,
               slots: torch.Tensor | None = None, out: dict | None = None):
    """`gdn_chunk._walk`'s contract over (w, u) = `tiles` (`chunk_prep_triton(walk=False)`),
    with the q, k [T, nk, dk] and g [T, nv] the tiles were made from (fp32, last dim
    contiguous; T ≤ n·chunk): (o [n·chunk, nv, dv] fp32, the new states). `state_walk`, then
    `chunk_output` (`out`: its keyword arguments, the gated norm or a launch variant)."""
    hs, vn, s_out = state_walk(tiles, n, k, g, states, firsts, chunk, tf32, block_v,
                               num_warps, slots=slots)
    return chunk_output(q, k, g, hs, vn, tf32, **(out or {})), s_out


def state_walk(tiles, n: int, k: torch.Tensor, g: torch.Tensor, states: torch.Tensor,
               firsts: torch.Tensor | None, chunk: int, tf32: bool, block_v: int | None = None,
               num_warps: int = 4, *, slots: torch.Tensor | None = None, num_stages: int = 1):
    """The recurrence (`_state_walk_kernel`): (the state each chunk found [nv, n, dk, dv],
    V' [n·chunk, nv, dv], the new states), fp32. `block_v` / `num_warps` as `gdn_chunk`'s;
    `num_stages=2` loads the next chunk's w, u and k while this one's dots run (it fits in
    shared memory here, 128-160 KiB at dk = dv = 128, where `gdn_chunk`'s walk did not)."""
    w, u = tiles
    nv, dk, dv = states.shape[-3:]
    T, nk = k.shape[0], k.shape[1]
    assert w.shape == (nv, n, chunk, dk) and u.shape == (nv, n, chunk, dv)
    assert w.is_contiguous() and u.is_contiguous()
    assert g.shape == (T, nv) and T <= n * chunk and nv % nk == 0
    assert k.dtype == g.dtype == torch.float32 and k.stride(-1) == 1
    assert n * chunk * nv * max(dk, dv) < 2**31 and nv * n * dk * dv < 2**31, "int32 offsets"
    block_k = max(16, triton.next_power_of_2(dk))
    kb = min(64, block_k)  # the state's row blocks (two at dk = 128)
    assert block_k <= 2 * kb, "dk ≤ 128: the walk holds its state in at most two row blocks"
    rows, block_v, s_in, s_out, first = walk_setup(states, firsts, slots, block_v)
    hs = torch.empty(nv, n, dk, dv, dtype=torch.float32, device=s_in.device)
    vn = torch.empty(n * chunk, nv, dv, dtype=torch.float32, device=s_in.device)
    _state_walk_kernel[(rows * nv, triton.cdiv(dv, block_v))](
        w, u, k, g, s_in, s_out, hs, vn, n, T, first, first if slots is None else slots, n,
        k.stride(0), k.stride(1), g.stride(0), g.stride(1), NV=nv, GROUP=nv // nk, DK=dk,
        DV=dv, C=chunk, KB=kb, TWO=block_k > kb, BV=block_v,
        EVEN=dk in (kb, 2 * kb) and dv % block_v == 0, TF32=tf32, ROWS=firsts is not None,
        SLOTS=slots is not None, num_warps=num_warps, num_stages=num_stages)
    return hs, vn, s_out


class GatedNorm(NamedTuple):
    """What `gdn_fused.gdn_gated_norm` would take after the walk, for `chunk_output` to apply
    itself: the gate z [T, nv·dv] bf16 (unit inner stride), the norm's weight [dv], its eps,
    and each padded position's token ([P] int32, −1 for padding: `PromptLayout.meta`'s
    first P)."""

    z: torch.Tensor
    weight: torch.Tensor
    eps: float
    tokens: torch.Tensor


def chunk_output(q: torch.Tensor, k: torch.Tensor, g: torch.Tensor, hs: torch.Tensor,
                 vn: torch.Tensor, tf32: bool, *, block_v: int = 64, block: int = 32,
                 num_warps: int = 4, norm: GatedNorm | None = None) -> torch.Tensor:
    """Every chunk's output (`_chunk_out_kernel`) from `state_walk`'s states and V':
    o [n·chunk, nv, dv] fp32; with `norm`, `gdn_gated_norm(o, ...)` in the same launch, bf16
    [T, nv·dv] in token order (a whole head a program: `block_v` becomes dv's). `block_v`
    value columns and `block` of dk a program: at 64 / 32 / 4 warps, and at 128 / 32 / 8,
    none of its registers spill at dk = dv = 128 (sm_90, Triton 3.6:
    bench/results/sm90-prompt-kernel-resources.md)."""
    nv, n, dk, dv = hs.shape
    T, nk = k.shape[0], k.shape[1]
    assert q.shape == k.shape and q.dtype == torch.float32 and q.stride(-1) == 1
    assert vn.shape[1:] == (nv, dv) and vn.shape[0] % n == 0 and T <= vn.shape[0]
    chunk = vn.shape[0] // n
    block_k = max(16, triton.next_power_of_2(dk))
    block_v = max(16, triton.next_power_of_2(dv) if norm else min(block_v,
                                                                triton.next_power_of_2(dv)))
    block = min(block, block_k)
    if norm is None:
        o = torch.empty_like(vn)
        tokens = z = weight = o  # unread pointers
        eps, round_prod = 0.0, False
    else:
        z, weight, eps, tokens = norm
        assert T == vn.shape[0] == tokens.shape[0] and tokens.dtype == torch.int32, "padded rows"
        assert z.shape[1] == nv * dv and z.stride(1) == 1 and z.dtype == torch.bfloat16
        assert weight.shape == (dv,) and weight.is_contiguous()
        round_prod = torch.promote_types(weight.dtype, torch.bfloat16) == torch.bfloat16
        o = torch.empty(z.shape[0], nv * dv, dtype=torch.bfloat16, device=vn.device)
    _chunk_out_kernel[(n, nv, triton.cdiv(dv, block_v))](
        q, k, g, hs, vn, o, tokens, z, weight, T, n, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), g.stride(0), g.stride(1), z.stride(0), dk**-0.5, eps, NV=nv,
        GROUP=nv // nk, DK=dk, DV=dv, C=chunk, BV=block_v, BLOCK=block,
        EVEN=dk % block == 0 and dv % block_v == 0, TF32=tf32, GATED=norm is not None,
        ROUND_PROD=round_prod, LIBDEVICE=not interpreting(), num_warps=num_warps)
    return o
