"""`row_split_k128_v1`: the grouped integer formats Q4/Q5/Q6 (G64) and Q8 (G32).

Layout (ninfer-format.md §2.1): a base plane of 32 bytes per group, a high-bit plane
(Q5: 8, Q6: 16 bytes per group) and an fp16 scale plane, each starting 256-aligned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .base import ArtifactError, align_up

LAYOUT = "row_split_k128_v1"
_ROWS_PER_CHUNK_ELEMENTS = 1 << 22  # encode in slices of ~4M elements to bound peak RAM
_FP16_TINY = torch.tensor([1], dtype=torch.int16).view(torch.float16)  # bit pattern 0x0001


@dataclass(frozen=True)
class RowSplitFormat:
    """One grouped integer format: code width, group size and bytes per group."""

    name: str
    bits: int
    group: int
    high_bytes: int

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    @property
    def qmin(self) -> int:
        return -self.qmax if self.bits == 8 else -self.qmax - 1  # Q8 never uses -128


FORMATS = {
    spec.name: spec
    for spec in (
        RowSplitFormat("q4_g64_fp16", 4, 64, 0),
        RowSplitFormat("q5_g64_fp16", 5, 64, 8),
        RowSplitFormat("q6_g64_fp16", 6, 64, 16),
        RowSplitFormat("q8_g32_fp16", 8, 32, 0),
    )
}


@dataclass(frozen=True)
class Geometry:
    """Plane offsets of one `[N, K]` row-split tensor."""

    spec: RowSplitFormat
    n: int
    k: int

    @property
    def k_pad(self) -> int:
        return align_up(self.k, 128)

    @property
    def gpr(self) -> int:
        return self.k_pad // self.spec.group

    @property
    def high_offset(self) -> int:
        return align_up(self.n * self.gpr * 32, 256)

    @property
    def scale_offset(self) -> int:
        return self.high_offset + align_up(self.n * self.gpr * self.spec.high_bytes, 256)

    @property
    def total(self) -> int:
        return self.scale_offset + self.n * self.gpr * 2


def geometry(spec: RowSplitFormat, shape: tuple[int, ...]) -> Geometry:
    """The geometry of ``shape``; row-split tensors are rank 2."""
    if len(shape) != 2:
        raise ArtifactError(f"format {spec.name} needs a rank-2 shape, got {list(shape)}")
    return Geometry(spec, shape[0], shape[1])


def encoded_size(spec: RowSplitFormat, shape: tuple[int, ...]) -> int:
    return geometry(spec, shape).total


def quantize(
    spec: RowSplitFormat, rows: torch.Tensor, k_pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference `grouped_absmax`: int16 codes `[n, gpr, G]` and fp16 scales `[n, gpr]`."""
    x = torch.zeros((rows.shape[0], k_pad), dtype=torch.float32, device=rows.device)
    x[:, : rows.shape[1]] = rows
    groups = x.view(x.shape[0], -1, spec.group)
    amax = groups.abs().amax(-1)
    if not bool(torch.isfinite(amax).all()):
        raise ArtifactError(f"cannot encode non-finite values as {spec.name}")
    scale = (amax / spec.qmax).to(torch.float16)
    if bool(torch.isinf(scale).any()):
        raise ArtifactError(f"values exceed the fp16 scale range of {spec.name}")
    scale = torch.where((scale == 0) & (amax > 0), _FP16_TINY.to(scale.device), scale)
    recip = torch.where(scale == 0, 0.0, 1.0 / scale.float())
    codes = torch.round(groups * recip.unsqueeze(-1)).clamp_(spec.qmin, spec.qmax)
    return codes.to(torch.int16), scale


def pack_planes(spec: RowSplitFormat, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Base and high planes (uint8, one row of bytes per group) for int16 codes `[..., G]`."""
    codes = codes.reshape(-1, spec.group)
    if spec.bits == 8:
        return codes.to(torch.int8).view(torch.uint8), codes.new_empty(
            (codes.shape[0], 0), dtype=torch.uint8
        )
    unsigned = codes & ((1 << spec.bits) - 1)
    low = unsigned & 0xF
    base = (low[:, 0::2] | (low[:, 1::2] << 4)).to(torch.uint8)
    high = unsigned >> 4
    if spec.bits == 6:  # lane i's bits 4 and 5 are stream bits 2i and 2i+1
        high = torch.stack((high & 1, high >> 1), -1).reshape(codes.shape[0], -1)
    weights = 1 << torch.arange(8, dtype=torch.int16, device=codes.device)
    stream = high.reshape(codes.shape[0], -1, 8) * weights
    return base, stream.sum(-1).to(torch.uint8)


def encode(spec: RowSplitFormat, tensor: torch.Tensor) -> bytes:
    """Quantize a rank-2 tensor with `grouped_absmax` and lay it out in its planes."""
    geo = geometry(spec, tuple(tensor.shape))
    out = np.zeros(geo.total, dtype=np.uint8)
    step = max(1, _ROWS_PER_CHUNK_ELEMENTS // max(1, geo.k_pad))
    for r0 in range(0, geo.n, step):
        r1 = min(geo.n, r0 + step)
        codes, scale = quantize(spec, tensor[r0:r1], geo.k_pad)
        base, high = pack_planes(spec, codes)
        groups0, groups1 = r0 * geo.gpr, r1 * geo.gpr
        out[groups0 * 32 : groups1 * 32] = base.numpy().reshape(-1)
        hb = spec.high_bytes
        if hb:
            out[geo.high_offset + groups0 * hb : geo.high_offset + groups1 * hb] = (
                high.numpy().reshape(-1)
            )
        scale_bytes = scale.contiguous().view(torch.uint8).numpy().reshape(-1)
        out[geo.scale_offset + groups0 * 2 : geo.scale_offset + groups1 * 2] = scale_bytes
    return out.tobytes()


def decode(
    spec: RowSplitFormat, raw: torch.Tensor, shape: tuple[int, ...], rows: tuple[int, int]
) -> torch.Tensor:
    """Dequantize rows ``[r0, r1)`` of the encoded uint8 tensor ``raw`` to float32 `[r1-r0, K]`."""
    geo = geometry(spec, shape)
    r0, r1 = rows
    g0, g1 = r0 * geo.gpr, r1 * geo.gpr
    base = raw[g0 * 32 : g1 * 32].view(-1, 32)
    if spec.bits == 8:
        codes = base.view(torch.int8).to(torch.float32)
    else:
        unsigned = torch.stack((base & 0xF, base >> 4), -1).view(-1, 64)
        if spec.high_bytes:
            hb = spec.high_bytes
            high = raw[geo.high_offset + g0 * hb : geo.high_offset + g1 * hb].view(-1, hb, 1)
            stream = ((high >> torch.arange(8, dtype=torch.uint8)) & 1).view(-1, hb * 8)
            if spec.bits == 6:
                pairs = stream.view(-1, 64, 2)
                stream = pairs[..., 0] | (pairs[..., 1] << 1)
            unsigned = unsigned | (stream << 4)
        signed = unsigned.to(torch.int16)
        signed = torch.where(signed > spec.qmax, signed - (1 << spec.bits), signed)
        codes = signed.to(torch.float32)
    scale = raw[geo.scale_offset + g0 * 2 : geo.scale_offset + g1 * 2].view(torch.float16)
    values = codes * scale.float().view(-1, 1)
    return values.view(r1 - r0, geo.k_pad)[:, : geo.k].contiguous()
