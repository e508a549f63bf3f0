"""`ninfer inspect`: an artifact's summary and payload verification, as data and as text."""

from __future__ import annotations

import argparse
import json
from collections import Counter

from ..artifact import verify
from ..artifact.container import Artifact, open_artifact
from ..artifact.directory_records import TensorObject
from ..artifact.errors import ArtifactError


def summary(artifact: Artifact) -> dict:
    """What ``ninfer inspect`` reports, as plain JSON-able data."""
    tensors = [o for o in artifact.objects.values() if isinstance(o, TensorObject)]
    resources = [o for o in artifact.objects.values() if not isinstance(o, TensorObject)]
    formats: dict[str, dict[str, int]] = {}
    for obj in tensors:
        entry = formats.setdefault(obj.format, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += obj.bytes
    whole = [
        parts[0].object
        for parts in artifact.bindings.values()
        if len(parts) == 1
        and parts[0].begin == 0
        and parts[0].end == artifact.objects[parts[0].object].numel
    ]
    return {
        "path": str(artifact.path),
        "version": artifact.version,
        "artifact_id": artifact.artifact_id,
        "name": artifact.name,
        "files": [{"path": f.path, "payload_bytes": f.payload_bytes} for f in artifact.files],
        "components": {
            name: {
                "config": c["config"],
                "resources": sorted(c.get("resources", {})),
                **({"target": c["target"]} if "target" in c else {}),
            }
            for name, c in artifact.components.items()
        },
        "objects": {
            "tensors": len(tensors),
            "resources": {"count": len(resources), "bytes": sum(o.bytes for o in resources)},
            "formats": dict(sorted(formats.items())),
        },
        "bindings": {
            "count": len(artifact.bindings),
            "whole_object": len(whole),
            "parts": len(artifact.bindings) - len(whole),
            "sharing_an_object": sum(n for n in Counter(whole).values() if n > 1),
            "by_component": dict(Counter(name.split("/", 1)[0] for name in artifact.bindings)),
        },
        "uses": len(artifact.uses),
    }


def verification(artifact: Artifact) -> dict:
    """What ``ninfer inspect --verify`` checked: ``{"status", "sha256", "line"}``, status one of
    ``payload_sha256`` (the recorded digest matches), ``published_sha256`` (no digest, but the
    whole file matches an official upstream file) or ``none``; a mismatch raises ArtifactError."""
    digest = verify.check_payload(artifact)
    if digest is not None:
        return {"status": "payload_sha256", "sha256": digest,
                "line": f"payload digest verified: SHA-256 {digest} "
                        f"(metadata.{verify.DIGEST_KEY})"}
    official = verify.published_entry(artifact)
    if official is None:
        return {"status": "none", "sha256": None,
                "line": f"no digest recorded (no metadata.{verify.DIGEST_KEY}); "
                        "only the structure was checked"}
    whole = verify.file_sha256(artifact.path)
    if whole != official.sha256:
        raise ArtifactError(
            f"no digest recorded, and the whole-file SHA-256 {whole[:16]}… does not match the "
            f"published {official.sha256[:16]}… of {official.name} ({official.size:,} bytes): "
            "the file is corrupt or modified", artifact.path)
    return {"status": "published_sha256", "sha256": whole,
            "line": f"no digest recorded; whole-file SHA-256 {whole} matches the published "
                    f"{official.name}"}


def _inspect(args: argparse.Namespace) -> int:
    with open_artifact(args.file) as artifact:
        checked = verification(artifact) if args.verify else None
        info = summary(artifact)
    if args.json:
        if checked is not None:
            info["verification"] = {k: checked[k] for k in ("status", "sha256")}
        print(json.dumps(info, indent=2))
        return 0
    payload = sum(f["payload_bytes"] for f in info["files"])
    print(f"{info['path']}: .ninfer v{info['version']}, artifact_id {info['artifact_id']}")
    print(f"name: {info['name']}")
    print(f"files: {len(info['files'])}, payload {payload:,} bytes")
    for name, component in info["components"].items():
        config = component["config"]
        target = f" -> {component['target']}" if "target" in component else ""
        print(
            f"component {name}{target}: {', '.join(config.get('architectures', []))}"
            f" ({config.get('model_type', '?')})"
        )
        print(f"  resources: {', '.join(component['resources']) or '-'}")
        print(f"  config: {json.dumps(config, sort_keys=True)}")
    objects = info["objects"]
    print(
        f"objects: {objects['tensors']} tensors, {objects['resources']['count']} resources "
        f"({objects['resources']['bytes']:,} bytes)"
    )
    for fmt, entry in objects["formats"].items():
        print(f"  {fmt:<22} {entry['count']:6d} tensors {entry['bytes']:>16,} bytes")
    b = info["bindings"]
    print(
        f"bindings: {b['count']} ({b['whole_object']} whole objects, {b['parts']} part ranges, "
        f"{b['sharing_an_object']} sharing an object); by component: "
        + ", ".join(f"{k} {v}" for k, v in b["by_component"].items())
    )
    print(f"uses: {info['uses']}")
    if checked is not None:
        print(checked["line"])
    return 0
