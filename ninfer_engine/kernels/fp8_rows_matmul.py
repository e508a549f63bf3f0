"""bf16 rows times an fp8-row weight in the fp8 tensor cores: a prompt step's projections under
`--prefill-activations fp8` (`models.packed.PackedMatrix.linear`).

`fp8_rows_matmul(x, codes, scale)`: x's rows become e4m3 codes with one power-of-two scale each
(`act_quant.quantize_rows`: each element within 2⁻⁴ of itself) and `torch._scaled_mm` multiplies
them by the weight's codes, both row scales applied to its fp32 sums, one rounding to bf16; no
bf16 copy of the weight is written (1.6–1.9× dequantize-then-cuBLAS on the 27B shapes,
bench/results/h100-prompt-fp8-dense.md). `takes(x, n, k)`: whether it runs here — on a GPU
where a row-wise `torch._scaled_mm` runs: PyTorch's row-wise kernel is Hopper's (TMA), and
builds refuse it elsewhere ("Rowwise scaling is not currently supported on your device": sm89
and sm120 cards, pytorch#130359), so each device is asked once with a 16 × 16 product at its
first many-row product outside a CUDA graph's capture (`step.graph_capture.record_graph` runs
every step once eagerly before it captures it), and keeps the bf16 path if it refuses.
"""
from __future__ import annotations

import logging

import torch

from ._dispatch import has_e4m3, interpreting, use_triton
from .act_quant import MAX_COLUMNS, quantize_rows

log = logging.getLogger("ninfer.engine")
_ROWWISE: dict[int, bool] = {}  # CUDA device index -> a row-wise `_scaled_mm` runs there


def takes(x: torch.Tensor, n: int, k: int) -> bool:
    """bf16 rows the quantizer holds (K ≤ its `MAX_COLUMNS`), dims `torch._scaled_mm` tiles
    (multiples of 16), on a GPU where a row-wise `_scaled_mm` runs (`rowwise_runs`), or the
    CPU under the interpreter (the tests': the quantizer interpreted, torch's CPU one)."""
    if x.dtype != torch.bfloat16 or n % 16 or k % 16 or k > MAX_COLUMNS:
        return False
    if use_triton(x):
        return rowwise_runs(x.device)
    return x.device.type == "cpu" and interpreting()


def rowwise_runs(device: torch.device) -> bool:
    """Whether a row-wise `torch._scaled_mm` runs on this CUDA device (asked once; during a
    capture an unasked device answers no without asking)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    known = _ROWWISE.get(index)
    if known is not None:
        return known
    if not has_e4m3(index):  # no fp8 tensor cores
        _ROWWISE[index] = False
        return False
    if torch.cuda.is_current_stream_capturing():
        return False
    try:
        _probe(torch.device("cuda", index))
        _ROWWISE[index] = True
    except RuntimeError as error:
        log.info("prompt projections keep bf16 activations on cuda:%d: torch._scaled_mm with "
                 "row-wise scales does not run there (%s)", index, str(error).splitlines()[0])
        _ROWWISE[index] = False
    return _ROWWISE[index]


def _probe(device: torch.device) -> None:
    """A 16 × 16 row-wise scaled product on `device`; raises where it does not run."""
    codes = torch.zeros(16, 16, dtype=torch.float8_e4m3fn, device=device)
    ones = torch.ones(16, 1, dtype=torch.float32, device=device)
    torch._scaled_mm(codes, codes.t(), scale_a=ones, scale_b=ones.t(), out_dtype=torch.bfloat16)


def fp8_rows_matmul(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] bf16 times an fp8-row weight (codes [N, K] e4m3, scale [1, N] fp32) transposed:
    [M, N] bf16."""
    q, q_scale = quantize_rows(x.contiguous())
    return torch._scaled_mm(q, codes.t(), scale_a=q_scale[:, None], scale_b=scale,
                            out_dtype=torch.bfloat16)
