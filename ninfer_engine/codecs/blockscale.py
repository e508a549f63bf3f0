"""`block_scale_k16_m128x4_v1` (``nvfp4``): E2M1 codes, swizzled E4M3FN group scales, one divisor.

Layout (ninfer-format.md §2.2): ``N*K/2`` code bytes (low nibble = even k), the ``N*K/16``
scales at ``align_up(N*K/2, 256)`` in Blackwell 128x4 tiles, then the fp32 divisor ``d_w``;
``w = e2m1(code) * e4m3(scale) / d_w``.
"""

from __future__ import annotations

import torch

from .base import ArtifactError, align_up

FORMAT = "nvfp4"
LAYOUT = "block_scale_k16_m128x4_v1"
E2M1 = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)
# Midpoints between E2M1 magnitudes; a tie goes up only where the upper code is even (RNE).
_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
_TIE_UP = torch.tensor([False, True, False, True, False, True, False])


def _geometry(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) != 2 or shape[0] % 128 or shape[1] % 64:
        raise ArtifactError(
            f"format {FORMAT} needs a rank-2 [N % 128 == 0, K % 64 == 0] shape, got {list(shape)}"
        )
    return shape


def encoded_size(shape: tuple[int, ...]) -> int:
    n, k = _geometry(shape)
    return align_up(n * k // 2, 256) + n * k // 16 + 4


def swizzle(scales: torch.Tensor) -> torch.Tensor:
    """Natural ``[N, K/16]`` scale bytes → the stored 128x4-tile order (flat)."""
    n, groups = scales.shape
    return scales.reshape(n // 128, 4, 32, groups // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)


def unswizzle(stored: torch.Tensor, n: int, groups: int) -> torch.Tensor:
    """Stored scale bytes of ``n`` rows (whole tiles) → natural ``[n, groups]``."""
    return stored.reshape(n // 128, groups // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(n, groups)


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even E2M1 codes (uint8, sign in bit 3) of ``values``, saturating at 6."""
    magnitude = values.abs().unsqueeze(-1)
    # the nvfp4 KV codec encodes on the serving device
    midpoints, tie_up = _MIDPOINTS.to(values.device), _TIE_UP.to(values.device)
    code = ((magnitude > midpoints) | (tie_up & (magnitude == midpoints))).sum(-1)
    return (code + 8 * torch.signbit(values)).to(torch.uint8)


def encode(tensor: torch.Tensor) -> bytes:
    """Reference `nvfp4_absmax`: ``d_w = 6*448/max|W|``, scales ``e4m3(min(bmax*d_w/6, 448))``."""
    n, k = _geometry(tuple(tensor.shape))
    x = tensor.detach().cpu().float()
    amax = x.abs().amax()
    if not bool(torch.isfinite(amax)) or float(amax) == 0.0:
        raise ArtifactError(f"{FORMAT} needs finite values that are not all zero")
    divisor = torch.tensor(6 * 448, dtype=torch.float32) / amax
    blocks = x.view(n, k // 16, 16)
    scale = (blocks.abs().amax(-1) * divisor / 6).clamp_(max=448.0).to(torch.float8_e4m3fn)
    scale_bytes = scale.view(torch.uint8)
    scale_bytes = torch.where(scale_bytes == 0, 1, scale_bytes)  # a zero scale would lose the block
    scaled = blocks * divisor / scale_bytes.view(torch.float8_e4m3fn).float().unsqueeze(-1)
    codes = e2m1_codes(scaled).view(n, k)
    out = torch.zeros(encoded_size((n, k)), dtype=torch.uint8)
    out[: n * k // 2] = (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(-1)
    start = align_up(n * k // 2, 256)
    out[start : start + n * k // 16] = swizzle(scale_bytes)
    out[start + n * k // 16 :] = divisor.reshape(1).view(torch.uint8)
    return out.numpy().tobytes()


def decode(raw: torch.Tensor, shape: tuple[int, ...], rows: tuple[int, int]) -> torch.Tensor:
    """Rows ``[r0, r1)`` as float32 (the scales of the covering 128-row tiles are unswizzled)."""
    n, k = _geometry(shape)
    r0, r1 = rows
    start = align_up(n * k // 2, 256)
    divisor = raw[start + n * k // 16 :].view(torch.float32)[0]
    if not bool(torch.isfinite(divisor)) or float(divisor) <= 0:
        raise ArtifactError(f"{FORMAT} weight divisor {float(divisor)} is not finite and positive")
    t0, t1 = r0 // 128 * 128, -(-r1 // 128) * 128
    tile_bytes = k // 16
    stored = raw[start + t0 * tile_bytes : start + t1 * tile_bytes]
    scale_bytes = unswizzle(stored, t1 - t0, k // 16)[r0 - t0 : r1 - t0]
    if bool(((scale_bytes & 0x80) != 0).any() | (scale_bytes == 0x7F).any()):
        raise ArtifactError(f"{FORMAT} scales must be nonnegative finite E4M3FN values")
    packed = raw[r0 * k // 2 : r1 * k // 2].view(r1 - r0, k // 2)
    codes = torch.stack((packed & 0xF, packed >> 4), -1).view(r1 - r0, k)
    scale = scale_bytes.view(torch.float8_e4m3fn).float().repeat_interleave(16, 1)
    return E2M1[codes.long()] * scale / divisor
