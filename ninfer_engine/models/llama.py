"""The `llama` family forward (SmolLM2, Llama, Qwen3 dense) in plain torch, device-agnostic.

Pre-norm blocks: plain RMSNorm, fused QKV, optional per-head Q/K RMSNorm (Qwen3), split-half
RoPE, causal GQA over the KV cache, fused gate/up SwiGLU, final norm, (tied) head. See
docs/model-math.md §8.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..parallel.group import SINGLE, RankGroup
from .attention import Segment, attend, plan_segments
from .kv_cache import ContiguousKvCache
from .layers import Linear, RotaryEmbedding, apply_rope, rms_norm
from .packed import PackedMatrix, cat_rows, load_projection


class WeightSource(Protocol):
    def parameter(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype = ...
    ) -> torch.Tensor: ...

    def has_parameter(self, name: str) -> bool: ...


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool

    @classmethod
    def from_text_config(cls, cfg: dict) -> LlamaConfig:
        """Read the artifact's text config (HF field names)."""
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise NotImplementedError(f"rope_type {rope_type!r} is not supported (llama family)")
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: Linear
    qk_norm: torch.Tensor | None  # [heads + kv_heads, D]: q_norm rows then k_norm rows
    output: Linear
    post_attention_norm: torch.Tensor
    gate_up: Linear
    down: Linear


class LlamaModel:
    """Weights plus `forward()` over a flat batch of segments; holds no per-request state."""

    def __init__(self, cfg: LlamaConfig, weights: WeightSource,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 matmul_dtype: torch.dtype | None = None,
                 weights_mode: str = "dequant", ranks: RankGroup = SINGLE) -> None:
        """`ranks`: tensor parallelism; `cfg` and `weights` are then this rank's share
        (`parallel.shard`) and the layer outputs are all-reduced."""
        self.cfg = cfg
        self.ranks = ranks
        self.device = torch.device(device)
        self.dtype = dtype
        H, D, I = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
        nq, nkv = cfg.num_heads, cfg.num_kv_heads

        def load(name: str, *shape: int) -> torch.Tensor:
            return weights.parameter(f"text/{name}", shape, dtype).to(self.device)

        def load_linear(name: str, *shape: int) -> torch.Tensor | PackedMatrix:
            kept = load_projection(weights, f"text/{name}", shape, self.device, dtype,
                                   weights_mode)
            return load(name, *shape) if kept is None else kept

        self.embedding = load("token_embedding", cfg.vocab_size, H)
        head = (self.embedding if cfg.tie_word_embeddings
                else load_linear("output_head", cfg.vocab_size, H))
        lo, hi = ranks.vocab_rows(cfg.vocab_size)  # the vocab-parallel head: this rank's rows
        self.head = Linear(head[lo:hi] if ranks.parallel else head, matmul_dtype)
        self.final_norm = load("final_norm", H)
        has_qk_norm = weights.has_parameter("text/layers/0/attention/query_norm")
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"layers/{i}/"
            qk_norm = None
            if has_qk_norm:
                qk_norm = torch.cat([
                    load(p + "attention/query_norm", D).expand(nq, D),
                    load(p + "attention/key_norm", D).expand(nkv, D),
                ])
            self.layers.append(_Layer(
                input_norm=load(p + "input_norm", H),
                qkv=Linear(cat_rows([
                    load_linear(p + "attention/query", nq * D, H),
                    load_linear(p + "attention/key", nkv * D, H),
                    load_linear(p + "attention/value", nkv * D, H),
                ]), matmul_dtype),
                qk_norm=qk_norm,
                output=Linear(load_linear(p + "attention/output", H, nq * D), matmul_dtype),
                post_attention_norm=load(p + "post_attention_norm", H),
                gate_up=Linear(cat_rows([load_linear(p + "mlp/gate", I, H),
                                         load_linear(p + "mlp/up", I, H)]), matmul_dtype),
                down=Linear(load_linear(p + "mlp/down", H, I), matmul_dtype),
            ))
        self.rope = RotaryEmbedding(D, cfg.rope_theta, self.device)
        self.scale = D**-0.5

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def kv_layout(self) -> tuple[int, int, int]:
        """(attention layers, KV heads, head dim) of the paged KV pool."""
        return self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim

    @property
    def query_heads(self) -> int:
        """Query heads of an attention layer (this rank's under tensor parallelism)."""
        return self.cfg.num_heads

    def weight_bytes(self) -> int:
        """Bytes of every weight held, the `--cpu-matmul` decode copies included."""
        tensors = [self.embedding, self.final_norm, self.head.weight]
        linears = [self.head]
        for layer in self.layers:
            tensors += [layer.input_norm, layer.qkv.weight, layer.output.weight,
                        layer.post_attention_norm, layer.gate_up.weight, layer.down.weight]
            tensors += [layer.qk_norm] if layer.qk_norm is not None else []
            linears += [layer.qkv, layer.output, layer.gate_up, layer.down]
        unique = {t.data_ptr(): t.nbytes for t in tensors}
        return sum(unique.values()) + sum(linear.narrow_bytes for linear in linears)

    def new_cache(self) -> ContiguousKvCache:
        """A standalone single-sequence cache (the engine leases from the paged pool instead)."""
        c = self.cfg
        return ContiguousKvCache(c.num_layers, c.num_kv_heads, c.head_dim, self.dtype, self.device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, segments: list[Segment],
                logit_rows: torch.Tensor) -> torch.Tensor:
        """tokens/positions [T] (segments concatenated in order) -> logits [len(logit_rows), V].

        Writes each segment's K/V into its cache; only the rows in `logit_rows` reach the head.
        """
        c = self.cfg
        T, nq, nkv, D = tokens.shape[0], c.num_heads, c.num_kv_heads, c.head_dim
        eps = c.rms_norm_eps
        plans = plan_segments(segments, self.device)
        max_position = max(s.start + s.length for s in segments) - 1
        cos, sin = self.rope.tables(positions, max_position)
        x = self.embedding[tokens]
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(rms_norm(x, layer.input_norm, eps))
            qk = qkv[:, : (nq + nkv) * D].view(T, nq + nkv, D)
            v = qkv[:, (nq + nkv) * D :].view(T, nkv, D)
            if layer.qk_norm is not None:
                qk = rms_norm(qk, None, eps) * layer.qk_norm
            qk = apply_rope(qk, cos, sin)
            attn = attend(i, qk[:, :nq], qk[:, nq:], v, plans, self.scale)
            x.add_(self.ranks.all_reduce(layer.output(attn)))
            gate, up = layer.gate_up(rms_norm(x, layer.post_attention_norm, eps)).chunk(2, dim=-1)
            x.add_(self.ranks.all_reduce(layer.down(torch.nn.functional.silu(gate).mul_(up))))
        x = rms_norm(x[logit_rows], self.final_norm, eps)
        # the samplers work on fp32 logits
        return self.ranks.gather_vocab(self.head(x).float(), c.vocab_size)
