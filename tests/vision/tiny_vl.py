"""Tiny seeded HF multimodal Qwen3.5 / Qwen3.5-MoE models (model-math.md §7) and our twins."""
from __future__ import annotations

import torch

from ninfer_engine.artifact.hf_names import (
    vision_block_from_hf, vision_config_from_hf, vision_globals_from_hf,
)
from ninfer_engine.models.qwen3_5 import dict_params
from ninfer_engine.vision.encoder import VisionEncoder
from tests.models.qwen35_tiny import hf_config

VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
              num_position_embeddings=16)
# token ids inside the tiny vocabulary (128): vision start / end, image and video pads
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 120, 121, 122, 123


def hf_vl_model(family: str, seed: int = 0):
    """The seeded fp32 eager `Qwen3_5(Moe)ForConditionalGeneration`, every parameter random."""
    if family == "qwen3_5":
        from transformers.models.qwen3_5 import Qwen3_5Config as Config
        from transformers.models.qwen3_5 import Qwen3_5ForConditionalGeneration as Model
    else:
        from transformers.models.qwen3_5_moe import Qwen3_5MoeConfig as Config
        from transformers.models.qwen3_5_moe import Qwen3_5MoeForConditionalGeneration as Model
    config = Config(text_config=hf_config(family).to_dict(), vision_config=VISION,
                    image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD,
                    vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
                    tie_word_embeddings=family == "qwen3_5")
    torch.manual_seed(seed)
    model = Model._from_config(config, attn_implementation="eager", dtype=torch.float32,
                               experts_implementation="eager")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.01, 16, generator=gen).log())
            elif p.dim() == 1:
                p.copy_(torch.empty(p.shape).uniform_(-0.5, 0.5, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.25)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5)
    return model.eval()


def vision_tensors(model) -> dict[str, torch.Tensor]:
    """Our `vision/...` tensors of an HF multimodal model (through hf_names)."""
    state = {k[len("model.visual."):]: t for k, t in model.state_dict().items()
             if k.startswith("model.visual.")}
    out = vision_globals_from_hf(state)
    for b in range(VISION["depth"]):
        out.update(vision_block_from_hf(state, b))
    return out


def our_encoder(model, dtype=torch.float32) -> VisionEncoder:
    config = vision_config_from_hf(model.config)
    tensors = {k: t.to(dtype) for k, t in vision_tensors(model).items()}
    return VisionEncoder(config, dict_params(tensors))
