"""Chunked Gated DeltaNet prefill (model-math.md §2.1 step 7) with the chunk loop in Triton.

`chunk_gated_delta(q, k, v, g, beta, state, chunk=64)` has the contract of
`kernels.gdn_ref.chunked_gated_delta`: q, k `[T, nk, dk]` fp32 (L2-normalised; nk divides nv, value
head j reading q/k head j // (nv / nk), so nk = nv is the reference's expanded form), v
`[T, nv, dv]` fp32, g / beta `[T, nv]` fp32, state `[nv, dk, dv]` fp32 (not modified); returns
(o `[T, nv, dv]` fp32, new state `[nv, dk, dv]` fp32). Any T ≥ 1 (zero-padded inside).

Three launches for the whole prompt:

* `kernels.gdn_solve` then `kernels.gdn_prep` (grids chunks × heads, every chunk in parallel):
  the precompute of `kernels.gdn_ref.chunk_prep` — in-chunk decays, A, (I + A)⁻¹ applied for U
  and W, P = (Q Kᵀ) ⊙ decay, Q e^γ, K e^{γ_C−γ}, e^{γ_C}. `prep="torch"` runs the torch
  version instead (the reference the tests and `bench/gdn_chunk_bench.py` compare with).
* `_gdn_chunk_kernel` (Triton, grid (nv, ⌈dv / BV⌉)): the one sequential part. Each program
  keeps its state tile S `[dk, BV]` in fp32 registers and walks the chunks in order:
  `V' = U − W S`, `O = (Q e^γ) S + P V'`, `S ← e^{γ_C} S + (K e^{γ_C−γ})ᵀ V'` (four `tl.dot`s a
  chunk), writing O straight into the `[T, nv, dv]` layout.

Precision: `tf32=False` (default) makes every `tl.dot` IEEE fp32, matching the torch reference
(which is fp32 on CUDA: the engine never enables TF32) to ~1e-6. `tf32=True` runs them on the
tensor cores in TF32 (10-bit mantissa inputs, fp32 accumulate): ~1e-3 relative error on o and
the state (simulated with truncated operands: 8e-4 at T = 1000, 1e-3 at T = 4096, not growing),
below the bf16 rounding (2⁻⁹) the serving path applies to o anyway (FLA's kernel does these dots
in bf16). `GatedDeltaNet` passes `tf32=True` only for bf16/fp16 activations, so the fp32 path
(and its HF-parity tests) stays IEEE. The interpreter computes in fp32 either way.
`tiles_dtype=torch.bfloat16` stores the precompute's five tiles (w, u, qd, ke, p) in bf16, each
rounded once (u = 2⁻⁸), and the walk widens them back to fp32: half the bytes of the two launches
that are bound by them (~1 GB a layer at 8 × 955 tokens), FLA's storage precision. The engine
stores them so (`models.gdn.BF16_TILES`, bench/results/h100-gdn-bf16-tiles.md).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import gdn_ref as reference
from .gdn_fused_kernels import _round_bf16
from .gdn_prep import chunk_prep_triton
from .gdn_ref import CHUNK
from .gdn_solve import _dot


def _span(x):
    """Elements between a view's first and last element, plus one."""
    return 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride()))


@triton.jit
def _load(ptr, mask, EVEN: tl.constexpr):
    if EVEN:
        x = tl.load(ptr)
    else:
        x = tl.load(ptr, mask=mask, other=0.0)
    return x


@triton.jit
def walk_program(first_ptr, slot_ptr, n, NV: tl.constexpr, ROWS: tl.constexpr,
                 SLOTS: tl.constexpr):
    """A walk program's (value head, first chunk, chunks, state row). ROWS: program (row,
    head) walks the row's chunks first[r] .. first[r+1]-1 from its own state, row r of the
    states or (SLOTS) row slot[r] of a state pool, read and overwritten in place (the program
    reads its tile before it writes it; no other program touches it). Else: head
    `program_id(0)` walks chunks 0 .. n-1 of state 0."""
    h = tl.program_id(0)
    if ROWS:
        r = h // NV
        h = h % NV
        c0 = tl.load(first_ptr + r)
        n = tl.load(first_ptr + r + 1) - c0
        if SLOTS:
            at = tl.load(slot_ptr + r)
        else:
            at = r
    else:
        c0 = 0
        at = 0
    return h, c0, n, at


