"""A tiny Qwen3.5 config with 64-wide heads (the kernels' interpreter path is exact there) and a
deterministic bf16 parameter source over it."""

from __future__ import annotations

import torch

from ninfer_engine.artifact.synth import parameter_shapes, synth_config, synthetic_blocks

DIMS = dict(hidden_size=128, head_dim=64, num_attention_heads=4, num_key_value_heads=2,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
            linear_value_head_dim=64, vocab_size=512)


def tiny_config(moe: bool) -> dict:
    config = synth_config("tiny-moe" if moe else "tiny-dense")
    config.update(DIMS)
    # one GDN and one attention layer: the interpreter runs every kernel program in Python
    config.update(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    config["rope_parameters"]["mrope_section"] = [3, 3, 2]  # 8 rotary frequencies
    if moe:
        config.update(moe_intermediate_size=64, shared_expert_intermediate_size=64)
    else:
        config["intermediate_size"] = 256
    return config


def tiny_source(config: dict, dtype=torch.bfloat16, seed: int = 0, mtp: bool = False):
    shapes = parameter_shapes(config, mtp)

    def params(name, shape):
        assert shapes[name] == tuple(shape), name
        t = torch.cat([b.reshape(-1) for b in synthetic_blocks(name, shape, seed)]).view(shape)
        return t if name.endswith(("a_log", "dt_bias")) else t.to(dtype)

    return params


# bf16 stores along one decode step of this two-layer model, per side: the GDN layer's norm,
# projections, gated norm, output projection, residual, norm, gate/up, SiLU, product, down and
# residual (11); the attention layer's norm, QKV, q / k norms, RoPE, the K/V store, the dot
# operands K, V and P, the output, its gate and product, the output projection, the residual,
# the norm, the MLP's 4 stores and the residual (20); the router's and the experts' weights (2),
# the final norm and the head (2)
STEP_STORES = 35


def bf16_step_tol(config: dict, context: int, extra_stores: int = 0) -> float:
    """Worst-case relative bound (`tests.tolerance`) between two bf16 computations of a decode
    step's logits: `STEP_STORES` (+ `extra_stores`) stores each, `cast_roundings()` apiece (the
    interpreter truncates), over the fp32 chain of `qwen35_tiny.hybrid_depth`."""
    from tests.models.qwen35_tiny import hybrid_depth
    from tests.tolerance import bound, cast_roundings

    stores = (STEP_STORES + extra_stores) * cast_roundings()
    return bound(torch.bfloat16, hybrid_depth(config, context), roundings=stores)
