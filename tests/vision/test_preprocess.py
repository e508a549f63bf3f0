"""The preprocessor against transformers' PIL image processor (`Qwen2VLImageProcessorPil`): the
same grid and patch rows for the same resources; budgets, frame sampling and refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from ninfer_engine.vision.preprocess import MediaError, Preprocessor

CONFIG = {"size": {"shortest_edge": 1024, "longest_edge": 8192}, "patch_size": 4,
          "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
          "image_std": [0.5, 0.5, 0.5]}


def _image(h, w, seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("size", [(37, 53), (200, 90), (8, 300)])
def test_image_patches_match_transformers(size):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    theirs = Qwen2VLImageProcessorPil(**CONFIG)(_image(*size), return_tensors="np")
    pre = Preprocessor.from_resources(json.dumps(CONFIG).encode(), None)
    ours = pre.image(_image(*size))
    assert ours.grid == tuple(theirs["image_grid_thw"][0]) and ours.patches.dtype == np.uint8
    # the same uint8 resize, then float32 rescale and normalization: exact up to one rounding
    np.testing.assert_allclose(pre.normalize(ours.patches), theirs["pixel_values"], atol=1e-6)


def test_budget_bounds_the_grid():
    pre = Preprocessor.from_resources(json.dumps(CONFIG).encode(), None)
    for h, w in ((4000, 3000), (10, 10), (64, 64)):
        _, gh, gw = pre.image_grid(h, w)
        assert 1024 <= gh * gw * 16 <= 8192 and gh % 2 == 0 and gw % 2 == 0


def test_oblong_images_are_refused():
    with pytest.raises(MediaError, match="aspect ratio"):
        Preprocessor().image_grid(10, 2500)


def test_video_frames_pairs_and_timestamps():
    pre = Preprocessor(patch=4, video_pixels=(256, 4096), fps=2.0)
    indices = pre.sample_frames(total=30, fps=10.0)  # 3 s at 10 fps -> 6 frames at 2 fps
    assert list(indices) == list(np.linspace(0, 29, 6).round().astype(int))
    frames = [np.full((24, 40, 3), 10 * i, np.uint8) for i in range(5)]  # odd: last repeats
    pixels = pre.video(frames, indices[:5], fps=10.0)
    t, h, w = pixels.grid
    assert t == 3 and pixels.patches.shape == (t * h * w, 3 * 2 * 4 * 4)
    assert len(pixels.timestamps) == 3 and pixels.timestamps[0] == pytest.approx(
        (indices[0] + indices[1]) / 2 / 10.0)
