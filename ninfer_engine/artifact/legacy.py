"""Open-time upgrade of legacy v1/v2 directories to v3 (ninfer-format.md §1.3, §4.4).

The mapping is upstream's deterministic ``upgrade_ninfer_v2_to_v3.py``: v2 spellings become v3
ones, object names become ids, fused parents are row-split into bindings and components get
the hard-coded official configs. Weight bytes are untouched, so the payload is read in place.
Not reproduced: ``uses`` (a W*A16 engine ignores them) and the upgrader's replacement chat
template (the file's own ``frontend/chat_template.jinja`` is used).
"""

from __future__ import annotations

from .directory_records import RAW_BYTES, loads
from .errors import ArtifactError
from .legacy_names import NameMapper

FORMATS = {
    "BF16": "bf16",
    "FP32": "fp32",
    "I32": "int32",
    "Q4G64_F16S": "q4_g64_fp16",
    "Q5G64_F16S": "q5_g64_fp16",
    "Q6G64_F16S": "q6_g64_fp16",
    "W8G32_F16S": "q8_g32_fp16",
    "NVFP4": "nvfp4",
    "FP8_E4M3FN_ROW_BF16S": "fp8_e4m3fn_row_bf16",
}
LAYOUTS = {
    "contiguous-le-v1": "contiguous_le_v1",
    "row-split-k128-v1": "row_split_k128_v1",
    "blockscale-k16-m128x4-v1": "block_scale_k16_m128x4_v1",
    "row-scale-v1": "row_scale_v1",
}
KNOWN = {
    ("qwen3.6-27b", "groupwise-int"),
    ("qwen3.6-27b", "nvfp4"),
    ("qwen3.8-27b", "groupwise-int"),
    ("qwen3.8-27b", "nvfp4"),
    ("qwen3.6-35b-a3b", "groupwise-int"),
}


def upgrade(version: int, text: bytes, payload_bytes: int) -> dict:
    """The v3 directory (as parsed JSON) equivalent to a v1/v2 directory."""
    root = loads(text)
    if version == 1:
        if not isinstance(root, dict) or set(root) != {"model_id", "objects"}:
            raise ArtifactError("v1 directory root must be exactly {model_id, objects}")
        identity = {"model_id": root["model_id"], "weights_id": "groupwise-int"}
    else:
        if not isinstance(root, dict) or set(root) != {"identity", "objects"}:
            raise ArtifactError("v2 directory root must be exactly {identity, objects}")
        identity = root["identity"]
    key = (
        (identity.get("model_id"), identity.get("weights_id"))
        if isinstance(identity, dict)
        else None
    )
    if key not in KNOWN:
        raise ArtifactError(
            f"unknown legacy v{version} model {key}: the upgrade shim knows only the official files"
        )
    if not isinstance(root["objects"], list) or not all(
        isinstance(o, dict) for o in root["objects"]
    ):
        raise ArtifactError(f"v{version} objects must be a list of objects")
    mapper = NameMapper(
        moe=key[0] == "qwen3.6-35b-a3b",
        dflash2=any(str(o.get("name", "")).startswith("dflash2/") for o in root["objects"]),
    )
    objects = [mapper.add(_object(value)) for value in root["objects"]]
    return {
        "components": mapper.components,
        "objects": objects,
        "bindings": mapper.bindings,
        "uses": [],
        "files": [{"path": None, "payload_bytes": payload_bytes}],
        "metadata": {"name": key[0]},
        "provenance": {
            "upgraded_from": {"version": version, "model_id": key[0], "weights_id": key[1]}
        },
    }


def _object(value: dict) -> dict:
    obj = {
        "id": value.get("name"),
        "kind": value.get("kind"),
        "offset": value.get("offset"),
        "bytes": value.get("bytes"),
    }
    if obj["kind"] == "tensor" and set(value) == {
        "name",
        "kind",
        "shape",
        "format",
        "layout",
        "offset",
        "bytes",
    }:
        if value["format"] not in FORMATS or value["layout"] not in LAYOUTS:
            raise ArtifactError(
                f"legacy tensor {obj['id']}: unknown format/layout"
                f" {value['format']!r}/{value['layout']!r}"
            )
        obj.update(
            shape=value["shape"], format=FORMATS[value["format"]], layout=LAYOUTS[value["layout"]]
        )
    elif obj["kind"] == "resource" and set(value) == {
        "name",
        "kind",
        "encoding",
        "offset",
        "bytes",
    }:
        if value["encoding"] != "raw-bytes-v1":
            raise ArtifactError(
                f"legacy resource {obj['id']} has unknown encoding {value['encoding']!r}"
            )
        obj["encoding"] = RAW_BYTES
    else:
        raise ArtifactError(f"legacy object {obj['id']!r} has an unknown kind or members")
    if not isinstance(obj["id"], str):
        raise ArtifactError("legacy object without a name")
    return obj
