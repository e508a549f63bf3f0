"""The element-wise work before a prompt step's Gated DeltaNet chunk walk, fused (one launch a
layer instead of ~35: the profile of an 8-layer 35B-A3B prompt step on the H200 spent most of
its host time launching them).

`gdn_prompt_prep(qkv, b, a, conv, conv_w, a_log, dt_bias, nk, dk, layout, slots)` takes a
step's rows (row i: `layout.lengths[i]` consecutive tokens of `qkv` [T, C] = q|k|v before the
conv, `b` and `a` [T, nv]; the rows' conv states `conv` [R, K-1, C], oldest first, or with
`slots` ([R] int64 on the device) rows slots[i] of a state pool's `conv` [S, K-1, C]) and
returns, in the chunk-padded layout of `gdn_chunk.chunk_gated_delta_padded` (row i's token j
at `layout.first[i]·chunk + j`, every padding position zero):

* q, k [P, nk, dk] = L2norm(SiLU(conv)) and v [P, nv, dv] = SiLU(conv), bf16, where conv is
  the causal depthwise conv over the row's state then its tokens; conv and SiLU are each
  rounded to bf16 (HF's `silu(conv1d(x))` in bf16: fp32 sums, one rounding per op), so v is
  stored exactly, and the L2 norm is taken in fp32 and rounded once (HF's `l2norm` on bf16
  tensors returns bf16; FLA's too). Half the bytes of fp32: on the H100's 8 × 955-token
  35B-A3B step the kernels reading them took 8-18 % less time, this one 2 % (it is not bound
  by its stores; bench/results/h100-prompt-step-gdn-bf16-slot-sum.md);
* g = −e^{a_log}·softplus(a + dt_bias) and beta = sigmoid(b) [P, nv] fp32;
* the rows' new conv states [R, K-1, C] (the last K-1 inputs of state ++ tokens), which the
  caller copies back into the slots after every read of the old ones.

`PromptLayout` (host arithmetic, once a step: every GDN layer of it shares one) maps padded
positions to tokens. The torch reference `gdn_prompt_prep_ref` has the same contract.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..host_copy import to_device
from ._dispatch import interpreting, use_triton
from .gdn_fused_kernels import _exp, _round_bf16, _silu, _softplus
from .gdn_ref import CHUNK, l2_normalize


@dataclass(frozen=True)
class PromptLayout:
    """A step's rows in chunk-padded order, in one int32 device array: each row's first chunk
    ([R + 1], the walk's `firsts`), then from a 16-byte boundary `meta`: each padded position's
    token (−1: padding), row and position in its row ([3, P]), then each row's first token and
    length ([2, R]). `at` [T]: each token's padded position. (Both kernels' pointers stay
    16-byte aligned whatever R: Triton compiles a variant per pointer alignment.)"""

    lengths: tuple[int, ...]
    padded: int
    first: torch.Tensor
    meta: torch.Tensor
    at: torch.Tensor


@functools.lru_cache(maxsize=4)
def prompt_layout(lengths: tuple[int, ...], device: torch.device,
                  chunk: int = CHUNK) -> PromptLayout:
    """The layout of rows of `lengths` tokens (cached: every GDN layer of a step asks)."""
    n = np.asarray(lengths, dtype=np.int64)
    chunks = -(-n // chunk)
    first = np.concatenate([[0], np.cumsum(chunks)])
    starts = np.concatenate([[0], np.cumsum(n)])[:-1]
    P = int(first[-1]) * chunk
    row = np.repeat(np.arange(len(n)), chunks * chunk)
    pos = np.arange(P) - np.repeat(first[:-1] * chunk, chunks * chunk)
    token = np.where(pos < n[row], starts[row] + pos, -1)
    at = np.repeat(first[:-1] * chunk - starts, n) + np.arange(int(n.sum()))
    gap = -len(first) % 4  # meta from a 16-byte boundary
    packed = to_device(np.concatenate([first, np.zeros(gap, np.int64), token, row, pos, starts,
                                       n]).astype(np.int32), device)
    return PromptLayout(tuple(lengths), P, packed[: len(first)],
                        packed[len(first) + gap:], to_device(at, device))


@functools.lru_cache(maxsize=4)
def slot_indices(slots: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The rows' state-pool slots as an int64 device tensor (cached: every GDN layer asks)."""
    return to_device(np.asarray(slots, dtype=np.int64), device)


def _padded(layout: PromptLayout, x: torch.Tensor) -> torch.Tensor:
    out = x.new_zeros((layout.padded, *x.shape[1:]))
    return out.index_copy_(0, layout.at, x)


