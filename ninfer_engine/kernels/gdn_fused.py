"""The small element-wise work around a decode step's Gated DeltaNet recurrence, fused.

`HybridStep._gdn` (models/qwen3_5_step.py) runs, for B sequences, `proj = x W_inᵀ` (q|k|v|z|b|a),
the causal depthwise conv + SiLU over q|k|v with the conv state shifted in place, the decay
`g` and `beta`, the recurrence (`gdn_decode`), then the gated RMSNorm; in torch these are
~15 tiny launches per layer. Here:

* `gdn_prep(proj, conv_state, conv_w, a_log, dt_bias, nk, dk, nv, dv, index)` — one launch:
  conv state shift (in place; row b's state is `conv_state[index[b]]`, a slot of the state
  pool, or `conv_state[b]` without `index`), conv + SiLU into fp32 q [B, nk, dk], k [B, nk, dk],
  v [B, nv, dv] (each contiguous), `g = −e^{a_log}·softplus(a + dt_bias)` and
  `beta = sigmoid(b)` [B, nv] fp32; also returns z [B, nv·dv] as a view of proj.
* `gdn_gated_norm(o, z, norm, eps, at)` — one launch: `o` [B, nv, dv] fp32 from the recurrence
  (or a prompt step's chunk-padded o, row b at `at[b]`) → bf16 [B, nv·dv],
  `norm · rmsnorm(o) · silu(z)` per value head.

Both round exactly where the torch code does (`*_ref` below is that code); the Triton paths
differ from it only in the last ulp of exp / division / the reduction order of the norm.
The kernels they launch and their device functions are in `kernels.gdn_fused_kernels`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from ._dispatch import interpreting, use_triton
from .gdn_fused_kernels import _gdn_gated_norm_kernel, _gdn_prep_kernel
from .pdl import pdl_launch


def gdn_prep_ref(proj, conv_state, conv_w, a_log, dt_bias, nk, dk, nv, dv, index=None,
                 trail=None, valid=None):
    """Torch reference: `_gdn`'s code between the input GEMV and the recurrence.

    proj [B·T, 2·nk·dk + 2·nv·dv + 2·nv] (q|k|v|z|b|a; T tokens a row, sequence-major),
    conv_state [S, K-1, C] updated in place at rows `index` [B] (default: rows 0..B-1, T = 1;
    C = 2·nk·dk + nv·dv), conv_w [K, C], a_log / dt_bias [nv] fp32; `trail`, `valid` as
    `gdn_prep_triton`'s. Returns (q [B·T, nk, dk], k [B·T, nk, dk], v [B·T, nv, dv],
    g [B·T, nv], beta [B·T, nv]) fp32 and z [B·T, nv·dv], a view of proj."""
    N = proj.shape[0]
    kg, vg = nk * dk, nv * dv
    qkv, z, b, a = proj.split([2 * kg + vg, vg, nv, nv], -1)
    rows = torch.arange(N, device=proj.device) if index is None else index
    T = N // rows.shape[0]
    conv = torch.empty(N, 2 * kg + vg, dtype=torch.float32, device=proj.device)
    live = (torch.full((rows.shape[0],), T, dtype=torch.int32) if valid is None
            else valid[: rows.shape[0]].cpu())
    for t in range(T):
        window = torch.cat([conv_state[rows], qkv[t::T, None]], 1)  # [B, K, C]
        keep = (live > t).to(conv_state.device)[:, None, None]  # a padding token shifts nothing
        conv_state[rows] = torch.where(keep, window[:, 1:], conv_state[rows])
        if trail is not None and t < T - 1:
            trail[t, : rows.shape[0]] = window[:, 1:]
        conv[t::T] = F.silu((window.float() * conv_w.float()).sum(1))
    q, k, v = conv.split([kg, kg, vg], -1)
    g = -a_log.exp() * F.softplus(a.float() + dt_bias)
    beta = torch.sigmoid(b.float())
    return (q.reshape(N, nk, dk), k.reshape(N, nk, dk), v.reshape(N, nv, dv), g, beta, z)


def gdn_gated_norm_ref(o, z, norm, eps, at=None):
    """Torch reference: `_gdn`'s gated RMSNorm. o [B, nv, dv] fp32 or bf16 (with `at` [B]: row
    b is o[at[b]], o any number of rows), z [B, nv·dv] bf16 (any view), norm [dv]. Returns
    bf16 [B, nv·dv]."""
    if at is not None:
        o = o.index_select(0, at)
    B, nv, dv = o.shape
    o = o.to(torch.bfloat16).float()
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
    o = (norm * o.to(torch.bfloat16) * F.silu(z.reshape(B, nv, dv).float()))
    return o.to(torch.bfloat16).reshape(B, nv * dv)


def gdn_prep_triton(proj, conv_state, conv_w, a_log, dt_bias, nk, dk, nv, dv, index=None,
                    trail=None, block_c=512, valid=None):
    """Triton path, one launch: grid (B, ⌈C / block_c⌉); the programs of channel block 0 also
    write g and beta. q, k, v, g, beta are views of one fp32 allocation, each contiguous.

    Rows of T > 1 tokens (`proj` holds B·T token rows, sequence-major; `index` B entries):
    each program walks its row's tokens in order, and where `trail` ([≥ T-1, ≥ B, K-1, C],
    contiguous) is given stores the window after each token but the last there. `valid` [B]
    int32, where given: row b's tokens from `valid[b]` on are padding (a prompt chunk padded
    to a captured step's length), convolved but never shifted into the state. A width-4 conv
    (the models') holds its window in registers across the row's tokens; other widths store
    each shifted tap and load it back a token."""
    N, width = proj.shape
    kg, vg = nk * dk, nv * dv
    C = 2 * kg + vg
    K = conv_w.shape[0]
    B = N if index is None else index.shape[0]
    T = N // B
    assert width == C + vg + 2 * nv and K >= 2 and N == B * T
    assert conv_state.shape[1:] == (K - 1, C) and conv_w.shape == (K, C)
    assert (conv_state.shape[0] == B if index is None else
            index.dim() == 1 and index.dtype == torch.long)
    assert a_log.shape == (nv,) and dt_bias.shape == (nv,)
    assert a_log.dtype == torch.float32 and dt_bias.dtype == torch.float32
    assert proj.stride(1) == 1 and conv_state.stride(2) == 1 and conv_w.is_contiguous()
    assert a_log.is_contiguous() and dt_bias.is_contiguous()
    if trail is not None:
        assert trail.is_contiguous() and trail.shape[2:] == (K - 1, C)
        assert trail.shape[0] >= T - 1 and trail.shape[1] >= B
    assert valid is None or (valid.dtype == torch.int32 and valid.shape[0] >= B)
    out = torch.empty(N * (C + 2 * nv), dtype=torch.float32, device=proj.device)
    block_c = min(block_c, triton.next_power_of_2(C))
    if B > 0:
        _gdn_prep_kernel[(B, triton.cdiv(C, block_c))](
            proj, conv_state, conv_state if index is None else index, conv_w, a_log, dt_bias,
            out, conv_state if trail is None else trail, conv_state if valid is None else valid,
            N, 0 if trail is None else trail.shape[1],
            proj.stride(0), conv_state.stride(0), conv_state.stride(1),
            KG=kg, VG=vg, NV=nv, K=K, BLOCK_C=block_c, BLOCK_NV=triton.next_power_of_2(nv),
            EVEN=C % block_c == 0, LIBDEVICE=not interpreting(), INDEXED=index is not None,
            T=T, TRAIL=trail is not None, VALID=valid is not None,
            num_warps=max(1, min(4, block_c // 128)), **pdl_launch(proj))
    q = out[: N * kg].view(N, nk, dk)
    k = out[N * kg: 2 * N * kg].view(N, nk, dk)
    v = out[2 * N * kg: N * C].view(N, nv, dv)
    g = out[N * C: N * (C + nv)].view(N, nv)
    beta = out[N * (C + nv):].view(N, nv)
    return q, k, v, g, beta, proj[:, C: C + vg]


def gdn_gated_norm_triton(o, z, norm, eps, at=None, rows_per_program: int | None = None):
    """Triton path, one launch over the B·nv (sequence, value head) rows, `rows_per_program`
    of them a program (default: one while they are few, as in a decode step, else 8). z may
    be any view with unit inner stride (e.g. `gdn_prep`'s slice of proj); `at` as the
    reference's."""
    B = z.shape[0]
    nv, dv = o.shape[1:]
    assert o.dtype in (torch.float32, torch.bfloat16) and o.is_contiguous()
    assert at is None and o.shape[0] == B or at is not None and at.shape == (B,)
    assert z.shape == (B, nv * dv) and z.stride(1) == 1 and z.dtype == torch.bfloat16
    assert norm.shape == (dv,) and norm.is_contiguous()
    prod = torch.promote_types(norm.dtype, torch.bfloat16)
    assert prod in (torch.bfloat16, torch.float32), norm.dtype
    out = torch.empty(B, nv * dv, dtype=torch.bfloat16, device=o.device)
    block = triton.next_power_of_2(dv)
    n_rows = B * nv
    rows = rows_per_program or (1 if n_rows < 4096 else 8)
    if B > 0:
        _gdn_gated_norm_kernel[(triton.cdiv(n_rows, rows),)](
            o, z, norm, out, o if at is None else at, n_rows, z.stride(0), eps, NV=nv, DV=dv,
            BLOCK=block, ROWS=rows, GATHER=at is not None, ROUND_PROD=prod == torch.bfloat16,
            LIBDEVICE=not interpreting(),
            num_warps=max(1, min(4, rows * block // 256)), **pdl_launch(o))
    return out


def gdn_prep(proj, conv_state, conv_w, a_log, dt_bias, nk, dk, nv, dv, index=None,
             trail=None, valid=None):
    """Dispatching entry point; see the module docstring."""
    if use_triton(proj):
        return gdn_prep_triton(proj, conv_state, conv_w, a_log, dt_bias, nk, dk, nv, dv, index,
                               trail, valid=valid)
    return gdn_prep_ref(proj, conv_state, conv_w, a_log, dt_bias, nk, dk, nv, dv, index, trail,
                        valid)


def gdn_gated_norm(o, z, norm, eps, at=None):
    """Dispatching entry point; see the module docstring."""
    return (gdn_gated_norm_triton if use_triton(o) else gdn_gated_norm_ref)(o, z, norm, eps, at)
