"""Streaming writer of `.ninfer` v3 artifacts.

Tensors are encoded and appended to a temporary payload file as they arrive, so peak memory is
about one tensor; the SHA-256 of the payload is computed as it is appended and recorded as
``metadata.payload_sha256`` (see `verify`). ``close`` validates the directory with the reader's
own parser, writes every file (the continuation files, if the payload exceeds the per-file cap,
and the entry file) to a temporary of its own beside its target, and only then renames them
into place, the entry file last.

Every temporary has a unique name (``<target>.<random>.tmp``, ``….payload.tmp``), so two
writers of the same target never share a file: each publishes a whole artifact, the last rename
wins. A failed or aborted writer removes its temporaries and leaves the target untouched.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import os
import secrets
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Self

import torch

from ..codecs import encodings
from . import directory, framing
from .directory_records import RAW_BYTES, TENSOR_ALIGNMENT, ResourceObject, TensorObject, dumps
from .errors import ArtifactError
from .verify import DIGEST_KEY

_COPY_CHUNK = 1 << 24


class ArtifactWriter:
    """Build one artifact at ``path``; use as a context manager or call ``close()``."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        metadata: dict | None = None,
        components: dict,
        provenance: dict | None = None,
        file_payload_cap: int = framing.DEFAULT_FILE_PAYLOAD_CAP,
    ) -> None:
        self.path = Path(path)
        self._metadata = dict(metadata or {})
        self._components = copy.deepcopy(components)
        self._provenance = dict(provenance or {})
        self._cap = file_payload_cap // framing.PAYLOAD_ALIGNMENT * framing.PAYLOAD_ALIGNMENT
        if self._cap <= 0:
            raise ArtifactError(
                f"file payload cap must be at least {framing.PAYLOAD_ALIGNMENT} bytes"
            )
        self._objects: dict[str, dict] = {}
        self._records: dict[str, TensorObject | ResourceObject] = {}
        self._bindings: dict[str, dict] = {}
        self._size = 0
        self._tensor_count = 0
        self._digest = hashlib.sha256()  # of the logical payload, as it is appended
        self._temporaries: list[Path] = []  # published files not yet renamed into place
        self._payload_path, fd = _unique_temporary(self.path, ".payload.tmp")
        self._payload = os.fdopen(fd, "w+b")  # open until close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def add_tensor(self, name: str, tensor: torch.Tensor, format: str) -> str:
        """Encode ``tensor`` as ``format``, append it and bind ``name`` to it; returns its id."""
        self._check_free(name)
        data = encodings.encode(format, tensor)
        oid = f"weight/{self._tensor_count:06d}"
        offset = self._append(data, alignment=TENSOR_ALIGNMENT)
        self._record(
            {
                "id": oid,
                "kind": "tensor",
                "shape": list(tensor.shape),
                "format": format,
                "layout": encodings.layout_of(format),
                "offset": offset,
                "bytes": len(data),
            }
        )
        self._tensor_count += 1
        self._bind(name, {"object": oid})
        return oid

    def add_parts_binding(self, name: str, parts: Iterable[tuple[str, int, int]]) -> None:
        """Bind ``name`` to flat element ranges ``(object_id, begin, end)`` of existing tensors."""
        value = {"parts": [{"object": oid, "range": [begin, end]} for oid, begin, end in parts]}
        directory.parse_binding(value, self._records, name)
        self._bind(name, value)

    def add_alias(self, name: str, existing_name: str) -> None:
        """Bind ``name`` to exactly what ``existing_name`` is bound to (e.g. a tied head)."""
        if existing_name not in self._bindings:
            raise ArtifactError(f'cannot alias "{name}": missing binding "{existing_name}"')
        self._bind(name, copy.deepcopy(self._bindings[existing_name]))

    def add_resource(self, role: str, data: bytes, component: str = "text") -> str:
        """Append raw bytes as resource ``role`` of ``component``; returns its id."""
        if component not in self._components:
            raise ArtifactError(f'resource "{role}" targets missing component "{component}"')
        oid = f"resource/{component}/{role}"
        if oid in self._objects:
            raise ArtifactError(f'resource "{role}" of {component} is already written')
        offset = self._append(bytes(data), alignment=1)
        self._record(
            {
                "id": oid,
                "kind": "resource",
                "encoding": RAW_BYTES,
                "offset": offset,
                "bytes": len(data),
            }
        )
        self._components[component].setdefault("resources", {})[role] = oid
        return oid

    def close(self) -> None:
        """Validate the directory and publish the file(s); the temporary payload is removed."""
        if self._payload.closed:
            return
        try:
            self._publish()
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop everything written so far, temporaries included (idempotent)."""
        self._payload.close()
        self._payload_path.unlink(missing_ok=True)
        for temporary in self._temporaries:
            temporary.unlink(missing_ok=True)
        self._temporaries = []

    def _check_free(self, name: str) -> None:
        if name in self._bindings:
            raise ArtifactError(f'binding "{name}" is already defined')

    def _bind(self, name: str, value: dict) -> None:
        self._check_free(name)
        self._bindings[name] = value

    def _record(self, obj: dict) -> None:
        self._records[obj["id"]] = directory.parse_object(obj, len(self._objects))
        self._objects[obj["id"]] = obj

    def _append(self, data: bytes, alignment: int) -> int:
        if not data:
            raise ArtifactError("objects must have at least one byte")
        offset = framing.align_up(self._size, alignment)
        gap = b"\0" * (offset - self._size)
        self._payload.write(gap)
        self._payload.write(data)
        self._digest.update(gap)
        self._digest.update(data)
        self._size = offset + len(data)
        return offset

    def _root(self, sizes: list[int]) -> dict:
        root = {
            "components": self._components,
            "objects": list(self._objects.values()),
            "bindings": self._bindings,
            "uses": [],
            "files": [
                {
                    "path": None if i == 0 else framing.part_path_name(self.path.name, i),
                    "payload_bytes": s,
                }
                for i, s in enumerate(sizes)
            ],
        }
        root["metadata"] = {**self._metadata, DIGEST_KEY: self._digest.hexdigest()}
        if self._provenance:
            root["provenance"] = self._provenance
        return root

    def _publish(self) -> None:
        sizes = [
            min(self._cap, self._size - start) for start in range(0, max(self._size, 1), self._cap)
        ]
        text = dumps(self._root(sizes))
        directory.parse(text)
        text += b" " * (framing.payload_start(len(text)) - framing.HEADER.size - len(text))
        raw_id = uuid.uuid4().bytes
        self._payload.flush()
        written = []
        for index, size in enumerate(sizes[1:], start=1):
            header = framing.HEADER.pack(framing.PART_MAGIC, index, raw_id)
            target = self.path.with_name(framing.part_path_name(self.path.name, index))
            written.append((self._write_temporary(
                target, header.ljust(framing.PAYLOAD_ALIGNMENT, b"\0"), size,
                skip=sum(sizes[:index])), target))
        header = framing.HEADER.pack(framing.MAGIC, len(text), raw_id)
        written.append((self._write_temporary(self.path, header + text, sizes[0], skip=0),
                        self.path))
        for temporary, target in written:  # continuations first: the entry file names them
            os.replace(temporary, target)
            self._temporaries.remove(temporary)

    def _write_temporary(self, path: Path, head: bytes, size: int, skip: int) -> Path:
        """``head`` + payload ``[skip, skip + size)`` in a new temporary beside ``path``,
        flushed to disk; the caller renames it into place."""
        temporary, fd = _unique_temporary(path, ".tmp")
        self._temporaries.append(temporary)
        self._payload.seek(skip)
        with os.fdopen(fd, "wb") as out:
            out.write(head)
            remaining = size
            while remaining:
                chunk = self._payload.read(min(_COPY_CHUNK, remaining))
                if not chunk:
                    raise ArtifactError(f"payload ended early while writing {path.name}")
                out.write(chunk)
                remaining -= len(chunk)
            out.flush()
            os.fsync(out.fileno())  # the rename must never publish a file still in flight
        return temporary


def _unique_temporary(path: Path, suffix: str) -> tuple[Path, int]:
    """A new file ``<path>.<random><suffix>`` in ``path``'s directory (created exclusively,
    mode 0666 less the umask, as the target would get), and its descriptor."""
    for _ in range(100):
        candidate = path.with_name(f"{path.name}.{secrets.token_hex(4)}{suffix}")
        try:
            return candidate, os.open(candidate, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as error:
            raise ArtifactError(f"cannot write in {path.parent}: {error.strerror or error}",
                                path) from None
    raise OSError(errno.EEXIST, "no free temporary name", str(path))
