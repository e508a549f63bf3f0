"""bf16 on CUDA with decode graphs, media in the prompt, against fp32 (the H200:
`NINFER_TEST_DEVICE=cuda pytest -m gpu -s tests/vision/test_bf16_graphs_vs_fp32.py`).

The engine serves the tiny hybrid multimodal Qwen3.5 (tiny_vl, dense: no routing flips) as it
serves on CUDA by default: weights, activations, KV and the tower in bf16, decode steps replayed
from captured CUDA graphs (counted). Prompts: two images, and a short video (PyAV).

The reference is transformers' fp32 forward on the CPU, which the engine's fp32 path matches
token for token (test_engine_vs_hf, on the CPU and on CUDA), teacher-forced on the bf16 run's
own tokens: one forward over the prompt and those tokens gives the fp32 logits z of every step
with the bf16 step's context. Bounds are worst cases (tests.tolerance) counting every bf16
rounding on the chain, weights included (the reference keeps them in fp32):

1. tower rows: the rows the engine put into the prompt (its media cache) are transformers'
   fp32 tower rows within γ of TOWER_STORES bf16 roundings, 0.23 of max|rows|; the rows of
   another image of the same size are 0.28 away (measured on the fp32 reference, the same on
   any machine; asserted), so a wrong image's rows fail. (The video's two frame pairs
   swapped are 0.23 away: the bound does not tell that apart, and no assert claims it.)
2. logits: |log-softmax_bf16 − log-softmax(z)| ≤ 2 · tol · max|z| at every step, tol over
   the longest chain (the tower's rows, then the text layers): γ of ~142 roundings ≈ 1.25, so
   this only catches gross errors (non-finite values, another sequence's logits, a scale);
3. tokens: where z's top-2 margin exceeds 2 · tol · max|z|, bf16's token is z's argmax (by
   induction bf16's free-running tokens equal fp32's up to the first near tie: as many as bf16
   arithmetic allows); at a near tie it is within that margin of it. For this random tiny
   model no step is settled: its fp32 margins are at most 0.32 of the bound's (measured on
   the reference), and another image moves its log-probs by at most 0.16 of it — bf16
   rounding may be as large as the media's whole effect on its logits, so no logit tolerance
   derived from bf16's epsilon can pin its tokens. The test prints what the H200 measured:
   the errors against the bounds and how many leading tokens equal fp32's free-running ones.
"""
from __future__ import annotations

import asyncio
import importlib.util

