"""The served engine against transformers' `Qwen3_5(Moe)ForConditionalGeneration` (the CPU, or
CUDA's fp32 path where there is a GPU):
a tiny seeded multimodal model converted with `ninfer convert hf`, loaded with `--vision`, gives
the same greedy tokens as HF's greedy loop (a full forward over the sequence each step, no
cache) for a prompt with two images and one with a short video; then the same prompt again
(the media cache and the prefix tree in play) gives them again."""
from __future__ import annotations

import asyncio
import importlib.util

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.types import GenerationRequest, SamplingParams
from ninfer_engine.vision.decode import image_item, video_item
from tests.vision.media_samples import mp4, png
from tests.vision.tiny_vl import (
    IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START, hf_vl_model, write_vl_artifact,
)

STEPS = 12


def _hf_greedy(model, ids, media, pre) -> list[int]:
    images = [it for it in media.items if it.kind == "image"]
    videos = [it for it in media.items if it.kind == "video"]
    extra = {}

    def pixels(items):
        return torch.cat([torch.from_numpy(pre.normalize(i.pixels.patches)) for i in items])
    if images:
        extra["pixel_values"] = pixels(images)
        extra["image_grid_thw"] = torch.tensor([i.pixels.grid for i in images])
    if videos:
        extra["pixel_values_videos"] = pixels(videos)
        extra["video_grid_thw"] = torch.tensor([v.pixels.grid for v in videos])
    tokens: list[int] = []
    with torch.inference_mode():
        for _ in range(STEPS):
            seq = [*ids, *tokens]
            types = [[1 if t == IMAGE_PAD else 2 if t == VIDEO_PAD else 0 for t in seq]]
            logits = model(input_ids=torch.tensor([seq]), mm_token_type_ids=torch.tensor(types),
                           use_cache=False, **extra).logits[0, -1]
            tokens.append(int(logits.argmax()))
    return tokens


def _engine_greedy(engine, ids, media, rid) -> list[int]:
    request = GenerationRequest(rid, ids, SamplingParams(temperature=0.0), max_tokens=STEPS,
                                ignore_eos=True, media=media)

    async def run():
        return [t for e in [e async for e in engine.submit(request)] for t in e.token_ids]
    return asyncio.run(run())


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_greedy_tokens_match_transformers_with_two_images_and_a_video(family, tmp_path):
    model = hf_vl_model(family)
    path = write_vl_artifact(model, tmp_path)
    # prefill chunks of 16 cut through the media spans
    # cuda_dtype: on a CUDA machine the exact fp32 path (tower included), as transformers
    engine = Engine(EngineConfig(artifact=path, vision=True, max_context=1024,
                                 prefill_chunk=16, cuda_dtype="fp32"))
    engine.start()
    try:
        vision = engine.vision
        pre = vision.preprocessor
        text = [ord(c) for c in "Compare "]
        two_images = [*text, VISION_START, IMAGE_PAD, VISION_END, ord(" "),
                      VISION_START, IMAGE_PAD, VISION_END, *[ord(c) for c in "please"]]
        images = [image_item(png(40, 56, 1), pre), image_item(png(72, 24, 2), pre)]
        video = [*text, VISION_START, VIDEO_PAD, VISION_END, ord("?")]
        cases = [(two_images, images)]
        if importlib.util.find_spec("av"):  # install.sh has PyAV; a bare GPU image may not
            cases.append((video, [video_item(mp4(), pre)]))
        for n, (ids, items) in enumerate(cases):
            expanded, media = vision.planner.prepare(ids, items, engine.tokenizer.encode)
            assert media.media_tokens > 16  # the spans cross chunk boundaries
            expected = _hf_greedy(model, expanded, media, pre)
            assert _engine_greedy(engine, expanded, media, f"r{n}") == expected
            encoded = vision.encoded_items
            # again: the media cache skips the encoder, the tree restores the prompt's prefix
            assert _engine_greedy(engine, expanded, media, f"again{n}") == expected
            assert vision.encoded_items == encoded
        assert engine.memory.hits >= len(cases)
        _failed_encoder_fails_its_request_only(engine, cases[0][0])
    finally:
        engine.stop()


def _failed_encoder_fails_its_request_only(engine, ids):
    """The encoder raising (out of memory, say) ends that request with an error; a request
    beside it and the engine go on."""
    vision = engine.vision

    def broken(patches, grids):
        raise RuntimeError("CUDA out of memory (simulated)")
    vision.encoder.encode = broken
    items = [image_item(png(40, 56, n), vision.preprocessor) for n in (7, 8)]
    expanded, media = vision.planner.prepare(ids, items, engine.tokenizer.encode)

    async def both():
        async def last(request):
            return [e async for e in engine.submit(request)][-1]
        return await asyncio.gather(
            last(GenerationRequest("bad", expanded, SamplingParams(temperature=0.0),
                                   max_tokens=4, media=media)),
            last(GenerationRequest("good", tuple(range(5, 40)), SamplingParams(temperature=0.0),
                                   max_tokens=4, ignore_eos=True)))
    bad, good = asyncio.run(both())
    assert bad.finish == "error" and "out of memory" in bad.error.message
    assert good.finish == "length" and good.usage.completion_tokens == 4
    assert engine.state.value == "ready"
