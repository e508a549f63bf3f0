"""Tensor format registry: encoded sizes, reference encoders and float32 decoders.

``decode`` accepts any buffer (``bytes``, ``memoryview`` over an mmap, numpy array) and an
optional row range over the tensor viewed as ``[rows, shape[-1]]``, so a binding that needs a
few rows of a large fused parent never dequantizes the whole parent.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import blockscale, rowscale, rowsplit
from .base import ArtifactError

CONTIGUOUS = "contiguous_le_v1"

# Formats seen only in forks of upstream: refused with their name (ninfer-format.md §2.4).
REFUSED = {
    "t2_g128_fp16": "ternary t2_g128_fp16 is a fork-only format",
    "fp8_e4m3fn": "direct fp8_e4m3fn (without row scales) is a fork-only format",
    "expert_block_scale_k16_m128x4_v1": "the NVFP4 expert-bank layout is fork-only",
}


@dataclass(frozen=True)
class Codec:
    """One format: its layout, its size rule, its encoder and its row-range decoder."""

    format: str
    layout: str
    size: Callable[[tuple[int, ...]], int]
    encode: Callable[[torch.Tensor], bytes]
    decode: Callable[[torch.Tensor, tuple[int, ...], tuple[int, int]], torch.Tensor]


def _contiguous(name: str, dtype: torch.dtype, width: int) -> Codec:
    def encode(tensor: torch.Tensor) -> bytes:
        words = tensor.detach().to("cpu", dtype).contiguous().view(torch.uint8)
        return words.numpy().tobytes()

    def decode(raw: torch.Tensor, shape: tuple[int, ...], rows: tuple[int, int]) -> torch.Tensor:
        cols = shape[-1] if shape else 1
        words = raw[rows[0] * cols * width : rows[1] * cols * width].view(dtype).view(-1, cols)
        return words.to(torch.int32 if dtype == torch.int32 else torch.float32, copy=True)

    return Codec(name, CONTIGUOUS, lambda shape: math.prod(shape) * width, encode, decode)


def _row_split(spec: rowsplit.RowSplitFormat) -> Codec:
    return Codec(
        spec.name,
        rowsplit.LAYOUT,
        lambda shape: rowsplit.encoded_size(spec, shape),
        lambda tensor: rowsplit.encode(spec, tensor.detach().cpu()),
        lambda raw, shape, rows: rowsplit.decode(spec, raw, shape, rows),
    )


CODECS: dict[str, Codec] = {
    codec.format: codec
    for codec in (
        _contiguous("bf16", torch.bfloat16, 2),
        _contiguous("fp32", torch.float32, 4),
        _contiguous("int32", torch.int32, 4),
        *(_row_split(spec) for spec in rowsplit.FORMATS.values()),
        Codec(
            rowscale.FORMAT,
            rowscale.LAYOUT,
            rowscale.encoded_size,
            rowscale.encode,
            rowscale.decode,
        ),
        Codec(
            blockscale.FORMAT,
            blockscale.LAYOUT,
            blockscale.encoded_size,
            blockscale.encode,
            blockscale.decode,
        ),
    )
}


def codec(format: str) -> Codec:
    """The codec of ``format``; unknown and fork-only formats raise ArtifactError."""
    found = CODECS.get(format)
    if found is not None:
        return found
    if format in REFUSED:
        raise ArtifactError(f'unsupported format "{format}": {REFUSED[format]}')
    raise ArtifactError(f'unknown format "{format}"')


def layout_of(format: str) -> str:
    return codec(format).layout


def encoded_size(format: str, shape: tuple[int, ...] | list[int]) -> int:
    """Bytes of one encoded tensor of logical ``shape``."""
    return codec(format).size(tuple(shape))


def encode(format: str, tensor: torch.Tensor) -> bytes:
    """Encode ``tensor`` (its shape is the logical shape) with the format's reference encoder."""
    return codec(format).encode(tensor)


def row_count(shape: tuple[int, ...]) -> int:
    """Rows of the ``[rows, shape[-1]]`` view that row ranges refer to."""
    return math.prod(shape[:-1]) if shape else 1


def decode(
    format: str,
    buffer: object,
    shape: tuple[int, ...] | list[int],
    rows: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Decode an encoded tensor to float32 (``int32`` stays int32, exactly).

    Without ``rows`` the result has ``shape``; with ``rows=(r0, r1)`` it is ``[r1-r0, shape[-1]]``.
    """
    shape = tuple(int(d) for d in shape)
    found = codec(format)
    size = found.size(shape)
    raw = byte_tensor(buffer)
    if raw.numel() != size:
        raise ArtifactError(
            f"{format} tensor {list(shape)} needs {size} bytes, buffer has {raw.numel()}"
        )
    total = row_count(shape)
    r0, r1 = (0, total) if rows is None else rows
    if not 0 <= r0 < r1 <= total:
        raise ArtifactError(f"row range [{r0}, {r1}) is outside {list(shape)}")
    values = found.decode(raw, shape, (r0, r1))
    return values.view(shape) if rows is None else values


def byte_tensor(buffer: object) -> torch.Tensor:
    """A zero-copy uint8 view of ``buffer``; decoders only read it, so read-only is fine."""
    if isinstance(buffer, torch.Tensor):
        return buffer.view(torch.uint8).reshape(-1)
    view = memoryview(buffer).cast("B")
    if view.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")  # never written to
        return torch.frombuffer(view, dtype=torch.uint8)
