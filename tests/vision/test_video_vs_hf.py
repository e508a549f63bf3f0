"""Video against transformers' own video path: `Qwen3VLVideoProcessor` (the class transformers'
`AutoVideoProcessor` gives model types qwen3_5 and qwen3_5_moe) and `Qwen3VLProcessor`.

The same clip, decoded by the same PyAV, sampled with the artifact's resources (tiny_vl's
`video_preprocessor_config.json`: fps 2, 2 to 8 frames, 256 to 8192 pixels of all frames,
patch 4) gives the same frame indices, the same `video_grid_thw`, the same
`pixel_values_videos` and, through the processor, the same prompt ids (timestamp text, starts,
pads and ends). Tolerance of the pixel rows: both sides resize to the same uint8 pixels, then
rescale and normalize in float32 in two orders ((x/255 − m)/s here, (x − 255m)/(255s) there),
a few roundings of values of magnitude ≤ 1: within 4 · 2⁻²³ < 1e-6, while one uint8 level
apart is 2/255 ≈ 7.8e-3 after normalization, so any resize difference fails.

transformers' video processors run on torchvision; it is not an ninfer dependency (the one
wheel on this project's package index, 0.28.0, is PyPI's CUDA build, which cannot load its
operators beside the CPU torch that install.sh installs, and once installed it makes
transformers pick torchvision image processors that then fail to import). The tests that run
the processor skip, naming that, where torchvision does not import (the H200 image has it).
The frame-size, frame-count and timestamp rules are checked against transformers' own
functions everywhere, torchvision or not.
"""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from ninfer_engine.tokenizer import Tokenizer
from ninfer_engine.vision.decode import video_item
from ninfer_engine.vision.preprocess import Preprocessor
from ninfer_engine.vision.prompt import VisionTokens, expand_prompt
from ninfer_http.media_markers import PLACEHOLDERS
from tests.vision.media_samples import mp4
from tests.vision.tiny_vl import VIDEO_PREPROCESSOR, vl_resources

# (frames, height, width, fps) of each clip, and what it exercises
CLIPS = {
    "no resize": (8, 24, 40, 4),
    "shrink": (16, 120, 160, 4),
    "odd count": (10, 120, 160, 4),  # 5 frames sampled: the last repeats
    "odd budget": (6, 12, 134, 4),  # 3 frames, budgeted as 4 (half-to-even): a wider grid
    "shrink one side, grow the other": (9, 20, 30, 4),  # Pillow is 12 levels off here
    "tiny": (6, 6, 10, 3),  # under one merged token: scaled up first
}


def _options(cap: bool) -> dict:
    """The video resources' cap fields: with the cap, 20 merged-token areas (1280 pixels) a
    frame, below the budget's even share for most of the sizes here, so it binds."""
    return {"cap_pixels_per_frame": True, "max_video_tokens": 20} if cap else {}


def _preprocessor(cap: bool = False) -> Preprocessor:
    res = vl_resources()
    config = {**json.loads(res["video_preprocessor_config.json"]), **_options(cap)}
    return Preprocessor.from_resources(res["preprocessor_config.json"],
                                       json.dumps(config).encode())


def _has_cap_option() -> bool:
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    return "cap_pixels_per_frame" in Qwen3VLVideoProcessor.valid_kwargs.__annotations__


def _hf_options(cap: bool) -> dict:
    # False spelled out where the option exists: transformers warns when it is left unset
    return ({"cap_pixels_per_frame": False, **_options(cap)} if _has_cap_option() else {})


CAPS = [False, pytest.param(True, marks=pytest.mark.skipif(
    not _has_cap_option(), reason="this transformers has no cap_pixels_per_frame"))]


