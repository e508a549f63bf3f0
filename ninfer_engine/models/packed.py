"""Quantized weights kept packed on the device, and the `linear` every projection goes through.

A `PackedMatrix` is a logical `[N, K]` weight made of row blocks, each in one encoding of
ninfer-format.md §2 held as its planes (`PackedBlock`): grouped integers Q4/Q5/Q6/Q8
(`base`, `high`, `scale`), nvfp4 (`codes`, row-major `scale`, divisor) or fp8-row (`codes`,
`scale`), the fp8 groups Q4/Q5 are served as (`serving_form`), or a plain `dense` tensor.
Fused decode groups whose members differ in encoding (the official 27B recipe stores q/k in Q4
and v/z in Q5) are one matrix of several blocks; neighbours in one encoding merge.

`load_projection` is `--cuda-weights`: "packed" keeps a projection as stored, "auto" serves
each block in its fastest measured form (`serving_form`), "dequant" decodes it to bf16.

`linear(x, w, fp8_act)`: with few rows (a decode batch) each block runs its fused dequant GEMV
into its column range of one output, so the weights are read once in their stored width; with
more rows (a prefill chunk) the matrix is dequantized to the activation dtype and multiplied by
cuBLAS, where the extra pass is small against the matmul — or, with `fp8_act`
(`--prefill-activations fp8`) for one fp8-row block, as e4m3 rows times its codes in the fp8
tensor cores (`kernels.fp8_rows_matmul`, as the grouped expert GEMMs' activations).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ..codecs import planes as stored, rowsplit
from ..kernels import dequant_gemv as fp8
from ..kernels import quant_gemv as qg
from ..kernels import fp8_rows_matmul as fp8_rows
from ..kernels.fp8_dequant import fp8_dequant

GEMV_MAX_ROWS = 16  # the fused GEMV kernels tile at most 16 rows
# text-config key of `--prefill-activations` (absent: fp8), set by the engine's loader: e4m3
# activations in a prompt step's fp8-row GEMMs (these projections', the grouped experts')
FP8_ACTIVATIONS_KEY = "ninfer_prefill_fp8_activations"
ROW_SPLIT = rowsplit.FORMATS  # q4_g64_fp16, q5_g64_fp16, q6_g64_fp16, q8_g32_fp16
NVFP4, FP8_ROW, DENSE = "nvfp4", "fp8_e4m3fn_row_bf16", "dense"
FP8_GROUPS = "fp8_groups"  # ours, not a file format: Q4/Q5 codes as e4m3 + their group scales
PACKED_FORMATS = frozenset(ROW_SPLIT) | {NVFP4, FP8_ROW}
# Q4/Q5 codes (|q| <= 16) are exact in e4m3, so `serving_form` repacks them losslessly into the
# fp8 GEMV's group-scaled form: one byte a weight, read by the kernel that beat cuBLAS bf16
# (27B decode, fp8-row: 93 tok/s against 67), where their own GEMVs ran at 0.25-0.9x cuBLAS
# bf16 (bench/results/h200-quant-gemv.md).
REPACK_FP8 = frozenset({"q4_g64_fp16", "q5_g64_fp16"})


def prefill_fp8(config: dict) -> bool:
    """The text config's `--prefill-activations` (absent: fp8)."""
    return config.get(FP8_ACTIVATIONS_KEY, True)


