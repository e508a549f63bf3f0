"""The DFlash drafter (model-math.md §3.3): the target's tap features are HF's
`hidden_states[l+1]`; the drafter's proposal forward against a float64 re-implementation of the
spec written here (its own RoPE, norms, windowed non-causal attention); the published 35B
drafter's shape is the spec's 385.9M parameters; synth writes a loadable component."""
from __future__ import annotations

import math

import pytest
import torch

from ninfer_engine.artifact import dflash_names
from ninfer_engine.models.dflash import DFlashContext, load_dflash
from tests.engine.dflash_helpers import DFlashArtifact
from tests.models.qwen35_tiny import hybrid_depth, ours, rel_err
from tests.tolerance import TRANSCENDENTAL, bound


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_tap_features_are_the_hf_hidden_states_of_the_tap_layers(family):
    artifact = DFlashArtifact(family)
    model = ours(artifact.hf)
    model.feature_taps = (2, 0)  # out of layer order: concatenated in tap order
    tokens = torch.randint(0, 128, (23,), generator=torch.Generator().manual_seed(2))
    state = model.new_state()
    # two prompt chunks, as the engine's prefill computes them
    _, first = model.forward_rows(tokens[:16], [state], [16], keep_hidden=True)
    _, second = model.forward_rows(tokens[16:], [state], [7], keep_hidden=True)
    with torch.no_grad():
        hs = artifact.hf(tokens[None], output_hidden_states=True).hidden_states
    want = torch.cat([hs[3][0], hs[1][0]], -1)
    got = torch.cat([first, second])
    assert got.shape == (23, 2 * 64)
    # both sides fp32; the chain to layer 2's output is shorter than the forward to the logits
    limit = bound(torch.float32, hybrid_depth(model.config, len(tokens)))
    assert rel_err(got, want) <= limit, (rel_err(got, want), limit)


def _rms(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, positions, theta):
    """Split-half RoPE of x [T, heads, D] at `positions`, float64."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * inv[None]
    cos = torch.cat([angles.cos()] * 2, -1)[:, None]
    sin = torch.cat([angles.sin()] * 2, -1)[:, None]
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + half * sin


def reference(t: dict, c: dict, embedding, features, anchor: int, k: int):
    """§3.3 in float64: the final-normed outputs of the k mask rows, the context the features of
    positions 0..L-1, the block [anchor, MASK×k] at L..L+k."""
    t = {n: v.double() for n, v in t.items() if n.startswith("dflash/")}
    eps, theta = c["rms_norm_eps"], c["rope_parameters"]["rope_theta"]
    nq, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    L = features.shape[0]
    cond = _rms(features.double() @ t["dflash/input_projection"].T, t["dflash/hidden_norm"], eps)
    mask = c["dflash_config"]["mask_token_id"]
    x = embedding.double()[[anchor] + [mask] * k]
    ctx_pos, blk_pos = torch.arange(L), torch.arange(L, L + k + 1)
    key_pos = torch.arange(L + k + 1)
    for n, kind in enumerate(c["layer_types"]):
        w = {name.split(f"dflash/layers/{n}/")[1]: v for name, v in t.items()
             if name.startswith(f"dflash/layers/{n}/")}
        y = _rms(x, w["input_norm"], eps)
        q = _rope(_rms((y @ w["attention/query"].T).view(-1, nq, d), w["attention/query_norm"],
                       eps), blk_pos, theta)

        def keys(src, pos):
            return _rope(_rms((src @ w["attention/key"].T).view(-1, nkv, d),
                              w["attention/key_norm"], eps), pos, theta)

        keys_all = torch.cat([keys(cond, ctx_pos), keys(y, blk_pos)])
        values = torch.cat([cond, y]) @ w["attention/value"].T
        values = values.view(-1, nkv, d)
        out = torch.empty(k + 1, nq, d, dtype=torch.float64)
        for head in range(nq):
            g = head // (nq // nkv)
            scores = q[:, head] @ keys_all[:, g].T / math.sqrt(d)
            if kind == "sliding_attention":
                far = (blk_pos[:, None] - key_pos[None, :]).abs() >= c["sliding_window"]
                scores = scores.masked_fill(far, float("-inf"))
            out[:, head] = torch.softmax(scores, -1) @ values[:, g]
        x = x + out.reshape(k + 1, -1) @ w["attention/output"].T
        z = _rms(x, w["post_attention_norm"], eps)
        x = x + (torch.nn.functional.silu(z @ w["mlp/gate"].T) * (z @ w["mlp/up"].T)) @ w[
            "mlp/down"].T
    return _rms(x, t["dflash/final_norm"], eps)[1:]


def _depth(c: dict, taps: int, context: int) -> float:
    """fp32 roundings of the drafter's longest chain (tests/tolerance.py's conventions): fc
    (taps·H) and its RMSNorm (H); per layer the RMSNorm (H), a projection (H), the q/k norm (D)
    and RoPE, the scores (D·√D·max|w|², as `hybrid_depth` counts them), softmax and P·V over
    the context and block (2 × context), the output projection (nq·D), the residual, the
    RMSNorm (H), the MLP (H + I) and the residual; then the final RMSNorm (H)."""
    H, D, nq, I = (c["hidden_size"], c["head_dim"], c["num_attention_heads"],
                   c["intermediate_size"])
    T = TRANSCENDENTAL
    layer = (H + T + H + D + T + 4 + D * D ** 0.5 * 1.5 ** 2 + 2 * context + T + nq * D + 1
             + H + T + H + I + T + 1)
    return taps * H + H + T + len(c["layer_types"]) * layer + H + T


def test_the_proposal_forward_matches_a_float64_reimplementation_of_the_spec():
    artifact = DFlashArtifact("qwen3_5")
    model = ours(artifact.hf)
    c = artifact.drafter_config
    drafter = load_dflash(artifact, model, model.device, torch.float32)
    L, k = 21, 7  # past the sliding window (8): the window decides what layer 0 sees
    gen = torch.Generator().manual_seed(5)
    features = torch.randn(L, 3 * 64, generator=gen)
    ctx = DFlashContext(drafter, 0)
    drafter.extend(ctx, features[:13])  # the context grows chunk by chunk
    drafter.extend(ctx, features[13:])
    assert ctx.first == [21 - 8, 0]  # the sliding layer keeps only the last window's keys
    got = drafter.propose([17], [ctx], [k])[0]
    want = reference(artifact._tensors, c, artifact._tensors["text/token_embedding"], features,
                     17, k)
    limit = bound(torch.float32, _depth(c, 3, L + k + 1), sides=1)
    assert got.shape == (k, 64)
    assert rel_err(got, want.float()) <= limit, (rel_err(got, want.float()), limit)
    # the window is what the reference says: without it, the outputs move far beyond the bound
    wide = dict(c, layer_types=["full_attention"] * 2)
    assert rel_err(got, reference(artifact._tensors, wide, artifact._tensors[
        "text/token_embedding"], features, 17, k).float()) > 100 * limit


def test_the_published_drafter_shape_is_the_specs_385_9m_parameters():
    config = dflash_names.synth_config({"num_hidden_layers": 40, "hidden_size": 2048,
                                        "vocab_size": 248320}, real=True)
    total = sum(math.prod(s) for s in dflash_names.parameter_shapes(config).values())
    assert round(total / 1e6, 1) == 385.9
    assert config["dflash_config"] == {"target_layer_ids": [1, 6, 11, 16, 22, 27, 32, 37],
                                       "mask_token_id": 248077}
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
