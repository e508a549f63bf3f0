"""Video against transformers' `Qwen3VLVideoProcessor` and `Qwen3VLProcessor` on every machine:
their outputs for `CLIPS` stored by `fixtures/make_video_reference.py` (which names the versions
and the command), our preprocessor run here on the same frames. `test_video_vs_hf.py` runs
transformers live where torchvision imports.

Each clip: the frames rebuilt here are the generator's (SHA-256), our grid is theirs, and our
pixel rows are exactly the uint8 levels whose normalization the generator found in theirs
(the normalization itself is checked against transformers' in test_preprocess.py). Exactly, not
within a level: both sides run torch's 8-bit bicubic filter with antialiasing, whose vectorized and
generic CPU paths share fixed-point weights and rounding (this file passes with
ATEN_CPU_CAPABILITY=default too, on torch 2.13 against the fixture's 2.14.1); Pillow's filter
is 1 level off on the clips that only shrink and 10+ on those that grow one side, sampling
other frames or another patch order tens of levels.
"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_engine.vision.prompt import MediaItem
from tests.vision.video_reference import (
    CLIPS, FIXTURE, PROMPT_CLIPS, assert_prompt_matches, clip_frames, fixture_key,
    frames_digest, our_preprocessor,
)


@pytest.fixture(scope="module")
def reference():
    with np.load(FIXTURE, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def _ours(clip: str, cap: bool, reference: dict):
    count, h, w, fps = CLIPS[clip]
    frames = clip_frames(count, h, w)
    assert frames_digest(frames) == str(reference[fixture_key(clip, None, "sha256")]), (
        "the frames differ from the generator's: rerun fixtures/make_video_reference.py")
    pre = our_preprocessor(cap)
    indices = pre.sample_frames(count, fps)
    return pre.video([frames[i] for i in indices], indices, fps)


@pytest.mark.parametrize("cap", [False, True])
@pytest.mark.parametrize("clip", list(CLIPS))
def test_video_pixels_match_stored_transformers_output(clip, cap, reference):
    ours = _ours(clip, cap, reference)
    theirs = reference[fixture_key(clip, cap, "levels")]
    assert ours.grid == tuple(reference[fixture_key(clip, cap, "grid")].tolist())
    assert ours.patches.shape == theirs.shape
    off = np.abs(ours.patches.astype(np.int16) - theirs.astype(np.int16))
    assert not off.any(), f"{np.count_nonzero(off)} of {off.size} values differ, most {off.max()}"


@pytest.mark.parametrize("clip", PROMPT_CLIPS)
def test_video_prompt_matches_stored_transformers_ids(clip, reference):
    item = MediaItem("video", _ours(clip, False, reference), digest=clip)
    assert_prompt_matches(item, reference[fixture_key(clip, None, "prompt")].tolist())