@dataclass(frozen=True)
class PackedBlock:
    """`rows` consecutive rows of `cols` columns in one encoding; planes are row-major, so a
    row range of the block is the same row range of every plane."""

    fmt: str
    rows: int
    cols: int
    planes: tuple[torch.Tensor, ...]
    divisor: float = 1.0  # nvfp4's d_w

    def slice(self, r0: int, r1: int) -> PackedBlock:
        return replace(self, rows=r1 - r0, planes=tuple(p[r0:r1] for p in self.planes))

    def to(self, device: torch.device | str) -> PackedBlock:
        return replace(self, planes=tuple(p.to(device) for p in self.planes))

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes)

    def gemv(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, cols] times this block transposed: [B, rows], written into `out` if given."""
        p = self.planes
        if self.fmt in ROW_SPLIT:
            spec = ROW_SPLIT[self.fmt]
            return qg.rowsplit_gemv(x, *p, spec.bits, spec.group, self.cols, out=out)
        if self.fmt == NVFP4:
            return qg.nvfp4_gemv(x, *p, self.divisor, out=out)
        fp8_codes = self.fmt in (FP8_ROW, FP8_GROUPS)
        y = fp8.dequant_gemv(x, *p) if fp8_codes else F.linear(x, p[0].to(x.dtype))
        return y if out is None else out.copy_(y)

    def dequantize(self, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        """The block as a `[rows, cols]` matrix in `dtype`, written into `out` if given."""
        p = self.planes
        if self.fmt in (FP8_ROW, FP8_GROUPS):
            return fp8_dequant(*p, dtype, out)
        if self.fmt in ROW_SPLIT:
            spec = ROW_SPLIT[self.fmt]
            w = qg.rowsplit_dequant(*p, spec.bits, spec.group, self.cols, dtype)
        elif self.fmt == NVFP4:
            w = qg.nvfp4_dequant(*p, self.divisor, dtype)
        else:
            w = p[0].to(dtype)
        return w if out is None else out.copy_(w)


class PackedMatrix:
    """A logical `[N, K]` weight stored as row blocks of (possibly different) encodings."""

    def __init__(self, blocks: tuple[PackedBlock, ...] | list[PackedBlock]):
        self.blocks = tuple(blocks)
        cols = {b.cols for b in self.blocks}
        assert len(cols) == 1, f"blocks of one matrix must share K, got {sorted(cols)}"
        self.shape = (sum(b.rows for b in self.blocks), cols.pop())
        self._scales: torch.Tensor | None = None  # one fp8-row block's as [1, N] fp32

    @classmethod
    def dense(cls, w: torch.Tensor) -> PackedMatrix:
        return cls([PackedBlock(DENSE, w.shape[0], w.shape[1], (w,))])

    @classmethod
    def cat(cls, parts: list) -> PackedMatrix:
        """Row concatenation of packed matrices and dense tensors (a fused decode group);
        neighbours in the same encoding merge into one block, so they run as one GEMV."""
        blocks: list[PackedBlock] = []
        for part in parts:
            for b in part.blocks if isinstance(part, PackedMatrix) else cls.dense(part).blocks:
                last = blocks[-1] if blocks else None
                if last is not None and (last.fmt, last.cols, last.divisor) == (
                        b.fmt, b.cols, b.divisor):
                    planes = tuple(torch.cat(pair) for pair in zip(last.planes, b.planes))
                    blocks[-1] = replace(last, rows=last.rows + b.rows, planes=planes)
                else:
                    blocks.append(b)
        return cls(blocks)

    def __getitem__(self, rows: slice) -> PackedMatrix:
        """Rows `[start, stop)` (a member of a fused group), sharing the planes."""
        r0, r1, step = rows.indices(self.shape[0])
        assert step == 1, "only contiguous row ranges"
        out, at = [], 0
        for b in self.blocks:
            lo, hi = max(r0, at), min(r1, at + b.rows)
            if lo < hi:
                out.append(b.slice(lo - at, hi - at))
            at += b.rows
        return PackedMatrix(out)

    @property
    def device(self) -> torch.device:
        return self.blocks[0].planes[0].device

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)

    def data_ptr(self) -> int:
        """Identity for weight-byte accounting (a view shares its parent's first plane)."""
        return self.blocks[0].planes[0].data_ptr()

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        if len(self.blocks) == 1:
            return self.blocks[0].dequantize(dtype)
        out = torch.empty(self.shape, dtype=dtype, device=self.device)
        at = 0
        for b in self.blocks:  # each block straight into its rows: no concatenation pass
            b.dequantize(dtype, out[at : at + b.rows])
            at += b.rows
        return out

    def linear(self, x: torch.Tensor, fp8_act: bool = False) -> torch.Tensor:
        """`x Wᵀ` for x `[..., K]`, in x's dtype (`fp8_act`: see the module docstring)."""
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)
        if x2.shape[0] > GEMV_MAX_ROWS:
            if (fp8_act and len(self.blocks) == 1 and self.blocks[0].fmt == FP8_ROW
                    and fp8_rows.takes(x2, *self.shape)):
                y = fp8_rows.fp8_rows_matmul(x2, self.blocks[0].planes[0], self._fp32_scales())
                return y.reshape(*lead, self.shape[0])
            return F.linear(x, self.dequantize(x.dtype))
        if len(self.blocks) == 1:
            return self.blocks[0].gemv(x2).reshape(*lead, self.shape[0])
        out = x2.new_empty((x2.shape[0], self.shape[0]))
        at = 0
        for b in self.blocks:
            b.gemv(x2, out[:, at : at + b.rows])
            at += b.rows
        return out.reshape(*lead, self.shape[0])

    def _fp32_scales(self) -> torch.Tensor:
        """The fp8-row block's scales as `torch._scaled_mm` takes them, [1, N] fp32: made on
        first use outside a CUDA graph's capture (there a kernel is recorded, not run) and
        kept, so a prompt step does not convert them again."""
        if self._scales is not None:
            return self._scales
        scales = self.blocks[0].planes[1].float()[None, :]
        if not (scales.is_cuda and torch.cuda.is_current_stream_capturing()):
            self._scales = scales
        return scales


def linear(x: torch.Tensor, w: torch.Tensor | PackedMatrix, fp8_act: bool = False) -> torch.Tensor:
    """`F.linear(x, w)` for a dense weight, the packed kernels for a `PackedMatrix`
    (`fp8_act`: `PackedMatrix.linear`'s)."""
    return w.linear(x, fp8_act) if isinstance(w, PackedMatrix) else F.linear(x, w)


def cat_rows(parts: list) -> torch.Tensor | PackedMatrix:
    """Row concatenation that stays dense unless a member is packed."""
    if any(isinstance(p, PackedMatrix) for p in parts):
        return PackedMatrix.cat(parts)
    return torch.cat(parts)


