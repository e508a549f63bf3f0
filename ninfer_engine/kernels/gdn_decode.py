"""One-token Gated DeltaNet recurrent update for all value heads (model-math.md §2.1 step 6).

Inputs for B sequences of T tokens each (T = 1: decode; 1 + k: a speculative verify row),
sequence-major token rows: q, k `[B·T, nk, dk]` (raw; L2-normalised here), v `[B·T, nv, dv]`,
g `[B·T, nv]` (log decay, α = e^g), beta `[B·T, nv]`, state `[S, nv, dk, dv]` fp32 updated in
place: sequence b continues state row `index[b]` (a state-slot pool addressed by index, as
vLLM's `state_indices`), or row b itself when `index` is None (S = B, T = 1). `trail`, where
given, receives the state after each token of a row but the last. `valid` [B] int32, where
given: row b's tokens from `valid[b]` on are padding (a prompt chunk's rows padded to the
captured step's length): their outputs are computed (and never read), the state kept is the
one after token `valid[b] - 1`.
Value head j reads q/k head `j // (nv/nk)`. Returns o `[B·T, nv, dv]` fp32, o = Sᵀ q / √dk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gdn_ref import l2_normalize, recurrent_gated_delta
from ._dispatch import use_triton
from .pdl import pdl_launch, pdl_release, pdl_wait


def gdn_decode_ref(q, k, v, g, beta, state, index=None, trail=None, valid=None):
    """Torch reference built on the model's `recurrent_gated_delta`; updates `state` (and
    `trail`, `valid` as `gdn_decode_triton`)."""
    r = v.shape[1] // q.shape[1]
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    slots = range(q.shape[0]) if index is None else index.tolist()
    T = q.shape[0] // len(slots)
    for b, slot in enumerate(slots):
        tok = slice(b * T, (b + 1) * T)
        qb = l2_normalize(q[tok].float()).repeat_interleave(r, 1)
        kb = l2_normalize(k[tok].float()).repeat_interleave(r, 1)
        after: list[torch.Tensor] = []
        out[tok], last = recurrent_gated_delta(qb, kb, v[tok].float(), g[tok].float(),
                                               beta[tok].float(), state[slot], after)
        n = T if valid is None else int(valid[b])
        state[slot] = last if n == T else state[slot] if n == 0 else after[n - 1]
        if trail is not None:
            for t in range(T - 1):
                trail[t, b] = after[t]
    return out


@triton.jit
def _gdn_decode_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, idx_ptr, o_ptr, trail_ptr,
                       valid_ptr, scale, TRAIL_B,
                       NK: tl.constexpr, NV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                       BK: tl.constexpr, BV: tl.constexpr, EVEN: tl.constexpr,
                       INDEXED: tl.constexpr, T: tl.constexpr, TRAIL: tl.constexpr,
                       VALID: tl.constexpr = 0, PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`
    pdl_release(PDL)
    pid = tl.program_id(0)  # b * NV + j
    vb = tl.program_id(1)
    b = pid // NV
    j = pid % NV
    dk = tl.arange(0, BK)
    dv = vb * BV + tl.arange(0, BV)
    if INDEXED:  # the row's state slot
        srow = tl.load(idx_ptr + b).to(tl.int64) * NV + j
    else:
        srow = pid.to(tl.int64)
    tile = dk[:, None] * DV + dv[None, :]
    sp = s_ptr + srow * DK * DV + tile
    kmask = dk < DK
    vmask = dv < DV
    smask = kmask[:, None] & vmask[None, :]
    if EVEN:  # BK == DK and BV divides DV: the real shapes, no masks
        s = tl.load(sp)
    else:  # a dk that is not a power of two, or a dv tail (tiny test shapes)
        s = tl.load(sp, mask=smask, other=0.0)
    n_valid = tl.load(valid_ptr + b) if VALID else T
    kept = s  # the state after the row's last real token
    # the row's T tokens in order, the state held in registers between them (a loop, not
    # unrolled: a 64-token prompt row unrolled took minutes to compile on the H200)
    for t in range(T):
        row = b * T + t  # token row
        kh = row * NK + j // (NV // NK)
        qp = q_ptr + kh * DK + dk
        kp = k_ptr + kh * DK + dk
        vp = v_ptr + (row * NV + j) * DV + dv
        if EVEN:
            q = tl.load(qp).to(tl.float32)
            k = tl.load(kp).to(tl.float32)
            v = tl.load(vp).to(tl.float32)
        else:
            q = tl.load(qp, mask=kmask, other=0.0).to(tl.float32)
            k = tl.load(kp, mask=kmask, other=0.0).to(tl.float32)
            v = tl.load(vp, mask=vmask, other=0.0).to(tl.float32)
        alpha = tl.exp(tl.load(g_ptr + row * NV + j).to(tl.float32))
        beta = tl.load(beta_ptr + row * NV + j).to(tl.float32)
        # every dot of the token from the raw q, k and the state before it, side by side:
        # one reduction phase a token, not three in sequence (q and k's norms, then Sᵀk of
        # the decayed state, then Sᵀq of the new one): o = (αS + k̂uᵀ)ᵀq̂
        sk = tl.sum(s * k[:, None], axis=0)
        sq = tl.sum(s * q[:, None], axis=0)
        rk = 1.0 / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
        rq = scale / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)
        kq = tl.sum(k * q, axis=0) * rk * rq
        u = beta * (v - alpha * rk * sk)  # the delta error reads the decayed state
        o = alpha * rq * sq + u * kq
        s = s * alpha + (k * rk)[:, None] * u[None, :]
        if VALID:
            kept = tl.where(t < n_valid, s, kept)
        op = o_ptr + (row * NV + j) * DV + dv
        if EVEN:
            tl.store(op, o)
        else:
            tl.store(op, o, mask=vmask)
        if TRAIL and t < T - 1:  # the state after token t, for a rollback
            tp = trail_ptr + ((t * TRAIL_B + b).to(tl.int64) * NV + j) * DK * DV + tile
            if EVEN:
                tl.store(tp, s)
            else:
                tl.store(tp, s, mask=smask)
    if not VALID:
        kept = s
    if EVEN:
        tl.store(sp, kept)
    else:
        tl.store(sp, kept, mask=smask)


# Programs (at block_v 16) up to which a program of one warp over 16 value columns is the
# fastest tile, past which 32 columns over two warps is (the H100's sweep at the 35B-A3B and
# 27B heads: B = 1 rows 256-384 programs, B = 8 rows 2,048-3,072; h100-gdn-decode-tiles.md)
SMALL_GRID = 512


def launch_tiles(rows: int, nv: int, dv: int) -> tuple[int, int]:
    """(block_v, num_warps) for `rows` sequences of `nv` value heads of `dv` columns."""
    return (16, 1) if rows * nv * triton.cdiv(dv, 16) <= SMALL_GRID else (32, 2)


def gdn_decode_triton(q, k, v, g, beta, state, index=None, trail=None, block_v=None,
                      valid=None, num_warps=None):
    """Triton path: one program per (sequence, value head, block of `block_v` value dims).

    Rows of T > 1 tokens (`q` etc. hold B·T token rows, sequence-major; `index` has B
    entries): the program walks its row's tokens in order with the state in registers and,
    where `trail` ([≥ T-1, ≥ B, nv, dk, dv], contiguous) is given, stores the state after each
    token but the last there. `block_v` is capped at dv (rounded up to a power of two) so
    small heads still get a program; a dv that `block_v` does not divide, or a dk that is not
    a power of two, takes the masked variant (the real shapes, dk = dv = 128, stay unmasked).
    `block_v` and `num_warps` default to `launch_tiles`' (timed by `bench/gdn_decode_sweep.py`).
    The update takes every dot of a token in one pass from the raw q, k and the state before
    it: 1.01-1.11x the rule as written at the chosen tiles on the H100
    (bench/results/h100-gdn-decode-tiles.md)."""
    N, nk, dk = q.shape
    nv, dv = v.shape[1], v.shape[2]
    B = N if index is None else index.shape[0]
    T = N // B
    assert N == B * T and nv % nk == 0 and state.dtype == torch.float32
    assert state.shape[1:] == (nv, dk, dv) and state.is_contiguous()
    assert state.shape[0] == B if index is None else (index.dtype == torch.long
                                                      and index.dim() == 1)
    if trail is not None:
        assert trail.is_contiguous() and trail.shape[2:] == (nv, dk, dv)
        assert trail.shape[0] >= T - 1 and trail.shape[1] >= B
    assert valid is None or (valid.dtype == torch.int32 and valid.shape[0] >= B)
    tiles = launch_tiles(B, nv, dv)
    block_v = min(block_v or tiles[0], triton.next_power_of_2(dv))
    block_k = triton.next_power_of_2(dk)
    o = torch.empty(N, nv, dv, dtype=torch.float32, device=v.device)
    _gdn_decode_kernel[(B * nv, triton.cdiv(dv, block_v))](
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
        state, state if index is None else index, o, state if trail is None else trail,
        state if valid is None else valid, dk**-0.5, 0 if trail is None else trail.shape[1],
        NK=nk, NV=nv, DK=dk, DV=dv, BK=block_k, BV=block_v,
        EVEN=block_k == dk and dv % block_v == 0, INDEXED=index is not None, T=T,
        TRAIL=trail is not None, VALID=valid is not None,
        num_warps=num_warps or tiles[1], **pdl_launch(state))
    return o


def gdn_decode(q, k, v, g, beta, state, index=None, trail=None, valid=None):
    """Dispatching entry point; see the module docstring."""
    if use_triton(q):
        return gdn_decode_triton(q, k, v, g, beta, state, index, trail, valid=valid)
    return gdn_decode_ref(q, k, v, g, beta, state, index, trail, valid)