# one compile for every chunk count: n (and cd's row stride, also n) would specialise on
# n == 1 and n % 16 == 0, and a step of 1K-token rows (16 chunks each) meets a variant the
# start-up warm-up's short rows never compiled
@triton.jit(do_not_specialize=["n", "sch"])
def _gdn_chunk_kernel(w_ptr, u_ptr, qd_ptr, ke_ptr, p_ptr, cd_ptr, s_ptr, s_out_ptr, o_ptr, n,
                      first_ptr, slot_ptr,
                      swh, swn, swr, swd, suh, sun, sur, sud, sqh, sqn, sqr, sqd,
                      skh, skn, skr, skd, sph, spn, spr, spc, sch, scn,
                      NV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, EVEN: tl.constexpr,
                      TF32: tl.constexpr, ROWS: tl.constexpr, SLOTS: tl.constexpr,
                      O_BF16: tl.constexpr):
    # chunk tiles are [nv, n, C, ·] tensors read through their strides (the torch precompute's
    # outputs are permuted / column-major views; copying them contiguous would cost a pass each)
    h, c0, n, at = walk_program(first_ptr, slot_ptr, n, NV, ROWS, SLOTS)
    vb = tl.program_id(1)
    s_ptr += at * NV * DK * DV
    s_out_ptr += at * NV * DK * DV
    rc = tl.arange(0, C)
    rk = tl.arange(0, BK)
    rv = vb * BV + tl.arange(0, BV)
    kmask = rk < DK
    vmask = rv < DV
    ck_mask = kmask[None, :]  # [C, BK] tiles: every chunk row is real (padded rows are zeros)
    cv_mask = vmask[None, :]
    s_off = h * DK * DV + rk[:, None] * DV + rv[None, :]
    s_mask = kmask[:, None] & vmask[None, :]
    s = _load(s_ptr + s_off, s_mask, EVEN)  # [BK, BV] fp32, lives in registers

    w_ptrs = w_ptr + h * swh + c0 * swn + rc[:, None] * swr + rk[None, :] * swd  # [C, BK]
    u_ptrs = u_ptr + h * suh + c0 * sun + rc[:, None] * sur + rv[None, :] * sud  # [C, BV]
    qd_ptrs = qd_ptr + h * sqh + c0 * sqn + rc[:, None] * sqr + rk[None, :] * sqd  # [C, BK]
    # [BK, C]: transposed
    ke_ptrs = ke_ptr + h * skh + c0 * skn + rk[:, None] * skd + rc[None, :] * skr
    p_ptrs = p_ptr + h * sph + c0 * spn + rc[:, None] * spr + rc[None, :] * spc  # [C, C]
    # rows of [T, nv, dv]
    o_ptrs = o_ptr + (c0 * C + rc[:, None]) * (NV * DV) + h * DV + rv[None, :]
    cd_ptr += c0 * scn
    for i in range(n):  # int32 offsets suffice: every tensor spans < 2^31 elements (asserted)
        # tiles stored in bf16 (`tiles_dtype`) widen exactly to the fp32 the dots take
        w = _load(w_ptrs + i * swn, ck_mask, EVEN).to(tl.float32)
        u = _load(u_ptrs + i * sun, cv_mask, EVEN).to(tl.float32)
        v_corr = u - _dot(w, s, TF32)  # [C, BV]
        qd = _load(qd_ptrs + i * sqn, ck_mask, EVEN).to(tl.float32)
        p = tl.load(p_ptrs + i * spn).to(tl.float32)
        o = _dot(qd, s, TF32) + _dot(p, v_corr, TF32)
        if O_BF16:  # rounded to the nearest (the interpreter's cast truncates)
            o = _round_bf16(o).to(tl.bfloat16)
        if EVEN:
            tl.store(o_ptrs + i * C * NV * DV, o)
        else:
            tl.store(o_ptrs + i * C * NV * DV, o, mask=cv_mask)
        ke_t = _load(ke_ptrs + i * skn, kmask[:, None], EVEN).to(tl.float32)  # (K e^{γ_C-γ})ᵀ
        cd = tl.load(cd_ptr + h * sch + i * scn)
        s = s * cd + _dot(ke_t, v_corr, TF32)
    if EVEN:
        tl.store(s_out_ptr + s_off, s)
    else:
        tl.store(s_out_ptr + s_off, s, mask=s_mask)


