"""bf16 rows times an fp8-row weight in the fp8 tensor cores: a prompt step's projections under
`--prefill-activations fp8` (`models.packed.PackedMatrix.linear`).

`fp8_rows_matmul(x, codes, scale)`: x's rows become e4m3 codes with one power-of-two scale each
(`act_quant.quantize_rows`: each element within 2⁻⁴ of itself) and `torch._scaled_mm` multiplies
them by the weight's codes, both row scales applied to its fp32 sums, one rounding to bf16; no
bf16 copy of the weight is written (1.6–1.9× dequantize-then-cuBLAS on the 27B shapes,
bench/results/h100-prompt-fp8-dense.md). `takes(x, n, k)`: whether it runs here.
"""
from __future__ import annotations

import torch

from ._dispatch import interpreting, use_triton
from .act_quant import MAX_COLUMNS, quantize_rows


def takes(x: torch.Tensor, n: int, k: int) -> bool:
    """bf16 rows the quantizer holds (K ≤ its `MAX_COLUMNS`), dims `torch._scaled_mm` tiles
    (multiples of 16), on an sm89+ GPU with Triton, or the CPU under the interpreter (the
    tests': the quantizer interpreted, torch's CPU `_scaled_mm`)."""
    if x.dtype != torch.bfloat16 or n % 16 or k % 16 or k > MAX_COLUMNS:
        return False
    if use_triton(x):
        return torch.cuda.get_device_capability(x.device) >= (8, 9)
    return x.device.type == "cpu" and interpreting()


def fp8_rows_matmul(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] bf16 times an fp8-row weight (codes [N, K] e4m3, scale [1, N] fp32) transposed:
    [M, N] bf16."""
    q, q_scale = quantize_rows(x.contiguous())
    return torch._scaled_mm(q, codes.t(), scale_a=q_scale[:, None], scale_b=scale,
                            out_dtype=torch.bfloat16)
