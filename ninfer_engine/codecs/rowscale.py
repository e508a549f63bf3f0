"""`row_scale_v1` (``fp8_e4m3fn_row_bf16``): E4M3FN codes with one bf16 multiplier per row.

Layout (ninfer-format.md §2.3): ``N*K`` code bytes, zeros up to ``align_up(N*K, 256)``, then
``N`` bf16 row scales.
"""

from __future__ import annotations

import torch

from .base import ArtifactError, align_up

FORMAT = "fp8_e4m3fn_row_bf16"
LAYOUT = "row_scale_v1"
FP8_MAX = 448.0


def _rank2(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) != 2:
        raise ArtifactError(f"format {FORMAT} needs a rank-2 shape, got {list(shape)}")
    return shape


def encoded_size(shape: tuple[int, ...]) -> int:
    n, k = _rank2(shape)
    return align_up(n * k, 256) + 2 * n


def encode(tensor: torch.Tensor) -> bytes:
    """Reference `fp8_row_maxabs`: round to bf16, scale each row so its max maps to 448.
    Computed where ``tensor`` is (`ninfer synth --device cuda`), with the same bytes."""
    n, k = _rank2(tuple(tensor.shape))
    x = tensor.detach().to(torch.bfloat16).float()
    amax = x.abs().amax(1)
    if not bool(torch.isfinite(amax).all()):
        raise ArtifactError(f"cannot encode non-finite values as {FORMAT}")
    scale = (amax / FP8_MAX).to(torch.bfloat16)
    recip = torch.where(scale == 0, 0.0, 1.0 / scale.float())
    codes = (x * recip.unsqueeze(1)).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    out = torch.zeros(encoded_size((n, k)), dtype=torch.uint8, device=x.device)
    out[: n * k] = codes.view(torch.uint8).reshape(-1)
    out[align_up(n * k, 256) :] = scale.view(torch.uint8)
    return out.cpu().numpy().tobytes()


def decode(raw: torch.Tensor, shape: tuple[int, ...], rows: tuple[int, int]) -> torch.Tensor:
    """Rows ``[r0, r1)`` as float32; NaN codes are rejected."""
    n, k = _rank2(shape)
    r0, r1 = rows
    codes = raw[r0 * k : r1 * k].view(r1 - r0, k)
    if bool(((codes & 0x7F) == 0x7F).any()):
        raise ArtifactError(f"{FORMAT} tensor holds NaN codes")
    start = align_up(n * k, 256)
    scale = raw[start + 2 * r0 : start + 2 * r1].view(torch.bfloat16).float()
    return codes.view(torch.float8_e4m3fn).float() * scale.unsqueeze(1)
