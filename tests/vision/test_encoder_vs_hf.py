"""The vision tower against transformers' `Qwen3_5VisionModel` (model-math.md §6, §7): the same
merged embeddings for two images of different grids and a two-frame-pair video, in one call.
Ours runs on the suite's device (`NINFER_TEST_DEVICE`, fp32), transformers on the CPU."""
from __future__ import annotations

import pytest
import torch

from tests.tolerance import bound
from tests.vision.tiny_vl import hf_vl_model, our_encoder, tower_depth

# (t, h, w) patch grids: two images and a video of two frame pairs (each frame its own segment)
GRIDS = [(1, 4, 6), (1, 6, 2), (2, 4, 4)]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_vision_embeddings_match_transformers(family, device):
    model = hf_vl_model(family)
    patches = torch.randn(sum(t * h * w for t, h, w in GRIDS), 3 * 2 * 4 * 4,
                          generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = model.model.visual(patches, grid_thw=torch.tensor(GRIDS)).pooler_output
    ours = our_encoder(model, device=device).encode(patches, GRIDS).cpu()
    assert ours.shape == theirs.shape == (sum(t * h * w for t, h, w in GRIDS) // 4, 64)
    # both sides fp32 over the tower's chain (tests.tolerance), the largest frame's attention
    tol = bound(torch.float32, tower_depth(max(h * w for _, h, w in GRIDS)))
    assert (ours - theirs).abs().max().item() <= tol * theirs.abs().max().item()


def test_frames_attend_within_themselves(device):
    """Changing the second frame pair of a video leaves the first pair's embeddings alone."""
    model = hf_vl_model("qwen3_5")
    encoder = our_encoder(model, device=device)
    patches = torch.randn(32, 96, generator=torch.Generator().manual_seed(2))
    first = encoder.encode(patches, [(2, 4, 4)])
    patches[16:] += 1.0
    second = encoder.encode(patches, [(2, 4, 4)])
    assert torch.equal(first[:4], second[:4]) and not torch.allclose(first[4:], second[4:])


def test_mismatched_patches_are_refused():
    encoder = our_encoder(hf_vl_model("qwen3_5"))
    with pytest.raises(ValueError, match="do not match the grids"):
        encoder.encode(torch.zeros(10, 96), [(1, 4, 4)])
