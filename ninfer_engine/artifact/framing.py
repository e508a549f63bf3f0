"""Byte framing shared by the reader and the writer (ninfer-format.md §1.1)."""

from __future__ import annotations

import struct

from ..codecs.base import align_up

MAGIC = b"NINFER\x00\x03"
PART_MAGIC = b"NINPRT\x00\x03"
LEGACY_MAGICS = {b"NINFER\x00\x01": 1, b"NINFER\x00\x02": 2}
HEADER = struct.Struct("<8sQ16s")  # magic, json_bytes (or part_index), artifact_id
LEGACY_HEADER = struct.Struct("<8sQ")
PAYLOAD_ALIGNMENT = 4096
DEFAULT_FILE_PAYLOAD_CAP = 32_000_000_000


def payload_start(json_bytes: int) -> int:
    """Offset of the entry file's payload: the header and JSON rounded up to 4096."""
    return align_up(HEADER.size + json_bytes, PAYLOAD_ALIGNMENT)


def part_path_name(entry_name: str, index: int) -> str:
    """File name of continuation ``index`` (>= 1) of ``entry_name``."""
    return f"{entry_name}.part-{index:04d}"