import numpy as np
import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.types import GenerationRequest, SamplingParams
from ninfer_engine.vision.decode import image_item, video_item
from ninfer_engine.vision.preprocess import Pixels
from ninfer_engine.vision.prompt import MediaItem
from tests import tolerance
from tests.models.qwen35_tiny import hybrid_depth
from tests.vision.media_samples import mp4, png
from tests.vision.tiny_vl import (
    IMAGE_PAD, VIDEO_PAD, VISION, VISION_END, VISION_START, VOCAB, hf_vl_model, tower_depth,
    write_vl_artifact,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

STEPS = 16
# bf16 roundings along the longest chain to a tower row (tests.tolerance; "W" is a weight and its
# bias, rounded once relative to their terms): the input cast, the patch W and output, the
# position table and its sum (5); per block the norm W and output, QKV W and output, rotary q/k,
# P and the attention output (the dot operands), the projection W and output, the residual, the
# norm W and output, fc1 W and output, GELU, fc2 W and output, the residual (18); the merger's
# norm W and output, fc1 W and output, GELU, fc2 W and output (7)
TOWER_STORES = 5 + 18 * VISION["depth"] + 7
# then to a logit: the media rows into the embeddings (1), per text layer the stores
# tests/engine/test_hybrid_graphs.py counts (a GDN layer 11, the attention layer 5 + 15 with
# the dense MLP) plus its weights (a GDN layer: in-projections, conv, A/dt, the three norms,
# out-projection, gate/up, down: 9; the attention layer: QKV, q and k norms, two norms,
# o-projection, gate/up, down: 8), the final norm W and output, the head W and output (4)
TEXT_STORES = {"linear_attention": 11 + 9, "full_attention": 20 + 8}


def _bound(depth: float, stores: int) -> float:
    """One bf16 side (stores in bf16, reductions in fp32) plus the fp32 reference's chain."""
    cast = tolerance.cast_roundings()
    return (tolerance.bound(torch.bfloat16, depth, roundings=stores * cast, sides=1)
            + tolerance.bound(torch.float32, depth, sides=1))


def tower_tolerance(frame_patches: int) -> float:
    return _bound(tower_depth(frame_patches), TOWER_STORES)


def logit_tolerance(model, context: int, frame_patches: int) -> float:
    text = model.config.text_config.to_dict()
    stores = TOWER_STORES + 1 + sum(TEXT_STORES[k] for k in text["layer_types"]) + 4
    return _bound(tower_depth(frame_patches) + hybrid_depth(text, context), stores)


def tower_rows(model, pre, item: MediaItem) -> torch.Tensor:
    """transformers' fp32 tower rows of one item."""
    patches = torch.from_numpy(pre.normalize(item.pixels.patches))
    with torch.inference_mode():
        return model.model.visual(patches, grid_thw=torch.tensor([item.pixels.grid])
                                  ).pooler_output.double()


def reference_logits(model, ids, media, pre, tokens: list[int]) -> torch.Tensor:
    """transformers' fp32 logits [len(tokens), V] before each of `tokens`, teacher-forced."""
    extra = {}
    for kind, name in (("image", "pixel_values"), ("video", "pixel_values_videos")):
        items = [i for i in media.items if i.kind == kind]
        if items:
            extra[name] = torch.cat([torch.from_numpy(pre.normalize(i.pixels.patches))
                                     for i in items])
            extra[f"{kind}_grid_thw"] = torch.tensor([i.pixels.grid for i in items])
    seq = [*ids, *tokens]
    types = [[1 if t == IMAGE_PAD else 2 if t == VIDEO_PAD else 0 for t in seq]]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([seq]), mm_token_type_ids=torch.tensor(types),
                       use_cache=False, **extra).logits[0]
    return logits[len(ids) - 1: len(ids) - 1 + len(tokens)].double()


def cases(pre) -> list[tuple[str, list[int], list[MediaItem], list[MediaItem]]]:
    """(name, prompt ids, media, the control's media: the first image replaced, or the video's
    two frame pairs swapped)."""
    text = [ord(c) for c in "Compare "]
    two_images = [*text, VISION_START, IMAGE_PAD, VISION_END, ord(" "),
                  VISION_START, IMAGE_PAD, VISION_END, *[ord(c) for c in "please"]]
    images = [image_item(png(40, 56, 1), pre), image_item(png(72, 24, 2), pre)]
    out = [("two images", two_images, images, [image_item(png(40, 56, 9), pre), images[1]])]
    if importlib.util.find_spec("av"):
        clip = video_item(mp4(), pre)
        t, h, w = clip.pixels.grid
        assert t == 2  # two frame pairs to swap
        swapped = np.roll(clip.pixels.patches, h * w, axis=0)
        control = MediaItem("video", Pixels(swapped, clip.pixels.grid, clip.pixels.timestamps),
                            "swapped")
        out.append(("video", [*text, VISION_START, VIDEO_PAD, VISION_END, ord("?")], [clip],
                    [control]))
    return out