def chunk_gated_delta(q, k, v, g, beta, state, chunk: int = CHUNK, *, tf32: bool = False,
                      prep: str = "triton", block_v: int | None = None, num_warps: int = 4,
                      num_stages: int = 1, split: bool = False,
                      tiles_dtype: torch.dtype = torch.float32):
    """Triton path of `kernels.gdn_ref.chunked_gated_delta` (see the module docstring).

    `block_v` value columns per program (capped at dv rounded up to a power of two, at least
    16: `tl.dot` needs 16-wide operands), so the grid is nv × ⌈dv / block_v⌉; by default
    `walk_block_v`'s. `split`: `kernels.gdn_split`'s walk (the state in order, the output in
    parallel over the chunks). `tiles_dtype`: `chunk_prep_triton`'s (the Triton precompute)."""
    T, nk, dk = k.shape
    nv, dv = v.shape[1], v.shape[2]
    assert T >= 1 and q.shape == k.shape and v.shape[0] == T and nv % nk == 0
    assert g.shape == (T, nv) and beta.shape == (T, nv) and state.shape == (nv, dk, dv)
    assert chunk >= 16 and chunk & (chunk - 1) == 0, "chunk must be a power of two >= 16"
    if split:
        assert prep == "triton", "the split walk reads the Triton precompute's tiles"
        o, s_out = _split(q, k, v, g, beta, state, None, chunk, tf32, block_v, num_warps, None,
                          tiles_dtype=tiles_dtype)
        return o[:T], s_out
    if prep == "triton":
        tiles, n = chunk_prep_triton(q, k, v, g, beta, chunk, tf32=tf32, tiles_dtype=tiles_dtype)
    else:
        r = nv // nk
        q, k = q.float().repeat_interleave(r, 1), k.float().repeat_interleave(r, 1)
        tiles, n = reference.chunk_prep(q, k, v.float(), g.float(), beta.float(), chunk)
    o, s_out = _walk(tiles, n, state, None, chunk, tf32, block_v, num_warps, num_stages)
    return o[:T], s_out


def walk_block_v(programs: int, dv: int, device: torch.device) -> int:
    """The walk's value columns per program for `programs` (row, head) pairs: 32 while that
    grid still fits one wave of the device's SMs, else 64 (an H200, bench/results/
    h200-gdn-prompt-parts.md: one 8,192-token row of 32 heads 1.24 → 1.02 ms at 32; 48 heads,
    two waves at 32, 1.29 → 1.67; eight rows of 32 heads best at 64)."""
    if device.type != "cuda" or programs * triton.cdiv(dv, 32) > _sm_count(device):
        return 64
    return 32


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def walk_setup(states: torch.Tensor, firsts: torch.Tensor | None, slots: torch.Tensor | None,
               block_v: int | None):
    """A walk's (rows, value columns a program, states read, states written, `firsts` or an
    unread pointer where there are none) for `_walk`'s `states` / `firsts` / `slots`."""
    nv, dv = states.shape[-3], states.shape[-1]
    rows = 1 if firsts is None else firsts.numel() - 1
    block_v = block_v or walk_block_v(rows * nv, dv, states.device)
    block_v = max(16, min(block_v, triton.next_power_of_2(dv)))
    if slots is None:
        s_in = states.float().contiguous()
        s_out = torch.empty_like(s_in)
    else:
        assert firsts is not None and slots.numel() == firsts.numel() - 1
        assert states.dtype == torch.float32 and states.is_contiguous(), "a pool, in place"
        s_in = s_out = states
    return rows, block_v, s_in, s_out, s_in if firsts is None else firsts


