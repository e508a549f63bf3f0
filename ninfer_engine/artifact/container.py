"""Reading `.ninfer` artifacts: framing checks, mmap-backed payload, binding resolution.

``open_artifact`` validates the whole directory and every file length up front; tensors are
decoded lazily, one binding at a time, straight from the memory map. Legacy v1/v2 files are
read through ``legacy.upgrade``, which maps their directory to v3 at open time.
"""

from __future__ import annotations

import math
import mmap
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Self

import torch

from ..codecs import encodings
from . import directory, framing, legacy
from .directory_records import Directory, FileRecord, Part, ResourceObject, TensorObject
from .errors import ArtifactError
from .writer import ArtifactWriter

__all__ = ["Artifact", "ArtifactError", "ArtifactWriter", "open_artifact"]


def open_artifact(path: str | os.PathLike) -> Artifact:
    """Open and validate a `.ninfer` file; every problem is one ArtifactError naming the file."""
    try:
        return Artifact(Path(path))
    except ArtifactError as error:
        raise error.at(path) from None
    except OSError as error:
        raise ArtifactError(f"cannot read: {error.strerror or error}", path) from None


class _Segment:
    """One file's payload, memory-mapped read-only (pages load on demand, nothing is copied)."""

    def __init__(self, path: Path, start: int, size: int) -> None:
        self.size = size
        with open(path, "rb") as handle:
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.view = memoryview(self._map)[start : start + size] if size else memoryview(b"")

    def close(self) -> None:
        try:
            self.view.release()
            if self._map is not None:
                self._map.close()
        except BufferError:  # a caller still holds a view; the map goes when it does
            pass


