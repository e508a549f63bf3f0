"""An `ArtifactWriter` that also takes a large tensor as a stream of row blocks.

The contiguous, row-split (Q4–Q8) and row-scale (FP8) layouts are row-planar: each is one to
three planes holding a fixed number of bytes per row, every plane starting 256-aligned. A block
of rows is encoded on its own and its plane slices are placed at the rows' offsets: the first
plane is appended as it comes, the later (smaller) planes are kept until the first one ends. So
a 2.5 GB embedding never exists in memory at once. NVFP4 has one scale per tensor, so its
blocks are gathered into the whole tensor first.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..codecs import encodings, rowscale, rowsplit
from .errors import ArtifactError
from .framing import align_up
from .writer import ArtifactWriter

_PLANE_ALIGNMENT = 256  # planes start 256-aligned (ninfer-format.md §2)


def row_planes(format: str, shape: tuple[int, ...]) -> list[int] | None:
    """Bytes per row of each plane of a row-planar ``format``; None for other layouts."""
    layout = encodings.layout_of(format)
    if layout == encodings.CONTIGUOUS:
        return [encodings.encoded_size(format, shape) // shape[0]]
    if layout == rowsplit.LAYOUT:
        geo = rowsplit.geometry(rowsplit.FORMATS[format], shape)
        return [geo.gpr * 32, geo.gpr * geo.spec.high_bytes, geo.gpr * 2]
    if layout == rowscale.LAYOUT:
        return [shape[1], 2]
    return None


class StreamingWriter(ArtifactWriter):
    """`ArtifactWriter` plus `add_rows`."""

    def add_rows(
        self, name: str, shape: tuple[int, ...], format: str, blocks: Iterable[torch.Tensor]
    ) -> str:
        """Bind ``name`` to a tensor of ``shape`` given as consecutive row blocks; returns its id.

        The stored bytes equal those of ``add_tensor`` on the whole tensor.
        """
        planes = row_planes(format, shape)
        if planes is None:
            return self.add_tensor(name, _gather(shape, blocks), format)
        self._check_free(name)
        later: list[list[bytes]] = [[] for _ in planes[1:]]
        offset, rows = None, 0
        for block in blocks:
            data, m = memoryview(encodings.encode(format, block)), block.shape[0]
            at = 0
            for p, per_row in enumerate(planes):
                piece = data[at : at + m * per_row]
                at = align_up(at + m * per_row, _PLANE_ALIGNMENT)
                if p:
                    later[p - 1].append(bytes(piece))  # a copy, so the block can be freed
                elif piece:
                    start = self._append(piece, _PLANE_ALIGNMENT if offset is None else 1)
                    offset = start if offset is None else offset
            rows += m
        if offset is None or rows != shape[0]:
            raise ArtifactError(f'row blocks of "{name}" do not add up to {list(shape)}')
        end = offset + rows * planes[0]
        for pieces in later:
            for i, piece in enumerate(p for p in pieces if p):
                end = self._append(piece, _PLANE_ALIGNMENT if i == 0 else 1) + len(piece)
        size = end - offset
        if size != encodings.encoded_size(format, shape):
            raise ArtifactError(f'"{name}": {size} bytes written for {list(shape)} {format}')
        oid = f"weight/{self._tensor_count:06d}"
        self._record({"id": oid, "kind": "tensor", "shape": list(shape), "format": format,
                      "layout": encodings.layout_of(format), "offset": offset, "bytes": size})
        self._tensor_count += 1
        self._bind(name, {"object": oid})
        return oid


def _gather(shape: tuple[int, ...], blocks: Iterable[torch.Tensor]) -> torch.Tensor:
    """The whole (rank-2, as nvfp4 is) tensor, filled block by block."""
    out, row = None, 0
    for block in blocks:
        if out is None:
            out = torch.empty(shape, dtype=block.dtype)
        out[row : row + block.shape[0]] = block
        row += block.shape[0]
    if out is None or row != shape[0]:
        raise ArtifactError(f"row blocks do not add up to {list(shape)}")
    return out
