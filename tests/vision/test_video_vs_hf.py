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
the processor skip, naming that, where torchvision does not import (the H200 image has it);
test_video_fixture.py checks transformers' stored outputs for the same `CLIPS` (raw frames,
not decoded ones) there.
The frame-size, frame-count and timestamp rules are checked against transformers' own
functions everywhere, torchvision or not.
"""
from __future__ import annotations

import importlib
import io

import numpy as np
import pytest
import torch

from ninfer_engine.vision.decode import video_item
from tests.vision.media_samples import mp4
from tests.vision.tiny_vl import VIDEO_PREPROCESSOR
from tests.vision.video_reference import (
    CLIPS, PROMPT_CLIPS, assert_prompt_matches, has_cap_option, hf_options, hf_pixels,
    hf_prompt_ids, hf_video_processor, our_preprocessor,
)

CAPS = [False, pytest.param(True, marks=pytest.mark.skipif(
    not has_cap_option(), reason="this transformers has no cap_pixels_per_frame"))]


@pytest.mark.parametrize("cap", CAPS)
def test_frame_grid_matches_transformers_for_every_size(cap):
    """`get_num_of_video_patches` is transformers' own count (its `smart_resize`, the per-frame
    cap when set): ours for 2 to 8 frames of every even size from 8 to 198 pixels."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    theirs = Qwen3VLVideoProcessor(**VIDEO_PREPROCESSOR, **hf_options(cap))
    pre = our_preprocessor(cap)
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
    pre = our_preprocessor()
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
        importlib.import_module("torchvision")
    except (ImportError, RuntimeError) as exc:  # RuntimeError: built for another torch
        pytest.skip("transformers' video processor needs torchvision, which does not import "
                    f"here ({type(exc).__name__}: {str(exc)[:80]})")


def _decoded(clip: bytes) -> tuple[np.ndarray, float]:
    av = pytest.importorskip("av", reason="the clips are decoded with PyAV")
    with av.open(io.BytesIO(clip)) as container:
        fps = float(container.streams.video[0].average_rate)
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]), fps


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("clip", list(CLIPS))
def test_video_pixels_match_transformers_video_processor(clip, cap, tmp_path):
    _torchvision()
    data = mp4(*CLIPS[clip])
    theirs = hf_pixels(hf_video_processor(tmp_path, cap), *_decoded(data))
    pre = our_preprocessor(cap)
    ours = video_item(data, pre).pixels
    assert ours.grid == tuple(theirs["video_grid_thw"][0].tolist())
    rows = torch.from_numpy(pre.normalize(ours.patches))
    assert rows.shape == theirs["pixel_values_videos"].shape
    torch.testing.assert_close(rows, theirs["pixel_values_videos"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("clip", PROMPT_CLIPS)
def test_video_prompt_matches_transformers_processor(clip, tmp_path):
    """`PROMPT` expanded by `Qwen3VLProcessor` and by `expand_prompt`: the same ids."""
    _torchvision()
    data = mp4(*CLIPS[clip])
    assert_prompt_matches(video_item(data, our_preprocessor()),
                          hf_prompt_ids(tmp_path, *_decoded(data)))
