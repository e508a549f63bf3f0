"""Legacy object names → v3 components and bindings, with every known official shape checked.

Upstream's ``upgrade_ninfer_v2_to_v3.py`` mapping: fused parents (``attention/query_key``,
``moe/routed_gate_up``…) become row-range bindings, ``mtp/layer/`` becomes ``mtp/layers/0/`` and
``text/draft_head*`` becomes ``proposal/*``.
"""

from __future__ import annotations

import math
import re

from .errors import ArtifactError
from .legacy_configs import draft_config, text_config, vision_config

VISION_ROLES = ("preprocessor_config.json", "video_preprocessor_config.json")
_VISION_LAYER = {
    "attention/output": (1152, 1152),
    "attention/output_bias": (1152,),
    "mlp/fc1": (4304, 1152),
    "mlp/fc1_bias": (4304,),
    "mlp/fc2": (1152, 4304),
    "mlp/fc2_bias": (1152,),
    "norm1/weight": (1152,),
    "norm1/bias": (1152,),
    "norm2/weight": (1152,),
    "norm2/bias": (1152,),
}


class NameMapper:
    """Turns legacy object names into v3 components and bindings, checking every known shape."""

    def __init__(self, moe: bool, dflash2: bool) -> None:
        self.moe = moe
        text = text_config(moe)
        self.components: dict = {
            "text": {
                "config": text,
                "resources": {},
                "proposal": {"domain": "indexed", "rows": 131072},
            },
            "vision": {"config": vision_config(moe), "target": "text", "resources": {}},
            "mtp": {
                "config": {"architectures": ["Qwen3_5MoeMTP" if moe else "Qwen3_5MTP"]},
                "target": "text",
            },
        }
        if moe:
            self.components["dflash"] = {"config": draft_config(False), "target": "text"}
        if dflash2:
            self.components["dflash2"] = {"config": draft_config(True), "target": "text"}
        self.bindings: dict = {}
        self.h, self.vocab, self.layers = (
            text["hidden_size"],
            text["vocab_size"],
            text["num_hidden_layers"],
        )
        self.q, self.kv = text["num_attention_heads"] * 256, text["num_key_value_heads"] * 256
        self.nv = text["linear_num_value_heads"]
        self.vg = self.nv * 128

    def add(self, obj: dict) -> dict:
        name = obj["id"]
        if obj["kind"] == "resource":
            role = name.removeprefix("frontend/")
            if role == name:
                raise ArtifactError(f"unknown legacy resource {name}")
            self.components["vision" if role in VISION_ROLES else "text"]["resources"][role] = name
        elif not name.endswith(
            "/input_scale_divisor"
        ):  # NVFP4 activation divisors only feed `uses`
            self._tensor(obj)
        return obj

    def _put(self, name: str, obj: dict, shape: tuple[int, ...], begin: int | None = None) -> None:
        if name in self.bindings:
            raise ArtifactError(f"legacy object {obj['id']} maps to {name} twice")
        if begin is None:
            if tuple(obj["shape"]) != tuple(shape):
                raise ArtifactError(
                    f"legacy tensor {obj['id']} has shape {obj['shape']}, expected {list(shape)}"
                )
            self.bindings[name] = {"object": obj["id"]}
        else:
            end = begin + math.prod(shape)
            if end > math.prod(obj["shape"]):
                raise ArtifactError(f"legacy tensor {obj['id']} is too small for {name}")
            self.bindings[name] = {"parts": [{"object": obj["id"], "range": [begin, end]}]}

    def _split(self, obj: dict, entries: list[tuple[str, int]], width: int) -> None:
        rows = sum(count for _, count in entries)
        if tuple(obj["shape"]) != (rows, width):
            raise ArtifactError(
                f"legacy tensor {obj['id']} has shape {obj['shape']}, expected {[rows, width]}"
            )
        cursor = 0
        for name, count in entries:
            self._put(name, obj, (count, width), cursor * width)
            cursor += count

    def _tensor(self, obj: dict) -> None:
        name, h = obj["id"], self.h
        if name in ("text/token_embedding", "text/output_head"):
            return self._put(name, obj, (self.vocab, h))
        if name == "text/final_norm" or name in (
            "mtp/embedding_norm",
            "mtp/hidden_norm",
            "mtp/final_norm",
        ):
            return self._put(name, obj, (h,))
        if name == "mtp/input_projection":
            return self._put(name, obj, (h, 2 * h))
        if name == "text/draft_head":
            return self._put("proposal/head", obj, (131072, h))
        if name == "text/draft_head_token_ids":
            return self._put("proposal/token_ids", obj, (131072,))
        match = re.fullmatch(r"(text/layers/(\d+)/|mtp/layer/)(.+)", name)
        if match:
            block, layer, role = match.groups()
            if layer is not None and not int(layer) < self.layers:
                raise ArtifactError(
                    f"legacy tensor {name} is past the model's {self.layers} layers"
                )
            return self._decoder(obj, "mtp/layers/0/" if layer is None else block, role)
        if name.startswith("vision/"):
            return self._vision(obj, name)
        match = re.fullmatch(r"(dflash2?)/(.+)", name)
        if match and match.group(1) in self.components:
            return self._draft(obj, *match.groups())
        raise ArtifactError(f"unknown legacy tensor {name}")

    def _decoder(self, obj: dict, block: str, role: str) -> None:
        h, q, kv, nv, vg = self.h, self.q, self.kv, self.nv, self.vg
        fused = {
            "attention/query_key": ("attention/", ("query", "key")),
            "attention/gate_value": ("attention/", ("gate", "value")),
            "attention/query_key_gate_value": ("attention/", ("query", "key", "gate", "value")),
            "gdn/query_key": ("gdn/", ("query", "key")),
            "gdn/value_z": ("gdn/", ("value", "z")),
            "gdn/query_key_value_z": ("gdn/", ("query", "key", "value", "z")),
            "gdn/a_b_projection": ("gdn/", ("a_projection", "b_projection")),
        }
        rows = {
            "attention/query": q,
            "attention/gate": q,
            "attention/key": kv,
            "attention/value": kv,
            "gdn/query": 2048,
            "gdn/key": 2048,
            "gdn/value": vg,
            "gdn/z": vg,
            "gdn/a_projection": nv,
            "gdn/b_projection": nv,
        }
        single = {
            "input_norm": (h,),
            "post_attention_norm": (h,),
            "attention/query_norm": (256,),
            "attention/key_norm": (256,),
            "attention/output": (h, q),
            "gdn/a_projection": (nv, h),
            "gdn/b_projection": (nv, h),
            "gdn/a_log": (nv,),
            "gdn/dt_bias": (nv,),
            "gdn/norm": (128,),
            "gdn/convolution": (4, 4096 + vg),
            "gdn/output": (h, vg),
        }
        if role in fused:
            prefix, parts = fused[role]
            return self._split(obj, [(block + prefix + p, rows[prefix + p]) for p in parts], h)
        if role in single:
            return self._put(block + role, obj, single[role])
        if not self.moe and role == "mlp/gate_up":
            return self._split(obj, [(block + "mlp/gate", 17408), (block + "mlp/up", 17408)], h)
        if not self.moe and role == "mlp/down":
            return self._put(block + role, obj, (h, 17408))
        moe = block + "moe/"
        if self.moe and role == "moe/router_shared_gate":
            return self._split(obj, [(moe + "router", 256), (moe + "shared_score", 1)], h)
        if self.moe and role == "moe/routed_gate_up":
            entries = [
                (f"{moe}experts/{e}/{part}", 512) for e in range(256) for part in ("gate", "up")
            ]
            return self._split(obj, entries, h)
        if self.moe and role == "moe/routed_down":
            return self._split(obj, [(f"{moe}experts/{e}/down", h) for e in range(256)], 512)
        if self.moe and role == "moe/shared_gate_up":
            return self._split(obj, [(moe + "shared/gate", 512), (moe + "shared/up", 512)], h)
        if self.moe and role == "moe/shared_down":
            return self._put(moe + "shared/down", obj, (h, 512))
        raise ArtifactError(f"unknown legacy decoder tensor {obj['id']}")

    def _vision(self, obj: dict, name: str) -> None:
        whole = {
            "vision/patch_embedding": (1152, 1536),
            "vision/patch_embedding_bias": (1152,),
            "vision/position_embedding": (2304, 1152),
            "vision/merger/fc1": (4608, 4608),
            "vision/merger/fc1_bias": (4608,),
            "vision/merger/fc2": (self.h, 4608),
            "vision/merger/fc2_bias": (self.h,),
            "vision/merger/norm/weight": (1152,),
            "vision/merger/norm/bias": (1152,),
        }
        if name in whole:
            return self._put(name.replace("merger/norm/", "merger/norm_"), obj, whole[name])
        match = re.fullmatch(r"(vision/layers/(\d+)/)(.+)", name)
        if not match or not int(match.group(2)) < 27:
            raise ArtifactError(f"unknown legacy vision tensor {name}")
        block, _, role = match.groups()
        if role == "attention/qkv":
            return self._split(
                obj, [(block + "attention/" + v, 1152) for v in ("query", "key", "value")], 1152
            )
        if role == "attention/qkv_bias":
            if obj["shape"] != [3456]:
                raise ArtifactError(
                    f"legacy tensor {name} has shape {obj['shape']}, expected [3456]"
                )
            for index, v in enumerate(("query", "key", "value")):
                self._put(f"{block}attention/{v}_bias", obj, (1152,), index * 1152)
            return None
        if role not in _VISION_LAYER:
            raise ArtifactError(f"unknown legacy vision tensor {name}")
        return self._put(
            block + role.replace("norm1/", "norm1_").replace("norm2/", "norm2_"),
            obj,
            _VISION_LAYER[role],
        )

    def _draft(self, obj: dict, backend: str, role: str) -> None:
        h, config = self.h, self.components[backend]["config"]
        inter = config["intermediate_size"]
        if role == "feature_projection":
            return self._put(
                obj["id"], obj, (h, len(config["dflash_config"]["target_layer_ids"]) * h)
            )
        if role in ("context_norm", "final_norm"):
            return self._put(obj["id"], obj, (h,))
        if backend == "dflash2" and role.startswith("candidate_selector/"):
            return self._put(
                obj["id"],
                obj,
                (256, h) if role.endswith("hidden_projection") else (self.vocab, 256),
            )
        match = re.fullmatch(r"(layers/(\d+)/)(.+)", role)
        if not match or not int(match.group(2)) < config["num_hidden_layers"]:
            raise ArtifactError(f"unknown legacy draft tensor {obj['id']}")
        block, role = f"{backend}/{match.group(1)}", match.group(3)
        if role == "attention/query_key_value":
            self._split(
                obj,
                [
                    (block + "attention/query", 4096),
                    (block + "attention/key", 1024),
                    (block + "attention/value", 1024),
                ],
                h,
            )
            self._put(block + "attention/context_key", obj, (1024, h), 4096 * h)
            self._put(block + "attention/context_value", obj, (1024, h), 5120 * h)
            return None
        if role == "mlp/gate_up":
            return self._split(obj, [(block + "mlp/gate", inter), (block + "mlp/up", inter)], h)
        sizes = {
            "input_norm": (h,),
            "post_attention_norm": (h,),
            "attention/query_norm": (128,),
            "attention/key_norm": (128,),
            "attention/output": (h, 4096),
            "mlp/down": (h, inter),
        }
        if backend == "dflash2":
            for branch in ("attention_conv", "mlp_conv"):
                sizes[branch + "/base_kernel"] = (2, 2, h)
                sizes[branch + "/kernel_projection"] = (h // 4, h)
        if role not in sizes:
            raise ArtifactError(f"unknown legacy draft tensor {obj['id']}")
        return self._put(block + role, obj, sizes[role])