@pytest.mark.parametrize("cap", CAPS)
def test_frame_grid_matches_transformers_for_every_size(cap):
    """`get_num_of_video_patches` is transformers' own count (its `smart_resize`, the per-frame
    cap when set): ours for 2 to 8 frames of every even size from 8 to 198 pixels."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    theirs = Qwen3VLVideoProcessor(**VIDEO_PREPROCESSOR, **_hf_options(cap))
    pre = _preprocessor(cap)
    wrong = []
    for n in range(2, 9):
        for h in range(8, 200, 2):
            for w in range(8, 200, 2):
                gh, gw = (s // pre.patch for s in pre.frame_size(n, h, w))
                ours = (n + n % 2) // 2 * gh * gw
                if ours != theirs.get_num_of_video_patches(n, h, w):
                    wrong.append((n, h, w))
    assert not wrong, f"{len(wrong)} sizes differ, first {wrong[:5]}"


def test_sampling_and_timestamps_match_transformers():
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    theirs = Qwen3VLVideoProcessor(**VIDEO_PREPROCESSOR)
    pre = _preprocessor()
    for total, fps in ((8, 4.0), (10, 4.0), (31, 30.0), (7, None), (200, 25.0), (3, 4.0)):
        meta = VideoMetadata(total_num_frames=total, fps=fps)
        indices = theirs.sample_frames(meta)
        assert list(pre.sample_frames(total, fps)) == list(indices)
        frames = [np.zeros((16, 16, 3), np.uint8)] * len(indices)
        ours = pre.video(frames, pre.sample_frames(total, fps), fps).timestamps
        # `_calculate_timestamps` uses nothing of the processor's state
        expected = Qwen3VLProcessor._calculate_timestamps(None, list(indices), meta.fps or 24, 2)
        assert list(ours) == expected


def _torchvision():
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError) as exc:  # RuntimeError: built for another torch
        pytest.skip("transformers' video processor needs torchvision, which does not import "
                    f"here ({type(exc).__name__}: {str(exc)[:80]})")


def _decoded(clip: bytes) -> tuple[np.ndarray, float]:
    av = pytest.importorskip("av", reason="the clips are decoded with PyAV")
    with av.open(io.BytesIO(clip)) as container:
        fps = float(container.streams.video[0].average_rate)
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]), fps


def _hf_video_processor(tmp_path, cap: bool):
    """What `AutoVideoProcessor` loads for a qwen3_5 checkpoint with these resources."""
    from transformers import AutoVideoProcessor
    from transformers.models.qwen3_5 import Qwen3_5Config

    Qwen3_5Config().save_pretrained(tmp_path)
    config = {**VIDEO_PREPROCESSOR, **_hf_options(cap)}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(config))
    processor = AutoVideoProcessor.from_pretrained(tmp_path)
    assert type(processor).__name__ == "Qwen3VLVideoProcessor"
    return processor


def _metadata(frames: np.ndarray, fps: float):
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(total_num_frames=len(frames), fps=fps, height=frames.shape[1],
                         width=frames.shape[2])


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("clip", list(CLIPS))
def test_video_pixels_match_transformers_video_processor(clip, cap, tmp_path):
    _torchvision()
    data = mp4(*CLIPS[clip])
    frames, fps = _decoded(data)
    theirs = _hf_video_processor(tmp_path, cap)(
        videos=[frames], video_metadata=[_metadata(frames, fps)], do_sample_frames=True,
        return_tensors="pt")
    pre = _preprocessor(cap)
    ours = video_item(data, pre).pixels
    assert ours.grid == tuple(theirs["video_grid_thw"][0].tolist())
    rows = torch.from_numpy(pre.normalize(ours.patches))
    assert rows.shape == theirs["pixel_values_videos"].shape
    torch.testing.assert_close(rows, theirs["pixel_values_videos"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("clip", ["odd count", "odd budget"])
def test_video_prompt_matches_transformers_processor(clip, tmp_path):
    """The template's video part (`PLACEHOLDERS`, what our chat rendering leaves) expanded by
    `Qwen3VLProcessor` and by `expand_prompt`: the same ids, so the same timestamp text and
    the same count of video pads, starts and ends."""
    _torchvision()
    from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    res = vl_resources()
    ours_tok = Tokenizer.from_json(res["tokenizer.json"])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=ours_tok.backend)
    video_processor = _hf_video_processor(tmp_path, False)
    processor = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(),
                                 tokenizer=hf_tok, video_processor=video_processor)
    data = mp4(*CLIPS[clip])
    frames, fps = _decoded(data)
    text = f"What is in {PLACEHOLDERS['video']} here?"
    theirs = processor(text=[text], videos=[frames], videos_kwargs={
        "video_metadata": [_metadata(frames, fps)], "do_sample_frames": True})
    tokens = VisionTokens.from_tokenizer(ours_tok.backend.token_to_id)
    ours, media = expand_prompt(ours_tok.encode(text), [video_item(data, _preprocessor())],
                                tokens, 2, ours_tok.encode)
    assert list(ours) == theirs["input_ids"][0]
    assert media.media_tokens == list(ours).count(tokens.video) > 0
    assert "<0." in ours_tok.decode(list(ours))  # timestamps are in the text