def _run(engine, ids, media, rid) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and the log-softmax of each step's logits [STEPS, V] (all of the vocabulary
    as the alternatives)."""
    sink: list = []
    request = GenerationRequest(rid, ids, SamplingParams(temperature=0.0), max_tokens=STEPS,
                                ignore_eos=True, media=media, logprobs=VOCAB, logprob_sink=sink)

    async def run():
        return [t for e in [e async for e in engine.submit(request)] for t in e.token_ids]
    tokens = asyncio.run(run())
    logp = torch.full((len(sink), VOCAB), float("nan"), dtype=torch.float64)
    for i, entry in enumerate(sink):
        for token, value in entry.top:
            logp[i, token] = value
    return tokens, logp


def check_steps(z: torch.Tensor, tokens: list[int], logp: torch.Tensor, tol: float) -> int:
    """Rules 1 and 2 of the module's docstring; returns the steps whose token was settled."""
    settled = 0
    for i, (row, token) in enumerate(zip(z, tokens)):
        limit = 2 * tol * row.abs().max().item()
        error = (logp[i] - row.log_softmax(-1)).abs().max().item()
        assert error <= limit, f"step {i}: log-prob error {error:.3g} over the bound {limit:.3g}"
        top = row.topk(2)
        if (top.values[0] - top.values[1]).item() > limit:
            assert token == int(top.indices[0]), f"step {i}: a settled token differs"
            settled += 1
        else:
            assert (top.values[0] - row[token]).item() <= limit, f"step {i}: not a near tie"
    return settled


def reference_greedy(model, ids, media, pre) -> list[int]:
    """transformers' fp32 greedy tokens (a full forward a step)."""
    tokens: list[int] = []
    for _ in range(STEPS):
        tokens.append(int(reference_logits(model, ids, media, pre, [*tokens, 0])[-1].argmax()))
    return tokens


def leading_equal(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_bf16_graph_tokens_follow_fp32_within_bf16_rounding(tmp_path):
    model = hf_vl_model("qwen3_5")
    path = write_vl_artifact(model, tmp_path)
    engine = Engine(EngineConfig(artifact=path, vision=True, max_context=1024,
                                 prefill_chunk=16))  # CUDA's defaults: bf16, graphs
    engine.start()
    try:
        graphs = engine.runner.graphs
        assert graphs is not None and graphs.capture
        replays = []
        forward = graphs.forward
        graphs.forward = lambda seqs: (replays.append(len(seqs)), forward(seqs))[1]
        vision, pre = engine.vision, engine.vision.preprocessor
        assert vision.encoder.dtype == torch.bfloat16
        report = []
        for name, ids, items, control_items in cases(pre):
            expanded, media = vision.planner.prepare(ids, items, engine.tokenizer.encode)
            before = len(replays)
            tokens, logp = _run(engine, expanded, media, name)
            # the first token is the prefill's; every later one a graph replay
            assert len(tokens) == STEPS and len(replays) - before == STEPS - 1
            frame = max(h * w for _, h, w in (i.pixels.grid for i in items))
            rows_tol = tower_tolerance(frame)
            rows_err = 0.0
            for item, control in zip(items, control_items):
                want = tower_rows(model, pre, item)
                got = vision.cache.get(item.key).double().cpu()
                rows_err = max(rows_err, ((got - want).abs().max() / want.abs().max()).item())
                if item.kind == "image" and control is not item:  # rule 1's control
                    other = tower_rows(model, pre, control)
                    assert (other - want).abs().max() > rows_tol * want.abs().max()
            assert rows_err <= rows_tol, f"{name}: tower rows {rows_err:.3g} > {rows_tol:.3g}"
            tol = logit_tolerance(model, len(expanded) + STEPS, frame)
            z = reference_logits(model, expanded, media, pre, tokens)
            settled = check_steps(z, tokens, logp, tol)
            logit_err = ((logp - z.log_softmax(-1)).abs().amax(-1)
                         / (2 * z.abs().amax(-1))).max().item()
            fp32 = reference_greedy(model, expanded, media, pre)
            report.append(f"{name}: tower rows {rows_err:.3g} of max (bound {rows_tol:.3g}); "
                          f"log-probs {logit_err:.3g} of 2·max|z| (bound {tol:.3g}); "
                          f"{settled}/{STEPS} tokens settled; the first "
                          f"{leading_equal(tokens, fp32)} equal fp32's greedy tokens")
        print("\n" + "\n".join(report))
    finally:
        engine.stop()
