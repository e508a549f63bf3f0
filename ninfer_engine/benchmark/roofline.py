"""Roofline arithmetic for `ninfer bench` (perf-anchors §6): pure functions of the text config,
and the bytes a step reads from the served matrices (`step_weight_bytes`, `state_bytes`).

Two floors per measurement, each as tokens per second:
- bandwidth: `tokens × copy_bandwidth / bytes touched per step`;
- compute: `tokens × matmul_rate / FLOPs per step` (the rate of a large bf16 `torch.matmul`
  measured in the same run).
The roofline of a measurement is the lower (slower) of the two.

Matmul parameters are the 2-D matrices one token multiplies by: every layer matrix and the
output head; not the embedding (only gathered) nor the depthwise GDN convolution (a few FLOPs
per channel). Routed experts count `top_k / E` of their matrices per token.
"""

from __future__ import annotations

from ..artifact.synth import parameter_shapes


def active_params(config: dict, head: bool = True) -> int:
    """Matmul parameters one token multiplies by (routed experts: top_k of E), optionally
    without the output head."""
    E, k = config.get("num_experts", 0), config.get("num_experts_per_tok", 0)
    total = 0.0
    for name, shape in parameter_shapes(config).items():
        if len(shape) != 2 or name.endswith(("token_embedding", "convolution")):
            continue
        if name == "text/output_head" and not head:
            continue
        n = shape[0] * shape[1]
        total += n * k / E if "/moe/experts/" in name else n
    if not head or "text/output_head" in parameter_shapes(config):
        return int(total)
    # a tied head multiplies by the embedding matrix
    return int(total + config["vocab_size"] * config["hidden_size"])


def attention_layers(config: dict) -> int:
    return sum(t == "full_attention" for t in config["layer_types"])


def attention_flops(config: dict, keys: int) -> int:
    """QKᵀ and PV FLOPs of one query token attending `keys` keys, all attention layers."""
    return 4 * attention_layers(config) * config["num_attention_heads"] * config["head_dim"] * keys


def decode_flops(config: dict, context: int) -> int:
    """FLOPs of one decode token at `context` (head included)."""
    return 2 * active_params(config) + attention_flops(config, context + 1)


def prefill_flops(config: dict, tokens: int, chunks: int = 1) -> int:
    """FLOPs of a causal prefill of `tokens` from an empty state: every non-head matrix per
    token, the head once per chunk (only the last row's logits are computed), causal attention
    (token t sees t+1 keys). The chunked GDN math (< 3 %, perf-anchors §6) is left out."""
    causal_keys = tokens * (tokens + 1) // 2
    head = config["vocab_size"] * config["hidden_size"]
    return (2 * active_params(config, head=False) * tokens + 2 * head * chunks
            + attention_flops(config, 1) * causal_keys)


def experts_read(config: dict, batch: int) -> tuple[int, float]:
    """Routed experts one layer reads for `batch` tokens: (bound used, expectation).

    The bound `min(E, batch × top_k)` is what the roofline uses (every slot a distinct expert;
    the `moe_gemv` kernel reads each slot's expert, repeats being cache hits at best). The
    expectation under uniform random routing, `E (1 − (1 − k/E)^batch)`, is reported beside it."""
    E, k = config["num_experts"], config["num_experts_per_tok"]
    return min(E, batch * k), E * (1 - (1 - k / E) ** batch)


def tok_s(tokens: int, amount: float, rate_per_s: float) -> float:
    """Tokens per second when a step of `tokens` tokens costs `amount` at `rate_per_s`."""
    return tokens * rate_per_s / amount


def roofline(tokens: int, nbytes: float, flops: float, gbps: float, tflops: float) -> dict:
    """Both floors and their minimum, as tok/s, for one step of `tokens` tokens."""
    bw = tok_s(tokens, nbytes, gbps * 1e9)
    fl = tok_s(tokens, flops, tflops * 1e12)
    return dict(bytes_per_step=int(nbytes), flops_per_step=int(flops),
                bandwidth_roofline_tok_s=bw, flop_roofline_tok_s=fl,
                roofline_tok_s=min(bw, fl), bound="bandwidth" if bw <= fl else "compute")


def step_weight_bytes(weights, batch: int) -> int:
    """Matrix bytes one step of `batch` rows reads from `weights` (`HybridWeights`: the forms
    served): everything once, routed experts for the union bound `min(E, B·top_k)` per layer
    (see `experts_read`)."""
    n = weights.weight_bytes()
    for layer in weights.layers:
        if "moe" in layer:
            per_expert = layer["experts_gu"].expert_bytes + layer["experts_down"].expert_bytes
            n += (experts_read(weights.c, batch)[0] - layer["moe"].top_k) * per_expert
    return n


def state_bytes(weights, batch: int, context: int) -> int:
    """Every sequence's GDN SSM state read + written (fp32), conv state, and bf16 KV read at
    `context`, for `batch` sequences."""
    n = 0
    for layer in weights.layers:
        m = layer["mixer"]
        if layer["kind"] == "linear_attention":
            n += 2 * m.nv * m.dk * m.dv * 4 + 2 * (m.taps - 1) * m.conv_dim * 2
        else:
            n += 2 * context * m.nkv * m.d * 2
    return batch * n
