"""Recipes: the storage format of every logical parameter (ninfer-format.md §4.1, §4.3).

A recipe is a function ``(logical_name, shape) -> format``. Every recipe keeps ``gdn/a_log`` and
``gdn/dt_bias`` in fp32 and other 1-D tensors (norms) in fp32 too; the GDN convolution, the MoE
router and the shared-expert score stay bf16 unless a recipe says otherwise. Each parameter is
stored as its own object (no fused parents), so every binding is a whole object.

Recipes: ``fp32`` (exact, for tests), ``bf16``, ``fp8-row``, ``nvfp4`` (bf16 where the shape
does not fit the 128×64 tiles), ``q8`` and the official grouped-int ``qwen3_6_27b``,
``qwen3_8_27b`` and ``qwen3_6_35b_a3b``.

Vision matrices are projections like the text ones (FP8-row, NVFP4 where it fits, Q8), except the
position table, which is interpolated rather than multiplied and stays bf16 where the text
embedding does. The official recipes follow §4.3: vision q/k/v and block fc1 Q4, patch embedding
Q6, merger Q8, the rest Q5.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .errors import ArtifactError

Recipe = Callable[[str, tuple[int, ...]], str]

_FP32_ALWAYS = re.compile(r"gdn/(a_log|dt_bias)$")
# 2-D tensors that no recipe quantizes: tap-major conv ([4, C]) and the routing scores
_KEEP_BF16 = re.compile(r"(gdn/convolution|moe/router|moe/shared_score)$")
_EMBEDDING = "text/token_embedding"
_VISION_POSITIONS = "vision/position_embedding"
_HEAD = "text/output_head"


def _base(name: str, shape: tuple[int, ...]) -> str | None:
    """The format shared by all recipes, or None when the recipe decides."""
    if _FP32_ALWAYS.search(name) or len(shape) != 2:
        return "fp32"
    if _KEEP_BF16.search(name):
        return "bf16"
    return None


def _is_projection(name: str) -> bool:
    """A 2-D matrix multiplied with activations (not an embedding or position table)."""
    return name not in (_EMBEDDING, _VISION_POSITIONS)


def fp32(name: str, shape: tuple[int, ...]) -> str:
    return "fp32"


def bf16(name: str, shape: tuple[int, ...]) -> str:
    return _base(name, shape) or "bf16"


def fp8_row(name: str, shape: tuple[int, ...]) -> str:
    fixed = _base(name, shape)
    if fixed:
        return fixed
    return "fp8_e4m3fn_row_bf16" if _is_projection(name) else "bf16"


def nvfp4(name: str, shape: tuple[int, ...]) -> str:
    fixed = _base(name, shape)
    if fixed:
        return fixed
    n, k = shape
    fits = n % 128 == 0 and k % 64 == 0  # block_scale_k16_m128x4_v1 tiles (§2.2)
    return "nvfp4" if _is_projection(name) and fits else "bf16"


def q8(name: str, shape: tuple[int, ...]) -> str:
    return _base(name, shape) or "q8_g32_fp16"


_Q4_27B = re.compile(r"/(attention|gdn)/(query|key)$|/mlp/(gate|up)$")
_Q4_VISION = re.compile(r"^vision/layers/\d+/(attention/(query|key|value)|mlp/fc1)$")


def _official_vision(name: str) -> str:
    """§4.3's vision rule, shared by the official grouped-int recipes."""
    if _Q4_VISION.match(name):
        return "q4_g64_fp16"
    if name == "vision/patch_embedding":
        return "q6_g64_fp16"
    return "q8_g32_fp16" if name.startswith("vision/merger/") else "q5_g64_fp16"


def _qwen_27b(embedding: str, head: str) -> Recipe:
    """§4.3 `qwen3_6_27b` / `qwen3_8_27b`: q,k and MLP gate,up Q4, the rest Q5; MTP Q8;
    vision by `_official_vision`."""

    def recipe(name: str, shape: tuple[int, ...]) -> str:
        fixed = _base(name, shape)
        if fixed:
            return fixed
        if name == _EMBEDDING:
            return embedding
        if name == _HEAD:
            return head
        if name.startswith("mtp/"):
            return "q8_g32_fp16"
        if name.startswith("vision/"):
            return _official_vision(name)
        return "q4_g64_fp16" if _Q4_27B.search(name) else "q5_g64_fp16"

    return recipe


_EXPERT = re.compile(r"^text/layers/(\d+)/moe/experts/\d+/(gate|up|down)$")
_AB = re.compile(r"gdn/(a|b)_projection$")
_Q6_DOWN_LAYERS = {34, 38, 39}


def qwen3_6_35b_a3b(name: str, shape: tuple[int, ...]) -> str:
    """§4.3: experts gate/up Q4, down Q5 (Q6 in layers 34/38/39); router and a/b bf16; vision
    by `_official_vision`; the rest Q8."""
    fixed = _base(name, shape)
    if fixed:
        return fixed
    if name.startswith("vision/"):
        return _official_vision(name)
    if name == _HEAD:
        return "q6_g64_fp16"
    if _AB.search(name) and not name.startswith("mtp/"):
        return "bf16"
    expert = _EXPERT.match(name)
    if expert:
        if expert.group(2) != "down":
            return "q4_g64_fp16"
        return "q6_g64_fp16" if int(expert.group(1)) in _Q6_DOWN_LAYERS else "q5_g64_fp16"
    return "q8_g32_fp16"


RECIPES: dict[str, Recipe] = {
    "fp32": fp32,
    "bf16": bf16,
    "fp8-row": fp8_row,
    "nvfp4": nvfp4,
    "q8": q8,
    "qwen3_6_27b": _qwen_27b("q6_g64_fp16", "q6_g64_fp16"),
    "qwen3_8_27b": _qwen_27b("q8_g32_fp16", "q8_g32_fp16"),
    "qwen3_6_35b_a3b": qwen3_6_35b_a3b,
}


def recipe(name: str) -> Recipe:
    """The recipe called ``name``; an unknown name raises ArtifactError listing the known ones."""
    found = RECIPES.get(name)
    if found is None:
        raise ArtifactError(f'unknown recipe "{name}" (known: {", ".join(RECIPES)})')
    return found
