"""Tiny seeded HF multimodal Qwen3.5 / Qwen3.5-MoE models (model-math.md §7), our twins, and
the same model converted to a `.ninfer` with a byte tokenizer that has Qwen's vision tokens."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer

from ninfer_engine.artifact.hf_vision_names import (
    vision_block_from_hf, vision_config_from_hf, vision_globals_from_hf,
)
from ninfer_engine.models.qwen3_5 import dict_params
from ninfer_engine.vision.encoder import VisionEncoder
from tests.engine.helpers import byte_tokenizer_json, default_resources
from tests.models.qwen35_tiny import hf_config, randomize

VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
              num_position_embeddings=16)
# the byte tokenizer's 259 ids, then Qwen's vision start / end, image and video pads
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 259, 260, 261, 262
VOCAB = 272
PREPROCESSOR = {"size": {"shortest_edge": 256, "longest_edge": 4096}, "patch_size": 4,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5]}
VIDEO_PREPROCESSOR = {**PREPROCESSOR, "size": {"shortest_edge": 256, "longest_edge": 8192},
                      "fps": 2, "min_frames": 2, "max_frames": 8}


def hf_vl_model(family: str, seed: int = 0):
    """The seeded fp32 eager `Qwen3_5(Moe)ForConditionalGeneration`, every parameter random."""
    if family == "qwen3_5":
        from transformers.models.qwen3_5 import Qwen3_5Config as Config
        from transformers.models.qwen3_5 import Qwen3_5ForConditionalGeneration as Model
    else:
        from transformers.models.qwen3_5_moe import Qwen3_5MoeConfig as Config
        from transformers.models.qwen3_5_moe import Qwen3_5MoeForConditionalGeneration as Model
    text = hf_config(family).to_dict()
    text["vocab_size"] = VOCAB
    config = Config(text_config=text, vision_config=VISION,
                    image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD,
                    vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
                    tie_word_embeddings=family == "qwen3_5")
    torch.manual_seed(seed)
    model = Model._from_config(config, attn_implementation="eager", dtype=torch.float32,
                               experts_implementation="eager")
    return randomize(model, seed, lambda p: p[0].numel())  # a row's size: as before


def vision_tensors(model) -> dict[str, torch.Tensor]:
    """Our `vision/...` tensors of an HF multimodal model (through hf_vision_names)."""
    state = {k[len("model.visual."):]: t for k, t in model.state_dict().items()
             if k.startswith("model.visual.")}
    out = vision_globals_from_hf(state)
    for b in range(VISION["depth"]):
        out.update(vision_block_from_hf(state, b))
    return out


def our_encoder(model, dtype=torch.float32, device="cpu") -> VisionEncoder:
    config = vision_config_from_hf(model.config)
    tensors = {k: t.to(device, dtype) for k, t in vision_tensors(model).items()}
    return VisionEncoder(config, dict_params(tensors))


def tower_depth(frame_patches: int) -> float:
    """fp32 reductions (tests.tolerance) of the tiny tower's longest chain to a row: per block
    the norm (H), QKV (H), scores (D), the softmax and P·V over a frame's patches
    (2 × patches), the projection (H), the norm (H), fc1 (H), fc2 (I) and four
    transcendentals; the merger's norm (H), fc1 (4H), GELU, fc2 (4H)."""
    from tests.tolerance import TRANSCENDENTAL

    H, I = VISION["hidden_size"], VISION["intermediate_size"]
    D = H // VISION["num_heads"]
    block = 5 * H + D + 2 * frame_patches + I + 4 * TRANSCENDENTAL
    return VISION["depth"] * block + 9 * H + TRANSCENDENTAL


def vl_resources() -> dict[str, bytes]:
    """Byte tokenizer with the vision tokens, ChatML template, both preprocessor configs."""
    tokenizer = Tokenizer.from_str(byte_tokenizer_json())
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in (
        "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")])
    assert tokenizer.token_to_id("<|video_pad|>") == VIDEO_PAD
    return {**default_resources(), "tokenizer.json": tokenizer.to_str().encode(),
            "preprocessor_config.json": json.dumps(PREPROCESSOR).encode(),
            "video_preprocessor_config.json": json.dumps(VIDEO_PREPROCESSOR).encode()}


def write_vl_artifact(model, folder: Path, *extra: str, mtp: dict | None = None) -> Path:
    """`ninfer convert hf --recipe fp32 [extra]` of the saved model with `vl_resources` (and
    `mtp`'s tensors, without their `mtp.` prefix, as the checkpoint's MTP head)."""
    from safetensors.torch import save_file

    from ninfer_engine.cli.tools import main

    checkpoint = folder / "checkpoint"
    model.save_pretrained(checkpoint, safe_serialization=True)
    if mtp is not None:
        save_file({f"mtp.{k}": v.contiguous() for k, v in mtp.items()},
                  checkpoint / "mtp.safetensors")
    for role, data in vl_resources().items():
        (checkpoint / role).write_bytes(data)
    out = folder / "vl.ninfer"
    assert main(["convert", "hf", str(checkpoint), "-o", str(out), "--recipe", "fp32",
                 *extra]) == 0
    return out


def serve_image_prompt(engine, ids: list[int], max_tokens: int):
    """(greedy output tokens, the expanded prompt, its media) of one request: `ids` with a
    40x56 image at its pad, through `engine` (started)."""
    import asyncio

    from ninfer_engine.types import GenerationRequest, SamplingParams
    from ninfer_engine.vision.decode import image_item
    from tests.vision.media_samples import png

    expanded, media = engine.vision.planner.prepare(
        ids, [image_item(png(40, 56, 3), engine.vision.preprocessor)], engine.tokenizer.encode)
    request = GenerationRequest("m", expanded, SamplingParams(temperature=0.0),
                                max_tokens=max_tokens, ignore_eos=True, media=media)

    async def run():
        return [t for e in [e async for e in engine.submit(request)] for t in e.token_ids]
    return asyncio.run(run()), expanded, media
