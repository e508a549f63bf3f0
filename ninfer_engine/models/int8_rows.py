"""`Int8Rows`: a weight quantized at load to int8 with one scale per output row, for CPU decode.

`--cpu-matmul int8` runs the few-row (decode) projections and the head through
`torch._weight_int8pack_mm`: symmetric absmax per row (`w ≈ q · s`, |q| ≤ 127), a quarter of
the bytes fp32 streams. The op's x86 kernels (AVX2, AVX-512) are vectorized only for bf16
activations and scales (fp32 and fp16 take a scalar loop, ~10x slower than an fp32 GEMV on
this CPU), so activations are rounded to bf16 on the way in and the output is bf16 widened
back: the same activation precision as `--cpu-matmul bf16`.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

INT8_MAX = 127
# the kernels step K by 8 (AVX2) or 16 (AVX-512) without a tail and use aligned loads of each
# activation row: K that is not a multiple of 16 reads past the row (or faults), so it is padded
K_ALIGN = 16
ACTIVATION = torch.bfloat16


def int8_available() -> str | None:
    """None when `torch._weight_int8pack_mm` runs here, else why it does not."""
    op = getattr(torch, "_weight_int8pack_mm", None)
    if op is None:
        return f"torch {torch.__version__} has no torch._weight_int8pack_mm (added in torch 2.3)"
    return _probe(op)


@functools.cache  # once per op object, not once per projection
def _probe(op) -> str | None:
    try:
        op(torch.ones(1, K_ALIGN, dtype=ACTIVATION), torch.ones(1, K_ALIGN, dtype=torch.int8),
           torch.ones(1, dtype=ACTIVATION))
    except Exception as exc:  # an op without a CPU kernel in this build
        return f"torch._weight_int8pack_mm failed on the CPU: {exc}"
    return None


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 [N, K], scales bf16 [N]) with `weight ≈ codes · scales[:, None]`; codes are
    rounded against the bf16-rounded scale the kernel multiplies by."""
    w = weight.float()
    scales = (w.abs().amax(dim=1) / INT8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    scales = scales.to(ACTIVATION)
    codes = torch.round(w / scales.float()[:, None]).clamp_(-INT8_MAX, INT8_MAX)
    return codes.to(torch.int8).contiguous(), scales


class Int8Rows:
    """`y = x Wᵀ` over int8 row-quantized `W` [N, K] via `torch._weight_int8pack_mm`."""

    dtype = torch.int8

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.device.type != "cpu":
            raise ValueError("int8 matmuls (--cpu-matmul int8) run on the CPU only")
        reason = int8_available()
        if reason is not None:
            raise RuntimeError(f"--cpu-matmul int8 is unavailable: {reason}; "
                               "use --cpu-matmul bf16 or fp32")
        self.in_features = weight.shape[1]
        self.pad = -self.in_features % K_ALIGN
        self.codes, self.scales = quantize_rows(F.pad(weight, (0, self.pad)) if self.pad
                                                else weight)

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight the kernel multiplies by (for tests and error measurements)."""
        w = self.codes.float() * self.scales.float()[:, None]
        return w[:, : self.in_features]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # a fresh contiguous bf16 copy: 64-byte aligned rows, as the kernel's aligned loads need
        a = x.to(ACTIVATION, memory_format=torch.contiguous_format, copy=True)
        if self.pad:
            a = F.pad(a, (0, self.pad))
        return torch._weight_int8pack_mm(a, self.codes, self.scales).to(x.dtype)
