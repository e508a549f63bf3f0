"""The MTP head (`models.mtp`) against transformers' own blocks assembled per model-math.md
§3.1 in float64 (HF has no MTP module), its weights taken from a checkpoint's `mtp.*` tensors
through `ninfer convert hf`'s name mapping; `ninfer synth --mtp` asks for the same names."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.artifact.hf_names import mtp_params_from_hf
from ninfer_engine.artifact.synth import parameter_shapes
from ninfer_engine.models.mtp import MtpHead
from ninfer_engine.models.qwen3_5 import dict_params
from tests.tolerance import TRANSCENDENTAL, assert_within, bound

from .mtp_tiny import HfMtp
from .qwen35_tiny import hf_model, ours

FAMILIES = ["qwen3_5", "qwen3_5_moe"]


def _depth(c: dict, keys: int) -> float:
    """Roundings along the head's longest chain (tests/tolerance.py conventions): each
    zero-centred norm a length-H sum of squares, an rsqrt and two products; the fc's 2H-long
    dots; q (H) and its D-norm, rotary (cos/sin are the same fp32 tables on both sides), scores
    (D), softmax (exp, a `keys`-long sum, a division) and P·V (`keys`), the sigmoid gate, the
    output projection (nq·D); the FFN's longest path (router softmax over E, and the expert or
    MLP dots H then I); the residual adds; the final norm (the head adds its H-long dot)."""
    h, d = c["hidden_size"], c["head_dim"]
    norm = h + TRANSCENDENTAL + 2
    width = max(c.get("moe_intermediate_size", 0), c.get("shared_expert_intermediate_size", 0),
                c.get("intermediate_size", 0))
    router = c.get("num_experts", 0) + TRANSCENDENTAL + 2
    attention = (h + d + TRANSCENDENTAL + 2 + 3 + d + 1 + TRANSCENDENTAL + keys + 1 + keys
                 + TRANSCENDENTAL + 1 + c["num_attention_heads"] * d)
    ffn = router + h + TRANSCENDENTAL + 1 + width
    return norm + 2 * h + norm + attention + 1 + norm + ffn + 1 + norm


@pytest.mark.parametrize("family", FAMILIES)
def test_mtp_head_matches_transformers_blocks_in_float64(family):
    target_hf = hf_model(family)
    target, mtp = ours(target_hf), HfMtp(family)
    head = MtpHead(target, dict_params(mtp_params_from_hf(mtp.checkpoint(), target.config)))
    gen = torch.Generator().manual_seed(5)
    # two sequences: their committed pairs in one call (5 from position 7, 3 from 0), then two
    # one-pair draft steps each, extending the same MTP KV
    lengths, starts, steps = [5, 3], [7, 0], 2
    tokens = [torch.randint(0, target.vocab_size, (n + steps,), generator=gen) for n in lengths]
    hidden = [torch.randn(n + steps, target.config["hidden_size"], generator=gen)
              for n in lengths]
    positions = [torch.arange(s, s + n + steps) for s, n in zip(starts, lengths)]
    caches = [head.new_cache() for _ in lengths]
    first = head(torch.cat([t[:n] for t, n in zip(tokens, lengths)]),
                 torch.cat([x[:n] for x, n in zip(hidden, lengths)]), caches, lengths,
                 torch.cat([p[:n] for p, n in zip(positions, lengths)]))
    got = list(first.split(lengths))
    for s in range(steps):
        at = [n + s for n in lengths]
        out = head(torch.stack([t[i] for t, i in zip(tokens, at)]),
                   torch.stack([x[i] for x, i in zip(hidden, at)]), caches, [1, 1],
                   torch.stack([p[i] for p, i in zip(positions, at)]))
        got = [torch.cat([g, out[b: b + 1]]) for b, g in enumerate(got)]
    head_weight = target_hf.get_output_embeddings().weight.double()
    for b, n in enumerate(lengths):
        want = mtp.reference(target_hf, tokens[b], hidden[b], positions[b])
        depth = _depth(target.config, n + steps)
        assert_within(got[b], want, bound(torch.float32, depth, sides=1) * want.abs().max())
        logits = want @ head_weight.t()
        limit = bound(torch.float32, depth + target.config["hidden_size"], sides=1)
        assert_within(head.logits(got[b]), logits, limit * logits.abs().max())
    assert [c.length for c in caches] == [n + steps for n in lengths]


def test_a_media_prompts_pairs_match_transformers_blocks_in_float64():
    """Pairs at MRoPE positions ([3, T]: an image's grid, then text at t + rope delta), the
    image pads' pairs embedded by their vision rows (model-math.md §3.1), against the float64
    reference given the same positions and rows."""
    family = "qwen3_5"
    target_hf = hf_model(family)
    target, mtp = ours(target_hf), HfMtp(family)
    head = MtpHead(target, dict_params(mtp_params_from_hf(mtp.checkpoint(), target.config)))
    gen = torch.Generator().manual_seed(6)
    T, H = 14, target.config["hidden_size"]
    tokens = torch.randint(0, target.vocab_size, (T,), generator=gen)
    hidden = torch.randn(T, H, generator=gen)
    positions = torch.arange(T).expand(3, -1).clone()  # pads 3..6: a 2 × 2 grid
    positions[:, 3:7] = torch.stack([torch.full((4,), 3), torch.arange(4) // 2 + 3,
                                     torch.arange(4) % 2 + 3])
    positions[:, 7:] -= 2  # the text after the grid goes on from 5: rope delta -2
    media = (torch.arange(2, 6), torch.randn(4, H, generator=gen))  # pairs whose x_{t+1} is a pad
    got = head(tokens, hidden, [head.new_cache()], [T], positions, media)
    want = mtp.reference(target_hf, tokens, hidden, positions, media)
    depth = _depth(target.config, T)
    tol = bound(torch.float32, depth, sides=1) * want.abs().max()
    plain = mtp.reference(target_hf, tokens, hidden, torch.arange(T))  # what it ran at before
    assert_within(got, want, tol)
    assert (plain - want).abs().max() > 100 * tol  # the positions and rows make a difference


@pytest.mark.parametrize("family", FAMILIES)
def test_synth_asks_for_the_names_convert_hf_writes(family):
    target_hf = hf_model(family)
    config = ours(target_hf).config
    converted = mtp_params_from_hf(HfMtp(family).checkpoint(), config)
    synth = {name: shape for name, shape in parameter_shapes(config, mtp=True).items()
             if name.startswith("mtp/")}
    assert synth == {name: tuple(t.shape) for name, t in converted.items()}
    assert not any(name.startswith("mtp/") for name in parameter_shapes(config))


def test_a_moe_head_holds_its_routed_experts_stacked():
    """Stacked experts run as two grouped GEMMs on CUDA (`SparseMoE.use_grouped`); separate
    ones would loop over the routed experts after a host sync in every draft step."""
    target = ours(hf_model("qwen3_5_moe"))
    ckpt = mtp_params_from_hf(HfMtp("qwen3_5_moe").checkpoint(), target.config)
    moe = MtpHead(target, dict_params(ckpt)).block.ffn
    gate_up, down = moe.stacked
    assert gate_up.w.shape[0] >= moe.n_experts and down.w.shape[0] >= moe.n_experts
    for e, expert in enumerate(moe.experts):  # each the checkpoint's expert e
        assert torch.equal(expert.down, ckpt[f"mtp/layers/0/moe/experts/{e}/down"])
