"""The v3 JSON directory's records and its strict JSON codec (ninfer-format.md §1.2).

The frozen records (``TensorObject``, ``ResourceObject``, ``Part``, ``FileRecord``,
``Directory``) are what ``directory.parse`` produces and the writer collects; ``to_json`` gives
an object's directory entry back. ``loads`` / ``dumps`` turn the directory text into plain JSON
values and back, rejecting duplicate keys and NaN/Infinity; the validation of those values lives
in ``directory``. Everything here is pure: no file access.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ArtifactError

RAW_BYTES = "raw_bytes_v1"
TENSOR_ALIGNMENT = 256


@dataclass(frozen=True)
class TensorObject:
    id: str
    shape: tuple[int, ...]
    format: str
    layout: str
    offset: int
    bytes: int
    kind = "tensor"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "kind": "tensor",
            "shape": list(self.shape),
            "format": self.format,
            "layout": self.layout,
            "offset": self.offset,
            "bytes": self.bytes,
        }


@dataclass(frozen=True)
class ResourceObject:
    id: str
    offset: int
    bytes: int
    kind = "resource"

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "kind": "resource",
            "encoding": RAW_BYTES,
            "offset": self.offset,
            "bytes": self.bytes,
        }


@dataclass(frozen=True)
class Part:
    """Flat C-order logical elements ``[begin, end)`` of one parent tensor."""

    object: str
    begin: int
    end: int


@dataclass(frozen=True)
class FileRecord:
    path: str | None
    payload_bytes: int


@dataclass(frozen=True)
class Directory:
    components: Mapping[str, dict]
    objects: Mapping[str, TensorObject | ResourceObject]  # in payload order
    bindings: Mapping[str, tuple[Part, ...]]
    raw_bindings: Mapping[str, dict]
    uses: tuple[dict, ...]
    files: tuple[FileRecord, ...]
    metadata: dict
    provenance: dict

    @property
    def payload_bytes(self) -> int:
        return sum(f.payload_bytes for f in self.files)


def loads(data: bytes) -> object:
    """Parse JSON rejecting duplicate keys and NaN/Infinity."""
    try:
        return json.loads(
            data.decode("utf-8"), object_pairs_hook=_unique, parse_constant=_nonfinite
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ArtifactError(f"broken JSON directory: {error}") from None


def dumps(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _unique(pairs: list[tuple[str, object]]) -> dict:
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise ArtifactError(f'duplicate JSON key "{key}"')
        result[key] = value
    return result


def _nonfinite(token: str) -> None:
    raise ArtifactError(f"non-finite JSON number {token}")