def block_from_bytes(fmt: str, raw: torch.Tensor, shape: tuple[int, int]) -> PackedBlock:
    """The planes of one whole encoded object (`raw`: its uint8 bytes, host memory)."""
    n, k = shape
    if fmt in ROW_SPLIT:
        return PackedBlock(fmt, n, k, tuple(stored.rowsplit_planes(raw, fmt, shape)))
    if fmt == NVFP4:
        codes, scale, divisor = stored.nvfp4_planes(raw, shape)
        return PackedBlock(fmt, n, k, (codes, scale), float(divisor))
    if fmt == FP8_ROW:
        return PackedBlock(fmt, n, k, stored.fp8_row_planes(raw, shape))
    raise ValueError(f"format {fmt!r} is not a packed weight format")


def load_packed(weights, name: str, shape: tuple[int, int],
                device: torch.device | str) -> PackedMatrix | None:
    """Binding `name` as a `PackedMatrix` on `device` when all its parts are whole rows of
    packed-format objects, else None (the caller dequantizes it with `weights.parameter`)."""
    row_parts = getattr(weights, "row_parts", None)
    parts = row_parts(name, shape) if row_parts is not None else None
    if not parts or any(fmt not in PACKED_FORMATS for fmt, *_ in parts):
        return None
    return PackedMatrix([block_from_bytes(fmt, raw, obj_shape).slice(r0, r1).to(device)
                         for fmt, obj_shape, r0, r1, raw in parts])


def quantize_packed(w: torch.Tensor, fmt: str) -> PackedMatrix:
    """`w` [N, K] encoded as `fmt` on its own device, with each format's reference encoder
    (the benchmark's random quantized models; tests)."""
    n, k = w.shape
    if fmt in ROW_SPLIT:
        return PackedMatrix([PackedBlock(fmt, n, k, tuple(stored.quantize_rowsplit(w, fmt)))])
    if fmt == NVFP4:
        codes, scale, divisor = stored.quantize_nvfp4(w)
        return PackedMatrix([PackedBlock(fmt, n, k, (codes, scale), float(divisor))])
    if fmt == FP8_ROW:
        return PackedMatrix([PackedBlock(fmt, n, k, fp8.quantize_fp8_row(w))])
    raise ValueError(f"format {fmt!r} is not a packed weight format")


def repack_fp8_groups(block: PackedBlock) -> PackedBlock:
    """A Q4/Q5 block as e4m3 codes `[N, K]` with its fp16 group scales, exactly."""
    spec = ROW_SPLIT[block.fmt]
    base, high, scale = block.planes
    codes = qg.rowsplit_dequant_ref(base, high, torch.ones_like(scale), spec.bits, spec.group,
                                    block.cols)  # the integer codes, as fp32
    return PackedBlock(FP8_GROUPS, block.rows, block.cols,
                       (codes.to(torch.float8_e4m3fn), scale))


def serving_form(w: PackedMatrix, dtype: torch.dtype) -> torch.Tensor | PackedMatrix:
    """How `--cuda-weights auto` serves a packed weight, block by block, in its fastest measured
    form: fp8-row as stored, Q4/Q5 repacked into fp8 groups (whole 128-column groups only),
    anything else dequantized to `dtype` (all dense: a plain tensor)."""
    blocks = []
    for b in w.blocks:
        if b.fmt in REPACK_FP8 and b.cols % 128 == 0:  # no padded columns to drop
            b = repack_fp8_groups(b)
        elif b.fmt not in (FP8_ROW, FP8_GROUPS):
            b = PackedBlock(DENSE, b.rows, b.cols, (b.dequantize(dtype),))
        blocks.append(b)
    if all(b.fmt == DENSE for b in blocks):
        return torch.cat([b.planes[0] for b in blocks])
    return PackedMatrix(blocks)


def load_projection(weights, name: str, shape: tuple[int, int], device, dtype,
                    mode: str) -> torch.Tensor | PackedMatrix | None:
    """A projection stored in a packed format, as `--cuda-weights` `mode` serves it: "packed"
    as stored, "auto" in its fastest form (`packed.serving_form`); None for "dequant" or a
    plain-format tensor (the caller decodes it)."""
    kept = load_packed(weights, name, shape, device) if mode != "dequant" else None
    if kept is None or mode == "packed":
        return kept
    return serving_form(kept, dtype)


_PROJECTIONS = {"query", "key", "value", "z", "a_projection", "b_projection", "output", "gate",
                "up", "down"}


def is_projection(name: str) -> bool:
    """Whether logical parameter `name` only ever reaches `packed.linear` (so it may stay
    packed): layer projections and the output head; not embeddings, norms, convolutions,
    routers (dense kernels) or routed experts (their own stacks and kernels: `models.experts`
    decides their form)."""
    if name == "text/output_head":
        return True
    return (name.startswith("text/layers/") and "/moe/experts/" not in name
            and name.rpartition("/")[2] in _PROJECTIONS)