def gdn_prompt_prep_ref(qkv, b, a, conv, conv_w, a_log, dt_bias, nk, dk, layout, slots=None):
    """Torch reference (see the module docstring); qkv, b, a, conv bf16."""
    if slots is not None:  # the rows' states out of the pool: the same values
        conv = conv.index_select(0, slots.long())
    C, (R, K1, _) = qkv.shape[1], conv.shape
    kg = nk * dk
    nv = b.shape[1]
    starts = [0, *np.cumsum(layout.lengths).tolist()]
    outs, new = [], torch.empty_like(conv)
    for r in range(R):
        full = torch.cat([conv[r], qkv[starts[r]: starts[r + 1]]])  # [K-1+n, C]
        new[r] = full[-K1:]
        windows = full.unfold(0, K1 + 1, 1)  # [n, C, K]
        y = (windows.float() * conv_w.float().t()).sum(-1).to(qkv.dtype)
        outs.append(F.silu(y.float()).to(qkv.dtype).float())
    y = torch.cat(outs)
    q = l2_normalize(y[:, :kg].reshape(-1, nk, dk)).to(qkv.dtype)
    k = l2_normalize(y[:, kg: 2 * kg].reshape(-1, nk, dk)).to(qkv.dtype)
    v = y[:, 2 * kg:].reshape(-1, nv, (C - 2 * kg) // nv).to(qkv.dtype)
    g = -a_log.exp() * F.softplus(a.float() + dt_bias)
    beta = torch.sigmoid(b.float())
    return (*(_padded(layout, x) for x in (q, k, v, g, beta)), new)


@triton.jit(do_not_specialize=["P", "R", "NT"])  # one variant for every step's rows
def _prompt_prep_kernel(qkv_ptr, b_ptr, a_ptr, conv_ptr, w_ptr, alog_ptr, dtb_ptr, meta_ptr,
                        slot_ptr, out_ptr, gate_ptr, new_ptr, P, R, NT, s_qkv, s_b, s_a,
                        NK: tl.constexpr, DK: tl.constexpr, VG: tl.constexpr,
                        NV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                        BLOCK_NV: tl.constexpr, LIBDEVICE: tl.constexpr, SLOTS: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)  # q or k head h (h < 2·NK), else a block of BC of v's channels
    KG: tl.constexpr = NK * DK
    C: tl.constexpr = 2 * KG + VG
    lane = tl.arange(0, BC)
    if h < 2 * NK:
        c = h * DK + lane
        cm = lane < DK
    else:
        c = 2 * KG + (h - 2 * NK) * BC + lane
        cm = c < C
    if pid < NT:  # BT padded positions
        p = pid * BT + tl.arange(0, BT)
        pm = p < P
        tok = tl.load(meta_ptr + p, mask=pm, other=-1)
        row = tl.load(meta_ptr + P + p, mask=pm, other=0)
        pos = tl.load(meta_ptr + 2 * P + p, mask=pm, other=0)
        real = tok >= 0
        if SLOTS:  # row r's conv state is row slot[r] of a state pool
            state = tl.load(slot_ptr + row, mask=pm, other=0)
        else:
            state = row
        acc = tl.zeros((BT, BC), dtype=tl.float32)
        for j in tl.static_range(K):  # tap j reads the input K-1-j tokens back
            back = pos - (K - 1) + j
            xm = (real & (back >= 0))[:, None] & cm[None, :]
            sm = (real & (back < 0))[:, None] & cm[None, :]
            x = tl.load(qkv_ptr + (tok - (K - 1) + j)[:, None] * s_qkv + c[None, :], mask=xm,
                        other=0.0).to(tl.float32)
            s = tl.load(conv_ptr + (state * (K - 1) + (K - 1) + back)[:, None] * C + c[None, :],
                        mask=sm, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + j * C + c, mask=cm, other=0.0).to(tl.float32)
            acc += (x + s) * w[None, :]
        y = _round_bf16(_silu(_round_bf16(acc), LIBDEVICE))  # zero at padding: SiLU(0) = 0
        if h < 2 * NK:  # L2-normalised over the head (eps inside the sum)
            y = y * (1.0 / tl.sqrt(tl.sum(y * y, axis=1) + 1e-6))[:, None]
        # out = q [P, KG] | k [P, KG] | v [P, VG] (bf16); gate = g [P, NV] | beta [P, NV]
        if h < NK:
            off = p[:, None] * KG + c[None, :]
        elif h < 2 * NK:
            off = P * KG + p[:, None] * KG + (c - KG)[None, :]
        else:
            off = 2 * P * KG + p[:, None] * VG + (c - 2 * KG)[None, :]
        tl.store(out_ptr + off, _round_bf16(y).to(tl.bfloat16), mask=pm[:, None] & cm[None, :])
        if h == 0:
            hv = tl.arange(0, BLOCK_NV)  # value heads
            m = real[:, None] & (hv < NV)[None, :]
            bb = tl.load(b_ptr + tok[:, None] * s_b + hv[None, :], mask=m, other=0.0)
            aa = tl.load(a_ptr + tok[:, None] * s_a + hv[None, :], mask=m, other=0.0)
            aa = aa.to(tl.float32) + tl.load(dtb_ptr + hv, mask=hv < NV, other=0.0)[None, :]
            decay = _exp(tl.load(alog_ptr + hv, mask=hv < NV, other=0.0), LIBDEVICE)
            g = tl.where(m, -decay[None, :] * _softplus(aa, LIBDEVICE), 0.0)
            beta = tl.where(m, tl.math.div_rn(1.0, 1.0 + _exp(-bb.to(tl.float32), LIBDEVICE)),
                            0.0)
            base = gate_ptr + p[:, None] * NV + hv[None, :]
            om = pm[:, None] & (hv < NV)[None, :]
            tl.store(base, g, mask=om)
            tl.store(base + P * NV, beta, mask=om)
    else:  # row r's new conv state: the last K-1 inputs of its old state, then its tokens
        r = pid - NT
        first = tl.load(meta_ptr + 3 * P + r)
        n = tl.load(meta_ptr + 3 * P + R + r)
        if SLOTS:
            state_r = tl.load(slot_ptr + r)
        else:
            state_r = r
        for i in tl.static_range(K - 1):
            at = n - (K - 1) + i + lane * 0  # a vector: the interpreter masks with no scalar
            xi = tl.load(qkv_ptr + (first + at) * s_qkv + c, mask=cm & (at >= 0), other=0.0)
            si = tl.load(conv_ptr + (state_r * (K - 1) + (K - 1) + at) * C + c,
                         mask=cm & (at < 0), other=0.0)
            tl.store(new_ptr + (r * (K - 1) + i) * C + c, tl.where(at >= 0, xi, si), mask=cm)


def gdn_prompt_prep_triton(qkv, b, a, conv, conv_w, a_log, dt_bias, nk, dk, layout,
                           slots=None, block_t: int = 16):
    """Triton path, one launch: grid (⌈P / block_t⌉ + R, the 2·nk q/k heads + ⌈vg / dk⌉ v
    blocks); the last R programs of a column write the new conv states."""
    T, C = qkv.shape
    R, K1 = len(layout.lengths), conv.shape[1]
    nv, kg = b.shape[1], nk * dk
    vg = C - 2 * kg
    assert conv.shape[2] == C and conv.is_contiguous() and conv_w.shape == (K1 + 1, C)
    assert qkv.stride(1) == 1 and b.stride(1) == 1 and a.stride(1) == 1 and a.shape == b.shape
    assert conv_w.is_contiguous() and a_log.dtype == dt_bias.dtype == torch.float32
    assert (conv.shape[0] == R if slots is None else slots.shape == (R,))
    assert sum(layout.lengths) == T and vg % nv == 0
    assert conv.dtype == qkv.dtype == torch.bfloat16
    P = layout.padded
    assert P * C < 2**31, "int32 offsets"
    out = torch.empty(P * C, dtype=qkv.dtype, device=qkv.device)
    gates = torch.empty(2, P, nv, dtype=torch.float32, device=qkv.device)
    new = conv.new_empty(R, K1, C)
    bc = triton.next_power_of_2(dk)
    nt = triton.cdiv(P, block_t)
    _prompt_prep_kernel[(nt + R, 2 * nk + triton.cdiv(vg, bc))](
        qkv, b, a, conv, conv_w, a_log, dt_bias, layout.meta,
        layout.meta if slots is None else slots, out, gates, new, P, R, nt,
        qkv.stride(0), b.stride(0), a.stride(0), NK=nk, DK=dk, VG=vg, NV=nv, K=K1 + 1,
        BT=block_t, BC=bc, BLOCK_NV=triton.next_power_of_2(nv), LIBDEVICE=not interpreting(),
        SLOTS=slots is not None, num_warps=4)
    q = out[: P * kg].view(P, nk, dk)
    k = out[P * kg: 2 * P * kg].view(P, nk, dk)
    v = out[2 * P * kg: P * C].view(P, nv, vg // nv)
    return q, k, v, gates[0], gates[1], new


def gdn_prompt_prep(qkv, b, a, conv, conv_w, a_log, dt_bias, nk, dk, layout, slots=None):
    """Dispatching entry point; see the module docstring."""
    fn = gdn_prompt_prep_triton if use_triton(qkv) else gdn_prompt_prep_ref
    return fn(qkv, b, a, conv, conv_w, a_log, dt_bias, nk, dk, layout, slots)