def _walk(tiles, n: int, states: torch.Tensor, firsts: torch.Tensor | None, chunk: int,
          tf32: bool, block_v: int | None, num_warps: int, num_stages: int,
          slots: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float32):
    """The chunk walk over `tiles` (`chunk_prep_triton`'s, n chunks) from `states` ([nv, dk,
    dv], or [R, nv, dk, dv] with `firsts`: row r's chunks are firsts[r] .. firsts[r+1]-1; with
    `slots` too, a pool: row r continues its row slots[r] in place): (o [n·chunk, nv, dv] in
    `out_dtype`, fp32 or bf16 (rounded once), the new states: `states` itself with `slots`)."""
    nv, dk, dv = states.shape[-3:]
    assert all(_span(x) < 2**31 for x in tiles) and n * chunk * nv * dv < 2**31, "int32 offsets"
    block_k = max(16, triton.next_power_of_2(dk))
    rows, block_v, s_in, s_out, first = walk_setup(states, firsts, slots, block_v)
    assert out_dtype in (torch.float32, torch.bfloat16)
    o = torch.empty(n * chunk, nv, dv, dtype=out_dtype, device=s_in.device)
    _gdn_chunk_kernel[(rows * nv, triton.cdiv(dv, block_v))](
        *tiles, s_in, s_out, o, n, first, first if slots is None else slots,
        *(st for x in tiles for st in x.stride()),
        NV=nv, DK=dk, DV=dv, C=chunk, BK=block_k, BV=block_v,
        EVEN=block_k == dk and dv % block_v == 0, TF32=tf32, ROWS=firsts is not None,
        SLOTS=slots is not None, O_BF16=out_dtype == torch.bfloat16, num_warps=num_warps,
        num_stages=num_stages)
    return o, s_out


def chunk_gated_delta_padded(q, k, v, g, beta, states, firsts: torch.Tensor,
                             chunk: int = CHUNK, *, slots: torch.Tensor | None = None,
                             tf32: bool = False, block_v: int | None = None,
                             num_warps: int = 4, num_stages: int = 1, split: bool = False,
                             norm=None, tiles_dtype: torch.dtype = torch.float32,
                             out_dtype: torch.dtype = torch.float32):
    """`chunk_gated_delta` of a step's rows in three launches, not two a row: q, k, v, g, beta
    [P, ...] hold row i's tokens from position firsts[i]·chunk (`firsts` int32 on the
    device; row i's chunks are firsts[i] .. firsts[i+1]-1), every padding position zero (it has
    g = 0 and beta = 0: it leaves the state as it was, as the single-row path's own tail
    padding), as `kernels.gdn_prompt` writes them; row i continues `states[i]` ([R, nv, dk,
    dv] fp32, not modified). The precompute runs over every chunk of every row at once, the
    chunk walk's programs are (row, head). Returns (o in that layout [P, nv, dv], new
    states [R, nv, dk, dv]). With `slots` ([R] int64 on the device), `states` is a state pool
    [S, nv, dk, dv] (fp32, contiguous): row i continues row slots[i] and overwrites it in place
    (vLLM's `state_indices`), and the pool is returned as the new states. `split` as in
    `chunk_gated_delta`; with it, `norm` (a `gdn_split.GatedNorm`) has the gated norm applied
    in the output's launch: o is then `gdn_gated_norm`'s bf16 [T, nv·dv] in token order.
    `tiles_dtype`: the precompute's tiles (`chunk_prep_triton`; the split walk's are fp32);
    `out_dtype`: o's, fp32 or bf16 (the chunk walk's: rounded once, where HF rounds the
    rule's output before its gated norm)."""
    assert q.shape[0] % chunk == 0
    assert states.shape[0] == firsts.numel() - 1 or slots is not None
    assert split or norm is None, "the gated norm goes with the split walk's output"
    if split:
        return _split(q, k, v, g, beta, states, firsts, chunk, tf32, block_v, num_warps, slots,
                      norm, tiles_dtype)
    tiles, n = chunk_prep_triton(q, k, v, g, beta, chunk, tf32=tf32, tiles_dtype=tiles_dtype)
    return _walk(tiles, n, states, firsts, chunk, tf32, block_v, num_warps, num_stages, slots,
                 out_dtype)


def _split(q, k, v, g, beta, states, firsts, chunk, tf32, block_v, num_warps, slots,
           norm=None, tiles_dtype=torch.float32):
    from .gdn_split import split_walk  # it reads this module's walk helpers

    # (`chunk_prep_triton` refuses bf16 tiles here: the split walk reads fp32 ones)
    tiles, n = chunk_prep_triton(q, k, v, g, beta, chunk, tf32=tf32, walk=False,
                                 tiles_dtype=tiles_dtype)
    q, k = (x.float() if x.stride(-1) == 1 else x.float().contiguous() for x in (q, k))
    # with the norm a program takes a whole head: 8 warps spill nothing there (sm_90)
    out = None if norm is None else dict(norm=norm, num_warps=8)
    return split_walk(tiles, n, q, k, g.float(), states, firsts, chunk, tf32, block_v,
                      num_warps, slots=slots, out=out)
