"""What the video comparisons with transformers share: the clips (raw frames built from integers
only, so every machine rebuilds the same bytes), the tiny artifact's video preprocessor on our
side and on transformers' side, and the prompt both expand.

`test_video_vs_hf.py` runs transformers live (where torchvision imports);
`fixtures/make_video_reference.py` runs it once and stores its outputs, which
`test_video_fixture.py` checks on every machine.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ninfer_engine.tokenizer import Tokenizer
from ninfer_engine.vision.preprocess import Preprocessor
from ninfer_engine.vision.prompt import MediaItem, VisionTokens, expand_prompt
from ninfer_http.media_markers import PLACEHOLDERS
from tests.vision.tiny_vl import VIDEO_PREPROCESSOR, vl_resources

# (frames, height, width, fps) of each clip, and what it exercises
CLIPS = {
    "no resize": (8, 24, 40, 4),
    "shrink": (16, 120, 160, 4),
    "odd count": (10, 120, 160, 4),  # 5 frames sampled: the last repeats
    "odd budget": (6, 12, 134, 4),  # 3 frames, budgeted as 4 (half-to-even): a wider grid
    "shrink one side, grow the other": (9, 20, 30, 4),  # Pillow is 10+ levels off here
    "tiny": (6, 6, 10, 3),  # under one merged token: scaled up first
}
PROMPT_CLIPS = ("odd count", "odd budget")  # the prompt-id cases: timestamps of 3 pairs, 2 pairs
PROMPT = f"What is in {PLACEHOLDERS['video']} here?"
FIXTURE = Path(__file__).parent / "fixtures" / "video_reference.npz"


def fixture_key(clip: str, cap: bool | None, field: str) -> str:
    """A fixture entry's name: clip, cap (None: the same either way) and field."""
    return f"{clip}|{'' if cap is None else ('cap' if cap else 'nocap')}|{field}"


def frames_digest(frames: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(frames).tobytes()).hexdigest()


def clip_frames(frames: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """uint8 [frames, height, width, 3]: a checker of 2-pixel cells of 0 and 255, shifted a
    cell per frame and per channel, pulled toward grey by noise of 0 to 63 levels. Its sharp
    edges make the bicubic filter overshoot, where Pillow's filter clips differently (up to 20
    levels off when one side grows); the noise makes every frame differ. Integers only (no
    libm), so every machine builds the same bytes."""
    t, y, x, c = np.ogrid[:frames, :height, :width, :3]
    checker = ((x + 2 * t + 2 * c) // 2 + y // 2) % 2 * 255
    noise = np.random.default_rng(seed).integers(0, 64, (frames, height, width, 3))
    return np.abs(checker - noise).astype(np.uint8)


def cap_options(cap: bool) -> dict:
    """The video resources' cap fields: with the cap, 20 merged-token areas (1280 pixels) a
    frame, below the budget's even share for "odd count" and "odd budget", so it binds there."""
    return {"cap_pixels_per_frame": True, "max_video_tokens": 20} if cap else {}


def our_preprocessor(cap: bool = False) -> Preprocessor:
    res = vl_resources()
    config = {**json.loads(res["video_preprocessor_config.json"]), **cap_options(cap)}
    return Preprocessor.from_resources(res["preprocessor_config.json"],
                                       json.dumps(config).encode())


def assert_prompt_matches(item: MediaItem, expected: list[int]) -> None:
    """`PROMPT` expanded for `item` by `expand_prompt` gives `expected` (transformers' ids):
    the same timestamp text and the same count of video pads, starts and ends."""
    tokenizer = Tokenizer.from_json(vl_resources()["tokenizer.json"])
    tokens = VisionTokens.from_tokenizer(tokenizer.backend.token_to_id)
    ours, media = expand_prompt(tokenizer.encode(PROMPT), [item], tokens, 2, tokenizer.encode)
    assert list(ours) == list(expected)
    assert media.media_tokens == list(ours).count(tokens.video) > 0
    assert "<0." in tokenizer.decode(list(ours))  # timestamps are in the text


def has_cap_option() -> bool:
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    return "cap_pixels_per_frame" in Qwen3VLVideoProcessor.valid_kwargs.__annotations__


def hf_options(cap: bool) -> dict:
    # False spelled out where the option exists: transformers warns when it is left unset
    return {"cap_pixels_per_frame": False, **cap_options(cap)} if has_cap_option() else {}


def hf_video_processor(folder: Path, cap: bool):
    """What `AutoVideoProcessor` loads for a qwen3_5 checkpoint with these resources."""
    from transformers import AutoVideoProcessor
    from transformers.models.qwen3_5 import Qwen3_5Config

    Qwen3_5Config().save_pretrained(folder)
    config = {**VIDEO_PREPROCESSOR, **hf_options(cap)}
    (folder / "video_preprocessor_config.json").write_text(json.dumps(config))
    processor = AutoVideoProcessor.from_pretrained(folder)
    assert type(processor).__name__ == "Qwen3VLVideoProcessor"
    return processor


def hf_metadata(frames: np.ndarray, fps: float):
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(total_num_frames=len(frames), fps=fps, height=frames.shape[1],
                         width=frames.shape[2])


def hf_pixels(processor, frames: np.ndarray, fps: float) -> dict:
    """`processor`'s `pixel_values_videos` and `video_grid_thw` of one clip, frames sampled
    by the processor itself from the clip's metadata."""
    return processor(
        videos=[frames], video_metadata=[hf_metadata(frames, fps)], do_sample_frames=True,
        return_tensors="pt")


def hf_prompt_ids(folder: Path, frames: np.ndarray, fps: float) -> list[int]:
    """`PROMPT` (the template's video part, what our chat rendering leaves) expanded by
    `Qwen3VLProcessor` with the tiny artifact's tokenizer."""
    from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    tokenizer = Tokenizer.from_json(vl_resources()["tokenizer.json"])
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(), video_processor=hf_video_processor(folder, False),
        tokenizer=PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend))
    out = processor(text=[PROMPT], videos=[frames], videos_kwargs={
        "video_metadata": [hf_metadata(frames, fps)], "do_sample_frames": True})
    return list(out["input_ids"][0])