class Artifact:
    """An open artifact. ``version`` is the file's framing; v1/v2 directories are upgraded to v3."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._segments: list[_Segment] = []
        with open(path, "rb") as handle:
            header = handle.read(framing.HEADER.size)
            size = os.fstat(handle.fileno()).st_size
            self.version, json_bytes, raw_id = _check_entry_header(header)
            prefix = framing.HEADER.size if self.version == 3 else framing.LEGACY_HEADER.size
            if size < prefix + json_bytes:
                raise ArtifactError(
                    f"truncated: {size} bytes, the JSON directory alone needs {prefix + json_bytes}"
                )
            handle.seek(prefix)
            text = handle.read(json_bytes)
            start = framing.align_up(prefix + json_bytes, framing.PAYLOAD_ALIGNMENT)
            if handle.read(start - handle.tell()).strip(b"\0" if self.version == 3 else b"\0 "):
                raise ArtifactError("non-zero bytes between the JSON directory and the payload")
        if self.version == 3:
            self._dir: Directory = directory.parse(text)
        else:
            self._dir = directory.parse_root(
                legacy.upgrade(self.version, text, max(0, size - start))
            )
        self.payload_start = start  # offset of the entry file's payload
        self.artifact_id = str(uuid.UUID(bytes=raw_id)) if raw_id else None
        _check_length(path.name, size, start, self._dir.files[0])
        try:
            self._segments.append(_Segment(path, start, self._dir.files[0].payload_bytes))
            for index, record in enumerate(self._dir.files[1:], start=1):
                self._segments.append(
                    _open_part(path.with_name(record.path), index, raw_id, record)
                )
        except BaseException:
            self.close()
            raise
        self._starts = [0]
        for segment in self._segments:
            self._starts.append(self._starts[-1] + segment.size)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the memory maps; later reads raise ArtifactError."""
        for segment in self._segments:
            segment.close()
        self._segments = []

    @property
    def metadata(self) -> dict:
        return self._dir.metadata

    @property
    def name(self) -> str | None:
        return self._dir.metadata.get("name")

    @property
    def components(self) -> Mapping[str, dict]:
        return self._dir.components

    @property
    def objects(self) -> Mapping[str, TensorObject | ResourceObject]:
        return self._dir.objects

    @property
    def bindings(self) -> Mapping[str, tuple[Part, ...]]:
        return self._dir.bindings

    @property
    def provenance(self) -> dict:
        return self._dir.provenance

    @property
    def uses(self) -> tuple[dict, ...]:
        return self._dir.uses

    @property
    def files(self) -> tuple[FileRecord, ...]:
        return self._dir.files

    def payload_chunks(self, chunk: int) -> Iterator[memoryview]:
        """The logical payload, in order, as zero-copy views of at most ``chunk`` bytes (the
        caller releases each); continuation files follow the entry file."""
        for segment in list(self._segments) or _closed(self.path):
            for at in range(0, segment.size, chunk):
                yield segment.view[at : at + chunk]

    def config(self, component: str = "text") -> dict:
        """The normalized HF-style config of ``component``."""
        if component not in self._dir.components:
            raise ArtifactError(f'missing component "{component}"', self.path)
        return self._dir.components[component]["config"]

    def has_parameter(self, name: str) -> bool:
        return name in self._dir.bindings

    def parameter_numel(self, name: str) -> int:
        return sum(part.end - part.begin for part in self._parts(name))

    def parameter(
        self, name: str, shape: tuple[int, ...] | list[int], dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Decode binding ``name`` (only the parent rows it covers) and reshape it to ``shape``."""
        parts = self._parts(name)
        total = sum(part.end - part.begin for part in parts)
        if total != math.prod(shape):
            raise ArtifactError(
                f'binding "{name}" has {total} elements,'
                f" shape {list(shape)} has {math.prod(shape)}",
                self.path,
            )
        pieces = [self._decode_part(part) for part in parts]
        flat = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        return flat.reshape(tuple(shape)).to(dtype)

    def row_parts(
        self, name: str, shape: tuple[int, ...] | list[int]
    ) -> list[tuple[str, tuple[int, int], int, int, torch.Tensor]] | None:
        """Binding ``name`` of rank-2 ``shape`` as whole-row ranges of rank-2 objects:
        ``(format, object shape, r0, r1, object bytes as uint8)`` per part, or None when a part
        is not whole rows of a matrix with the same column count (then only `parameter` works).
        Lets an engine keep quantized rows in their stored encoding."""
        if len(shape) != 2:
            return None
        out = []
        for part in self._parts(name):
            obj = self._dir.objects[part.object]
            cols = shape[1]
            if len(obj.shape) != 2 or obj.shape[1] != cols or part.begin % cols or part.end % cols:
                return None
            raw = encodings.byte_tensor(self._span(obj.offset, obj.bytes))
            out.append((obj.format, tuple(obj.shape), part.begin // cols, part.end // cols, raw))
        return out

    def resource(self, role: str, component: str = "text") -> bytes:
        """The raw bytes of resource ``role`` (e.g. ``tokenizer.json``) of ``component``."""
        oid = self._dir.components.get(component, {}).get("resources", {}).get(role)
        if oid is None:
            raise ArtifactError(f'missing resource "{role}" in component "{component}"', self.path)
        obj = self._dir.objects[oid]
        return bytes(self._span(obj.offset, obj.bytes))

    def has_resource(self, role: str, component: str = "text") -> bool:
        return role in self._dir.components.get(component, {}).get("resources", {})

    def _parts(self, name: str) -> tuple[Part, ...]:
        parts = self._dir.bindings.get(name)
        if parts is None:
            raise ArtifactError(f'missing binding "{name}"', self.path)
        return parts

    def _decode_part(self, part: Part) -> torch.Tensor:
        obj = self._dir.objects[part.object]
        cols = obj.shape[-1] if obj.shape else 1
        r0, r1 = part.begin // cols, -(-part.end // cols)
        try:
            rows = encodings.decode(
                obj.format, self._span(obj.offset, obj.bytes), obj.shape, (r0, r1)
            )
        except ArtifactError as error:
            raise ArtifactError(f"tensor {obj.id}: {error.problem}", self.path) from None
        return rows.reshape(-1)[part.begin - r0 * cols : part.end - r0 * cols]

    def _span(self, offset: int, size: int) -> memoryview | bytearray:
        """Payload ``[offset, offset + size)``: a zero-copy view unless it straddles two files."""
        if not self._segments:
            raise ArtifactError("artifact is closed", self.path)
        out = bytearray()
        for segment, start in zip(self._segments, self._starts):
            lo, hi = max(offset, start), min(offset + size, start + segment.size)
            if lo >= hi:
                continue
            piece = segment.view[lo - start : hi - start]
            if hi - lo == size:
                return piece
            out += piece
        return out


def _closed(path: Path) -> list:
    raise ArtifactError("artifact is closed", path)


def _check_entry_header(header: bytes) -> tuple[int, int, bytes | None]:
    """(version, json_bytes, artifact_id or None for legacy files) of an entry header."""
    version = framing.LEGACY_MAGICS.get(header[:8], 3)
    size = framing.HEADER.size if version == 3 else framing.LEGACY_HEADER.size
    if len(header) < size:
        raise ArtifactError(f"truncated: {len(header)} bytes, shorter than the {size}-byte header")
    if version == 3 and header[:8] != framing.MAGIC:
        raise ArtifactError(f"not a .ninfer file (wrong magic {header[:8].hex(' ')})")
    json_bytes = framing.LEGACY_HEADER.unpack(header[:16])[1]
    if json_bytes == 0:
        raise ArtifactError("json_bytes is 0")
    return version, json_bytes, header[16:32] if version == 3 else None


def _check_length(name: str, size: int, start: int, record: FileRecord) -> None:
    expected = start + record.payload_bytes
    if size < expected:
        raise ArtifactError(
            f"truncated: {name} has {size} bytes, the directory requires {expected}"
        )
    if size > expected:
        raise ArtifactError(
            f"{name} has {size - expected} unexpected trailing bytes (expected {expected} bytes)"
        )


def _open_part(path: Path, index: int, raw_id: bytes, record: FileRecord) -> _Segment:
    try:
        with open(path, "rb") as handle:
            header = handle.read(framing.PAYLOAD_ALIGNMENT)
            size = os.fstat(handle.fileno()).st_size
    except OSError as error:
        raise ArtifactError(
            f"cannot read continuation {path.name}: {error.strerror or error}"
        ) from None
    if len(header) < framing.HEADER.size:
        raise ArtifactError(f"truncated continuation {path.name}")
    magic, part_index, part_id = framing.HEADER.unpack(header[: framing.HEADER.size])
    if magic != framing.PART_MAGIC or part_index != index:
        raise ArtifactError(
            f"{path.name} is not continuation {index} (magic {magic.hex(' ')}, index {part_index})"
        )
    if part_id != raw_id:
        raise ArtifactError(f"{path.name} belongs to another artifact (artifact_id differs)")
    if header[framing.HEADER.size :].strip(b"\0"):
        raise ArtifactError(f"{path.name}: non-zero bytes in the continuation header")
    _check_length(path.name, size, framing.PAYLOAD_ALIGNMENT, record)
    return _Segment(path, framing.PAYLOAD_ALIGNMENT, record.payload_bytes)
