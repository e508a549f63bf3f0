"""`--spec mtp` on a media prompt against the float64 reference of model-math.md §3.1 built from
what transformers' own multimodal model feeds its language model: a tiny seeded Qwen3.5 VL model
with a seeded MTP head, converted with `ninfer convert hf`, loaded with `--vision --spec mtp`
(the CPU's fp32 engine, prefill chunks of 16 cutting through the image). The engine's first
round of drafts after the prompt must be the reference's: pairs (h_t, x_{t+1}) at the MRoPE
positions p_t, an image pad x_{t+1} embedded by its vision row, the drafts after the prompt at
t + rope delta. (Drafts that ran at text positions over the pad token's embedding, as before,
differ: checked below.)"""
from __future__ import annotations


import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.step.spec_policy import AlwaysSpeculate
from tests.models.mtp_tiny import HfMtp
from tests.vision.tiny_vl import IMAGE_PAD, VISION_END, VISION_START, hf_vl_model, \
    serve_image_prompt, write_vl_artifact

K = 3


def _hf_inputs(model, ids, media, pre) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(final-normed hiddens [T, H], the language model's input embeddings [T, H] and its
    MRoPE positions [3, T]) of HF's forward over the prompt, images included."""
    seen = {}

    def note(module, args, kwargs):
        seen["embeds"], seen["positions"] = kwargs["inputs_embeds"], kwargs["position_ids"]
    hook = model.model.language_model.register_forward_pre_hook(note, with_kwargs=True)
    images = list(media.items)
    try:
        with torch.inference_mode():
            out = model.model(
                input_ids=torch.tensor([ids]),
                mm_token_type_ids=torch.tensor([[int(t == IMAGE_PAD) for t in ids]]),
                pixel_values=torch.cat([torch.from_numpy(pre.normalize(i.pixels.patches))
                                        for i in images]),
                image_grid_thw=torch.tensor([i.pixels.grid for i in images]), use_cache=False)
    finally:
        hook.remove()
    positions = seen["positions"]
    positions = positions[-3:, 0]  # (a leading text-position row, where transformers adds one)
    return out.last_hidden_state[0], seen["embeds"][0], positions


def test_the_first_drafts_on_a_media_prompt_are_the_references(tmp_path):
    model, mtp = hf_vl_model("qwen3_5"), HfMtp("qwen3_5")
    path = write_vl_artifact(model, tmp_path, mtp=mtp.checkpoint())
    engine = Engine(EngineConfig(artifact=path, vision=True, max_context=1024, prefill_chunk=16,
                                 cuda_dtype="fp32", spec="mtp", draft_tokens=K))
    engine.speculator.policy = AlwaysSpeculate()
    drafter, rounds = engine.speculator.drafter, []
    propose = drafter.propose_rows
    drafter.propose_rows = lambda seqs, ks: rounds.append(propose(seqs, ks)) or rounds[-1]
    engine.start()
    try:
        pre = engine.vision.preprocessor
        ids = [*map(ord, "Look at "), VISION_START, IMAGE_PAD, VISION_END, *map(ord, " now")]
        out, expanded, media = serve_image_prompt(engine, ids, 8)
        first = out[0]
    finally:
        engine.stop()
    assert media.media_tokens > 16  # the image crosses chunk boundaries
    hidden, embeds, positions = _hf_inputs(model, list(expanded), media, pre)
    T = len(expanded)
    assert torch.equal(positions, media.positions)  # the target's positions are HF's
    head = model.lm_head.weight.double()
    vocab = drafter.vocab

    def drafts(pads: bool, mrope: bool) -> list[int]:
        """The reference's k drafts after the prompt; `pads`/`mrope` False: as if the pads'
        pairs took the pad token's embedding / every pair its index as position."""
        delta = int(positions.max()) + 1 - T if mrope else 0
        tokens = torch.tensor([*expanded[1:], first])
        hiddens, out = hidden.double(), []
        for s in range(K):
            at = torch.arange(T + s)
            pos = (torch.cat([positions, (torch.arange(T, T + s) + delta).expand(3, -1)], 1)
                   if mrope else at)
            rows = (torch.arange(T - 1), embeds[1:]) if pads else None  # x_1..x_{T-1}
            h = mtp.reference(model, tokens, hiddens, pos, rows)[-1]
            draft = int((h @ head.t())[:vocab].argmax())
            out.append(draft)
            tokens = torch.cat([tokens, torch.tensor([draft])])
            hiddens = torch.cat([hiddens, h[None]])
        return out

    want = drafts(pads=True, mrope=True)
    assert rounds and rounds[0] == [want]
    # what the head ran as before (text positions, the pad token's embedding) drafts otherwise
    assert drafts(pads=False, mrope=False) != want
