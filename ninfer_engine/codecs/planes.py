"""The planes of a stored quantized tensor as torch tensors (ninfer-format.md §2.1-2.3), and the
reference encoders that produce them on any device.

One row of bytes per weight row in every plane, so rows `[r0, r1)` of the planes are the
planes of that row range:
* row-split Q4/Q5/Q6 (G = 64) and Q8 (G = 32), `[N, k]`, `K_pad = align_up(k, 128)`,
  `gpr = K_pad // G`: `base` uint8 `[N, gpr*32]`, `high` uint8 `[N, gpr*H]` (H = 0, 8, 16),
  `scale` fp16 `[N, gpr]`;
* nvfp4 `[N, K]`: `codes` uint8 `[N, K//2]`, `scale` uint8 `[N, K//16]` E4M3FN bits, row-major
  (unswizzled here), and the divisor `d_w`;
* fp8-row `[N, K]`: `codes` float8_e4m3fn `[N, K]`, `scale` bf16 `[N]`.
`*_planes` are zero-copy views of a file's bytes (except the unswizzled nvfp4 scales);
`quantize_*` run the formats' reference encoders on the weight's own device (the benchmark
draws quantized models on the GPU) and give the same planes as `encodings.encode`.
"""

from __future__ import annotations

import torch

from . import blockscale, encodings, rowsplit
from .base import align_up


def rowsplit_planes(raw_uint8, fmt_name, shape):
    """Zero-copy `(base, high, scale)` views of one encoded row-split tensor's bytes."""
    spec = rowsplit.FORMATS[fmt_name]
    geo = rowsplit.geometry(spec, tuple(shape))
    raw = encodings.byte_tensor(raw_uint8)
    assert raw.numel() == geo.total, (raw.numel(), geo.total)
    n, gpr, hb = geo.n, geo.gpr, spec.high_bytes
    base = raw[: n * gpr * 32].view(n, gpr * 32)
    high = raw[geo.high_offset : geo.high_offset + n * gpr * hb].view(n, gpr * hb)
    scale = raw[geo.scale_offset : geo.scale_offset + n * gpr * 2].view(torch.float16)
    return base, high, scale.view(n, gpr)


def nvfp4_planes(raw_uint8, shape):
    """`(codes, scale_rowmajor, d_w)` of one encoded nvfp4 tensor; the scales are unswizzled
    (a copy), the codes a view."""
    n, k = shape
    raw = encodings.byte_tensor(raw_uint8)
    assert raw.numel() == blockscale.encoded_size((n, k)), raw.numel()
    start = align_up(n * k // 2, 256)
    scale = blockscale.unswizzle(raw[start : start + n * k // 16], n, k // 16)
    d_w = float(raw[start + n * k // 16 :].view(torch.float32)[0])
    return raw[: n * k // 2].view(n, k // 2), scale.contiguous(), d_w


def quantize_rowsplit(w, fmt_name):
    """`grouped_absmax` of `[N, K]` `w` on its own device → `(base, high, scale)` planes."""
    spec = rowsplit.FORMATS[fmt_name]
    n, k = w.shape
    codes, scale = rowsplit.quantize(spec, w, align_up(k, 128))
    base, high = rowsplit.pack_planes(spec, codes)
    high = high.reshape(n, -1)[:, : scale.shape[1] * spec.high_bytes]  # Q4 packs zero bytes
    return base.reshape(n, -1), high.contiguous(), scale


def quantize_nvfp4(w, rows_per_chunk=2048):
    """`nvfp4_absmax` of `[N, K]` `w` on its own device → `(codes, scale_rowmajor, d_w)`;
    the same arithmetic as `blockscale.encode`."""
    n, k = w.shape
    x = w.detach().float()
    amax = x.abs().amax()
    divisor = torch.tensor(6 * 448, dtype=torch.float32, device=x.device) / amax
    codes = torch.empty(n, k // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(n, k // 16, dtype=torch.uint8, device=x.device)
    for r0 in range(0, n, rows_per_chunk):
        blocks = x[r0 : r0 + rows_per_chunk].view(-1, k // 16, 16)
        scale = (blocks.abs().amax(-1) * divisor / 6).clamp_(max=448.0).to(torch.float8_e4m3fn)
        sb = scale.view(torch.uint8)
        sb = torch.where(sb == 0, 1, sb)
        scaled = blocks * divisor / sb.view(torch.float8_e4m3fn).float().unsqueeze(-1)
        c = blockscale.e2m1_codes(scaled).view(-1, k)
        codes[r0 : r0 + rows_per_chunk] = c[:, 0::2] | (c[:, 1::2] << 4)
        scales[r0 : r0 + rows_per_chunk] = sb
    return codes, scales, float(divisor)


def fp8_row_planes(raw: torch.Tensor, shape: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    """`row_scale_v1` bytes -> (e4m3 codes [N, K], bf16 scales [N])."""
    n, k = shape
    start = align_up(n * k, 256)
    return (raw[: n * k].view(torch.float8_e4m3fn).view(n, k),
            raw[start : start + 2 * n].view(torch.bfloat16))
