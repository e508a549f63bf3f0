"""`--spec dflash` on a media prompt against z-lab's drafter fed what transformers' own
multimodal model computes: a tiny seeded Qwen3.5 VL model and a seeded z-lab DFlash drafter
(tests/models/zlab_dflash.py), converted together with `ninfer convert hf --dflash`, loaded
with `--vision --spec dflash` (the CPU's fp32 engine, prefill chunks of 16 cutting through the
image). The drafter's context is the target's tap features of every prompt position, image
positions included (computed over the vision rows, at the MRoPE positions); its own positions
are token indices (z-lab's `dflash_generate`). The engine's first proposal after the prompt (the
drafter's hiddens of its mask rows) must be the reference's within both sides' fp32 rounding,
and its output the same as without `--spec`."""
from __future__ import annotations


import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.step.spec_policy import AlwaysSpeculate
from tests.artifact.test_convert_dflash import _zlab
from tests.models.qwen35_tiny import hybrid_depth, rel_err
from tests.models.test_dflash import _depth
from tests.tolerance import bound
from tests.vision.tiny_vl import IMAGE_PAD, VISION_END, VISION_START, VOCAB, hf_vl_model, \
    serve_image_prompt, tower_depth, write_vl_artifact

K = 4
TAPS = [0, 2]
MASK = VOCAB - 1  # above the byte tokenizer's ids: never a draft


def _drafter(folder):
    """z-lab's drafter at the VL target's width and vocabulary, saved as a checkpoint."""
    drafter = _zlab(TAPS)
    drafter.config.dflash_config = {"target_layer_ids": TAPS, "mask_token_id": MASK}
    drafter.config.vocab_size = VOCAB
    drafter.save_pretrained(folder, safe_serialization=True)
    return drafter


def _serve(path, spec: str | None, ids: list[int]):
    """(output tokens, the drafter's proposal hiddens in order, the expanded prompt, its media,
    the engine's preprocessor) of one greedy request: `ids` with a 40x56 image at its pad."""
    engine = Engine(EngineConfig(artifact=path, vision=True, max_context=1024, prefill_chunk=16,
                                 cuda_dtype="fp32", spec=spec, draft_tokens=K))
    rounds = []
    if spec:
        engine.speculator.policy = AlwaysSpeculate()
        propose = engine.speculator.drafter.model.propose
        # each proposal's hiddens (the mask rows', before the head)
        engine.speculator.drafter.model.propose = (
            lambda *a: rounds.append(propose(*a)) or rounds[-1])
    engine.start()
    try:
        out, expanded, media = serve_image_prompt(engine, ids, 10)
        return out, rounds, expanded, media, engine.vision.preprocessor
    finally:
        engine.stop()


def test_the_first_proposal_on_a_media_prompt_is_the_references(tmp_path):
    model = hf_vl_model("qwen3_5")
    drafter = _drafter(tmp_path / "drafter")
    path = write_vl_artifact(model, tmp_path, "--dflash", str(tmp_path / "drafter"))
    ids = [*map(ord, "Look at "), VISION_START, IMAGE_PAD, VISION_END, *map(ord, " now")]
    out, rounds, expanded, media, pre = _serve(path, "dflash", ids)
    assert out == _serve(path, None, ids)[0]  # greedy: drafts change the speed, not the tokens
    assert media.media_tokens > 16  # the image crosses chunk boundaries
    assert rounds and len(rounds[0]) == 1 and rounds[0][0].shape[0] == K

    # the reference: HF's target over the prompt, image included, its tap features; z-lab's
    # drafter over them with the block [first output, MASK x K] at token positions T..T+K
    images, T = list(media.items), len(expanded)
    with torch.inference_mode():
        hf = model.model(
            input_ids=torch.tensor([list(expanded)]),
            mm_token_type_ids=torch.tensor([[int(t == IMAGE_PAD) for t in expanded]]),
            pixel_values=torch.cat([torch.from_numpy(pre.normalize(i.pixels.patches))
                                    for i in images]),
            image_grid_thw=torch.tensor([i.pixels.grid for i in images]),
            output_hidden_states=True, use_cache=False)
        features = torch.cat([hf.hidden_states[t + 1][0] for t in TAPS], -1)  # [T, 2H]
        noise = model.get_input_embeddings()(torch.tensor([[out[0]] + [MASK] * K]))
        h = drafter(position_ids=torch.arange(T + 1 + K)[None], noise_embedding=noise,
                    target_hidden=features[None], use_cache=False, is_causal=False)[0, 1:]
        # what a context without the image's features (the pad token's embedding at its rows,
        # as a text-only forward computes them) would propose instead
        blind = model.model.language_model(input_ids=torch.tensor([list(expanded)]),
                                           output_hidden_states=True, use_cache=False)
        blind = torch.cat([blind.hidden_states[t + 1][0] for t in TAPS], -1)
        h_blind = drafter(position_ids=torch.arange(T + 1 + K)[None], noise_embedding=noise,
                          target_hidden=blind[None], use_cache=False, is_causal=False)[0, 1:]
    # both sides fp32: the tower, the target over the prompt and the drafter
    text = model.config.text_config.to_dict()
    frame = max(g[1] * g[2] for g in (i.pixels.grid for i in images))
    limit = bound(torch.float32, tower_depth(frame) + hybrid_depth(text, T)
                  + _depth(drafter.config.to_dict(), len(TAPS), T + 1 + K))
    assert rel_err(rounds[0][0], h) <= limit, (rel_err(rounds[0][0], h), limit)
    assert rel_err(h_blind, h) > 10 * limit  # (the check tells the image's features apart)
