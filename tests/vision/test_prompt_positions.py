"""Placeholder expansion and MRoPE positions against transformers' `get_rope_index`."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer_engine.vision.preprocess import MediaError, Pixels
from ninfer_engine.vision.prompt import MediaItem, VisionTokens, expand_prompt

TOKENS = VisionTokens(start=259, end=260, image=261, video=262)


def _item(kind, grid, timestamps=(), digest="d"):
    t, h, w = grid
    return MediaItem(kind, Pixels(np.zeros((t * h * w, 96), np.uint8), grid, timestamps),
                     digest)


def _encode(text):  # timestamps as one token per character, ids 30..
    return [30 + ord(c) % 60 for c in text]


def test_model_math_tiny_check():
    """Text 0,1,2, then a 2×3 merged image at s = 3 (T 3, H 3-4, W 3-5), text 6,7,8: δ = −3."""
    ids = [1, 2, TOKENS.image, 3, 4, 5]  # the start token is text here
    out, media = expand_prompt(ids, [_item("image", (1, 4, 6))], TOKENS, 2, _encode)
    assert out == (1, 2, *[TOKENS.image] * 6, 3, 4, 5)
    p = media.positions
    assert p[:, :2].tolist() == [[0, 1]] * 3
    assert p[0, 2:8].tolist() == [2] * 6
    assert p[1, 2:8].tolist() == [2, 2, 2, 3, 3, 3] and p[2, 2:8].tolist() == [2, 3, 4] * 2
    assert p[:, 8:].tolist() == [[5, 6, 7]] * 3 and media.rope_delta == -3
    assert media.positions_for(9, 3).tolist() == [[6, 7, 8]] * 3  # decode after the prompt


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_positions_match_transformers_get_rope_index(family):
    from tests.vision.tiny_vl import hf_vl_model

    model = hf_vl_model(family).model
    items = [_item("image", (1, 4, 6)), _item("image", (1, 6, 2)),
             _item("video", (2, 4, 4), timestamps=(0.5, 1.5))]
    ids = [5, 6, TOKENS.start, TOKENS.image, TOKENS.end, 7, TOKENS.start, TOKENS.image,
           TOKENS.end, 8, 9, TOKENS.start, TOKENS.video, TOKENS.end, 10]
    out, media = expand_prompt(ids, items, TOKENS, 2, _encode)
    types = torch.tensor([[1 if t == TOKENS.image else 2 if t == TOKENS.video else 0
                           for t in out]])
    theirs, delta = model.get_rope_index(
        torch.tensor([out]), types, image_grid_thw=torch.tensor([[1, 4, 6], [1, 6, 2]]),
        video_grid_thw=torch.tensor([[2, 4, 4]]))
    assert torch.equal(media.positions, theirs[:, 0]) and media.rope_delta == int(delta)
    # the template's start and end stay around the pairs, each pair in its own (transformers)
    assert out.count(TOKENS.video) == 8 and out.count(TOKENS.start) == 5
    assert out.count(TOKENS.end) == 5 and out[-1] == 10 and out[-2] == out[-3] == TOKENS.end
    assert [s.row for s in media.spans] == [0, 0, 0, 4]


def test_placeholder_count_must_match():
    with pytest.raises(MediaError, match="placeholders for 2 image"):
        expand_prompt([TOKENS.image, TOKENS.image], [_item("image", (1, 4, 4))], TOKENS, 2,
                      _encode)


def test_prefix_key_tells_images_apart():
    ids = [1, TOKENS.image, 2]
    a = expand_prompt(ids, [_item("image", (1, 4, 4), digest="a")], TOKENS, 2, _encode)
    b = expand_prompt(ids, [_item("image", (1, 4, 4), digest="b")], TOKENS, 2, _encode)
    assert a[0] == b[0] and a[1].prefix_key(a[0]) != b[1].prefix_key(b[0])
    assert a[1].prefix_key(a[0])[0] == 1 and a[1].prefix_key(a[0])[1] < 0
