"""The v3 JSON directory: strict parsing and validation (ninfer-format.md §1.2).

Everything here is pure: bytes in, frozen records out. The records and the strict JSON codec
(``loads`` / ``dumps``) live in ``directory_records``; file access lives in ``container``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ..codecs import encodings
from . import verify
from .directory_records import (
    RAW_BYTES,
    TENSOR_ALIGNMENT,
    Directory,
    FileRecord,
    Part,
    ResourceObject,
    TensorObject,
    loads,
)
from .errors import ArtifactError

U64_MAX = (1 << 64) - 1
COMPONENTS = ("text", "vision", "mtp", "dflash", "dflash2", "decision")
POLICIES = ("A16Only", "AllowA8", "AllowA4")


def _members(value: object, required: set[str], optional: set[str], label: str) -> dict:
    if not isinstance(value, dict):
        raise ArtifactError(f"{label} must be a JSON object")
    missing, extra = required - value.keys(), value.keys() - required - optional
    if missing:
        raise ArtifactError(f"{label} is missing {', '.join(sorted(missing))}")
    if extra:
        raise ArtifactError(f"{label} has unknown member(s) {', '.join(sorted(extra))}")
    return value


def _int(value: object, label: str, minimum: int = 0) -> int:
    if type(value) is not int or not minimum <= value <= U64_MAX:
        raise ArtifactError(f"{label} must be an integer >= {minimum}")
    return value


def _str(value: object, label: str) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise ArtifactError(f"{label} must be a non-empty string")
    return value


def parse_object(value: object, index: int) -> TensorObject | ResourceObject:
    """Validate one object entry (``index`` is its position, for messages)."""
    label = f"objects[{index}]"
    kind = value.get("kind") if isinstance(value, dict) else None
    if kind == "tensor":
        _members(
            value, {"id", "kind", "shape", "format", "layout", "offset", "bytes"}, set(), label
        )
    elif kind == "resource":
        _members(value, {"id", "kind", "encoding", "offset", "bytes"}, set(), label)
    else:
        raise ArtifactError(f"{label} has unknown kind {kind!r}")
    oid = _str(value["id"], f"{label}.id")
    offset, size = _int(value["offset"], f"{oid} offset"), _int(value["bytes"], f"{oid} bytes", 1)
    if kind == "resource":
        if value["encoding"] != RAW_BYTES:
            raise ArtifactError(f"resource {oid} has unknown encoding {value['encoding']!r}")
        return ResourceObject(oid, offset, size)
    shape = value["shape"]
    if not isinstance(shape, list) or len(shape) > 16:
        raise ArtifactError(f"tensor {oid} shape must be a list of at most 16 dimensions")
    dims = tuple(_int(d, f"tensor {oid} shape", 1) for d in shape)
    fmt, layout = _str(value["format"], f"{oid} format"), _str(value["layout"], f"{oid} layout")
    try:
        expected_layout, expected = encodings.layout_of(fmt), encodings.encoded_size(fmt, dims)
    except ArtifactError as error:
        raise ArtifactError(f"tensor {oid}: {error.problem}") from None
    if layout != expected_layout:
        raise ArtifactError(
            f"tensor {oid}: format {fmt} needs layout {expected_layout}, not {layout}"
        )
    if size != expected:
        raise ArtifactError(
            f"tensor {oid}: bytes {size} != encoded size {expected} of {fmt} {list(dims)}"
        )
    if offset % TENSOR_ALIGNMENT:
        raise ArtifactError(f"tensor {oid}: offset {offset} is not {TENSOR_ALIGNMENT}-aligned")
    return TensorObject(oid, dims, fmt, layout, offset, size)


def _objects(values: object, payload_bytes: int) -> dict:
    if not isinstance(values, list) or not values:
        raise ArtifactError("objects must be a non-empty list")
    result: dict = {}
    end = 0
    for index, value in enumerate(values):
        obj = parse_object(value, index)
        if obj.id in result:
            raise ArtifactError(f'duplicate object id "{obj.id}"')
        if obj.offset < end:
            raise ArtifactError(
                f"object {obj.id} at {obj.offset} overlaps or is out of order (previous end {end})"
            )
        end = obj.offset + obj.bytes
        if end > payload_bytes:
            raise ArtifactError(
                f"object {obj.id} ends at {end}, past the payload ({payload_bytes} bytes)"
            )
        result[obj.id] = obj
    return result


def parse_binding(value: object, objects: Mapping, label: str) -> tuple[Part, ...]:
    """Resolve one binding to its parts, checking every parent and range."""

    def tensor(oid: object) -> TensorObject:
        found = objects.get(oid) if isinstance(oid, str) else None
        if not isinstance(found, TensorObject):
            raise ArtifactError(f'binding "{label}" refers to missing tensor {oid!r}')
        return found

    if isinstance(value, dict) and "object" in value:
        _members(value, {"object"}, set(), f'binding "{label}"')
        parent = tensor(value["object"])
        return (Part(parent.id, 0, parent.numel),)
    parts = _members(value, {"parts"}, set(), f'binding "{label}"')["parts"]
    if not isinstance(parts, list) or not parts:
        raise ArtifactError(f'binding "{label}" parts must be a non-empty list')
    result = []
    for part in parts:
        _members(part, {"object", "range"}, set(), f'binding "{label}" part')
        parent, bounds = tensor(part["object"]), part["range"]
        if not isinstance(bounds, list) or len(bounds) != 2:
            raise ArtifactError(f'binding "{label}" range must be [begin, end)')
        begin, end = (_int(b, f'binding "{label}" range') for b in bounds)
        if not begin < end <= parent.numel:
            raise ArtifactError(
                f'binding "{label}" range {bounds} is outside {parent.id} ({parent.numel} elements)'
            )
        result.append(Part(parent.id, begin, end))
    return tuple(result)


def _files(values: object) -> tuple[FileRecord, ...]:
    if not isinstance(values, list) or not values:
        raise ArtifactError("files must be a non-empty list")
    records = []
    for index, value in enumerate(values):
        _members(value, {"path", "payload_bytes"}, set(), f"files[{index}]")
        path = value["path"]
        if index == 0 and path is not None:
            raise ArtifactError("files[0].path must be null (the entry file)")
        if index and (
            _str(path, f"files[{index}].path") in (".", "..") or "/" in path or "\\" in path
        ):
            raise ArtifactError(f"files[{index}].path {path!r} must be a sibling file name")
        records.append(
            FileRecord(path, _int(value["payload_bytes"], f"files[{index}].payload_bytes"))
        )
    return tuple(records)


def _components(value: object, objects: Mapping) -> dict:
    if not isinstance(value, dict) or "text" not in value:
        raise ArtifactError("components must be an object with a text component")
    for name, component in value.items():
        if name not in COMPONENTS:
            raise ArtifactError(f'unknown component "{name}"')
        _members(component, {"config"}, {"target", "resources", "proposal"}, f"component {name}")
        if not isinstance(component["config"], dict):
            raise ArtifactError(f"component {name} config must be an object")
        if "target" in component and component["target"] not in value:
            raise ArtifactError(
                f"component {name} targets missing component {component['target']!r}"
            )
        resources = component.get("resources", {})
        if not isinstance(resources, dict):
            raise ArtifactError(f"component {name} resources must be an object")
        for role, oid in resources.items():
            if not isinstance(objects.get(oid) if isinstance(oid, str) else None, ResourceObject):
                raise ArtifactError(
                    f'resource "{role}" of {name} refers to missing resource object {oid!r}'
                )
        if "proposal" in component:
            proposal = _members(component["proposal"], {"domain"}, {"rows"}, f"{name} proposal")
            if name != "text" or proposal["domain"] not in ("full", "indexed"):
                raise ArtifactError(f"component {name} has an invalid proposal")
            if (proposal["domain"] == "indexed") != ("rows" in proposal):
                raise ArtifactError("an indexed proposal needs rows; a full one has none")
    return value


def _uses(value: object, bindings: Mapping, objects: Mapping) -> tuple[dict, ...]:
    if not isinstance(value, list):
        raise ArtifactError("uses must be a list")
    for use in value:
        _members(use, {"parameter", "input"}, {"activation_policy", "auxiliaries"}, "use")
        if use["parameter"] not in bindings:
            raise ArtifactError(f'use names missing binding "{use["parameter"]}"')
        _str(use["input"], "use input")
        if use.get("activation_policy", "A16Only") not in POLICIES:
            raise ArtifactError(f"unknown activation policy {use['activation_policy']!r}")
        auxiliaries = use.get("auxiliaries", {})
        if not isinstance(auxiliaries, dict):
            raise ArtifactError("use auxiliaries must be an object")
        for role, binding in auxiliaries.items():
            parse_binding(binding, objects, f"{use['parameter']}@{role}")
    return tuple(value)


def parse(data: bytes) -> Directory:
    """Validate a v3 directory; every violation is an ArtifactError."""
    return parse_root(loads(data))


def parse_root(value: object) -> Directory:
    """Validate an already-decoded v3 directory (e.g. one upgraded from v1/v2)."""
    root = _members(
        value,
        {"components", "objects", "bindings", "uses", "files"},
        {"metadata", "provenance"},
        "the directory root",
    )
    files = _files(root["files"])
    objects = _objects(root["objects"], sum(f.payload_bytes for f in files))
    if not isinstance(root["bindings"], dict):
        raise ArtifactError("bindings must be an object")
    bindings = {name: parse_binding(b, objects, name) for name, b in root["bindings"].items()}
    metadata, provenance = root.get("metadata", {}), root.get("provenance", {})
    if not isinstance(metadata, dict) or not isinstance(provenance, dict):
        raise ArtifactError("metadata and provenance must be objects")
    if "name" in metadata:
        _str(metadata["name"], "metadata.name")
    if verify.DIGEST_KEY in metadata:
        verify.check_digest_field(metadata[verify.DIGEST_KEY])
    return Directory(
        components=MappingProxyType(_components(root["components"], objects)),
        objects=MappingProxyType(objects),
        bindings=MappingProxyType(bindings),
        raw_bindings=MappingProxyType(root["bindings"]),
        uses=_uses(root["uses"], bindings, objects),
        files=files,
        metadata=metadata,
        provenance=provenance,
    )
