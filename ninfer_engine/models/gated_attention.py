"""Gated full attention (`full_attention`) of the Qwen3-Next / Qwen3.5 family (model-math.md §2.2).

Torch reference path, over a step's rows (each its own sequence). Also holds the two helpers
the family shares: the zero-centred `(1+w)` RMSNorm and partial NeoX rotary with optional
interleaved MRoPE.
The KV cache is a simple contiguous per-sequence buffer (k after norm and RoPE, v as projected).
On CUDA the attention core runs SDPA, or `kernels.paged_prefill` over the engine's paged pool in
place whatever its KV dtype (`GatedAttention._attend_cuda`); the CPU keeps the fp32-softmax
reference `_attend`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..kernels._dispatch import use_triton
from ..kernels.paged_prefill import paged_prefill_triton, supported
from ..kernels.qk_norm_rope import qk_norm_rope_triton
from ..kernels.rmsnorm import rms_norm_triton
from ..kv.cache import LayerKv
from .attention import attend_paged, paged_batch
from .layers import Linear, sdpa, trailing_causal_mask
from .packed import prefill_fp8

ParamSource = Callable[[str, tuple[int, ...]], torch.Tensor]


def zero_centred_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """`x̂·(1+w)` computed in fp32, cast back to x's dtype (HF Qwen3NextRMSNorm rounding);
    one launch on CUDA (`kernels.rmsnorm`), not nine."""
    if use_triton(x):
        return rms_norm_triton(x, w, eps, zero_centred=True)[0]
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + w.float())).to(x.dtype)


def add_zero_centred_rms_norm(delta: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(`zero_centred_rms_norm(x + delta)`, `x + delta`): the residual add and the next norm,
    one launch on CUDA."""
    if use_triton(x):
        return rms_norm_triton(delta, w, eps, residual=x, zero_centred=True)
    x = x + delta
    return zero_centred_rms_norm(x, w, eps), x


class PartialRope:
    """NeoX split-half rotary over the first `rd` dims of each head.

    `positions` is [T] (1-D) or [3, T] (T/H/W axes for interleaved MRoPE: frequency i reads axis
    H when i%3==1 and i < 3·sec[1], W when i%3==2 and i < 3·sec[2], else T).
    """

    def __init__(self, head_dim: int, rope_parameters: dict,
                 device: torch.device | str = "cpu"):
        self.rd = int(head_dim * rope_parameters.get("partial_rotary_factor", 1.0))
        self.theta = theta = rope_parameters["rope_theta"]
        inv_freq = 1.0 / theta ** (torch.arange(0, self.rd, 2, dtype=torch.float) / self.rd)
        axis = torch.zeros(self.rd // 2, dtype=torch.long)
        section = rope_parameters.get("mrope_section")
        if section is not None:
            i = torch.arange(self.rd // 2)
            axis[(i % 3 == 1) & (i < 3 * section[1])] = 1
            axis[(i % 3 == 2) & (i < 3 * section[2])] = 2
        # on the model's device once: a host table copied per call (pageable memory) made
        # every attention layer of a CUDA prefill wait for the GPU to drain
        self.inv_freq, self.axis = inv_freq.to(device), axis.to(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin of shape [T, rd] in `dtype` (computed in fp32)."""
        pos = positions.float().reshape(-1, positions.shape[-1])  # [axes, T]
        inv = self.inv_freq.to(pos.device)
        freqs = pos[:, :, None] * inv  # [axes, T, rd/2]
        if pos.shape[0] > 1:
            axis = self.axis.to(pos.device)[None, None].expand(1, *freqs.shape[1:])
            freqs = freqs.gather(0, axis)
        emb = torch.cat([freqs[0], freqs[0]], -1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [heads, T, D]; rotates dims [0, rd), passes the rest through."""
        rot, rest = x[..., : self.rd], x[..., self.rd :]
        half = self.rd // 2
        rotated = torch.cat([-rot[..., half:], rot[..., :half]], -1)
        return torch.cat([rot * cos + rotated * sin, rest], -1)


@dataclass
class KVCache:
    """Contiguous per-sequence KV of one attention layer: k, v are [nkv, L, D]."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def length(self) -> int:
        return self.k.shape[1]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v [nkv, T, D]; returns all keys and values so far."""
        self.k = torch.cat([self.k, k], 1)
        self.v = torch.cat([self.v, v], 1)
        return self.k, self.v

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions (a rejected draft's keys and values go)."""
        self.k, self.v = self.k[:, :length], self.v[:, :length]


class GatedAttention:
    """One gated-attention mixer bound to `text/layers/i/attention/*` logical parameters."""

    def __init__(self, config: dict, params: ParamSource, prefix: str, rope: PartialRope,
                 matmul_dtype: torch.dtype | None = None):
        h = config["hidden_size"]
        self.nq, self.nkv = config["num_attention_heads"], config["num_key_value_heads"]
        self.d = config["head_dim"]
        self.eps = config["rms_norm_eps"]
        self.rope = rope
        p = prefix + "attention/"
        self.w_q = params(p + "query", (self.nq * self.d, h))
        self.w_gate = params(p + "gate", (self.nq * self.d, h))
        self.w_k = params(p + "key", (self.nkv * self.d, h))
        self.w_v = params(p + "value", (self.nkv * self.d, h))
        self.w_o = params(p + "output", (h, self.nq * self.d))
        # `--prefill-activations`: e4m3 prompt rows through fp8-row projections
        self.fp8_act = prefill_fp8(config)
        # the projections as called, few-row (decode) calls through `matmul_dtype` copies
        self.projections = tuple(Linear(w, matmul_dtype, relayout=False, fp8_act=self.fp8_act)
                                 for w in (self.w_q, self.w_gate, self.w_k, self.w_v, self.w_o))
        self.q, self.gate, self.k, self.v, self.o = self.projections
        self.in_proj: Linear | None = None  # q|gate|k|v as one matrix (`bind_fused`)
        self.q_norm = params(p + "query_norm", (self.d,))
        self.k_norm = params(p + "key_norm", (self.d,))

    def bind_fused(self, matrix) -> None:
        """Multiply CUDA steps' inputs by `matrix`, this layer's q|gate|k|v rows in one matrix
        (`models.fused.FusedParams`; its members are this layer's projections' views), and
        normalise and rotate q and k in one launch (`kernels.qk_norm_rope`: a head and half the
        rotated dims in powers of two; other shapes keep the separate projections)."""
        half = self.rope.rd // 2
        if self.d & (self.d - 1) == 0 and half & (half - 1) == 0:
            self.in_proj = Linear(matrix, relayout=False, fp8_act=self.fp8_act)

    def new_state(self, dtype: torch.dtype, device: torch.device) -> KVCache:
        empty = torch.zeros(self.nkv, 0, self.d, dtype=dtype, device=device)
        return KVCache(k=empty, v=empty.clone())

    def __call__(self, x: torch.Tensor, caches: list[KVCache], lengths: list[int],
                 positions: torch.Tensor) -> torch.Tensor:
        """x: [T, H] (normed input), rows of `lengths` tokens, positions [T] or [3, T] ->
        [T, H]; row i attends over and appends to `caches[i]`. The projections, q/k norms,
        rotary and output gate run over all rows at once, the attention core row by row.

        A cache is a `KVCache` or any object with its `length` / `extend` contract (the engine
        passes a view of the paged pool).
        """
        T = x.shape[0]

        def heads(y, n):  # [T, n·D] -> [n, T, D]
            return y.reshape(T, n, self.d).transpose(0, 1)

        wq, wkv, rd = self.nq * self.d, self.nkv * self.d, self.rope.rd
        if self.in_proj is not None and use_triton(x) and positions.dim() == 1:
            # q|gate|k|v in one GEMM, the q/k norms and the rotary in one launch (the decode
            # step's kernel: the rotation in fp32 from the rounded norms, rounded once)
            qkv = self.in_proj(x)
            q, k = qk_norm_rope_triton(qkv, self.nq, self.nkv, self.d, self.q_norm,
                                       self.k_norm, self.eps, positions, rd, self.rope.theta)
            q, k = q.transpose(0, 1), k.transpose(0, 1)
            _, gate, _, v = qkv.split([wq, wq, wkv, wkv], -1)
            v = heads(v, self.nkv)
        else:
            gate = None
            q = zero_centred_rms_norm(heads(self.q(x), self.nq), self.q_norm, self.eps)
            k = zero_centred_rms_norm(heads(self.k(x), self.nkv), self.k_norm, self.eps)
            v = heads(self.v(x), self.nkv)
            cos, sin = self.rope.cos_sin(positions, x.dtype)
            q, k = self.rope.apply(q, cos, sin), self.rope.apply(k, cos, sin)
        a = self._attend_rows(q, k, v, caches, lengths)
        if a is None:
            outs, start = [], 0
            for cache, n in zip(caches, lengths):
                rows = slice(start, start + n)
                outs.append(self._attend_row(q[:, rows], k[:, rows], v[:, rows], cache))
                start += n
            a = torch.cat(outs) if len(outs) > 1 else outs[0]
        a = a * torch.sigmoid(self.gate(x) if gate is None else gate)
        return self.o(a)

    def _attend_rows(self, q, k, v, caches, lengths) -> torch.Tensor | None:
        """Every row at once on CUDA where the step planned its rows together (`LayerKv.plans`,
        the llama family's in-place batch: one K/V scatter and one varlen launch a layer);
        q [nq, T, D], k, v [nkv, T, D] -> [T, nq·D]. None: attend row by row."""
        plans = getattr(caches[0], "plans", None)
        if plans is None or not use_triton(q):
            return None
        rows_q = q.transpose(0, 1)  # [T, nq, D]
        batch = paged_batch(plans, rows_q)
        if batch is None:
            return None
        a = attend_paged(caches[0].layer, rows_q, k.transpose(0, 1), v.transpose(0, 1), batch,
                         self.d**-0.5)
        for cache, n in zip(caches, lengths):  # as `LayerKv.append` would have
            cache.length += n
        return a

    def _attend_row(self, q, k, v, cache) -> torch.Tensor:
        """One row's attention core: q [nq, n, D], k, v [nkv, n, D] -> [n, nq·D]."""
        past = cache.length
        if use_triton(q):
            return self._attend_cuda(q, k, v, cache, past)
        keys, values = cache.extend(k, v)
        a = self._attend(q, keys, values, past)
        return a.transpose(0, 1).reshape(q.shape[1], self.nq * self.d)

    def _attend_cuda(self, q, k, v, cache, past: int) -> torch.Tensor:
        """The GPU path of the attention core; q [nq, T, D], k, v [nkv, T, D] -> [T, nq·D].

        Over the engine's paged pool (64-token pages, any KV dtype: the kernel dequantises in
        place), k/v go into the pages and `kernels.paged_prefill` attends over them (no gather);
        otherwise the cache gathers and SDPA attends with the bottom-right causal mask, so
        nothing of size [nq, T, L] is materialised either way.
        """
        T = q.shape[1]
        if isinstance(cache, LayerKv) and cache.kernel_readable and supported(self.d, q.dtype):
            cache.append(k, v)
            k_pages, v_pages = cache.layer_pages()  # each its codec's components
            a = paged_prefill_triton(q.transpose(0, 1), k_pages, v_pages,
                                     cache.cache.table_tensor(), past, self.d**-0.5)
            return a.reshape(T, self.nq * self.d)
        keys, values = cache.extend(k, v)
        mask = None
        if past and T > 1:  # query t sees keys 0 .. past+t
            mask = trailing_causal_mask(T, keys.shape[1], q.device)
        a = sdpa(q[None], keys[None], values[None], attn_mask=mask,
                 is_causal=past == 0 and T > 1, scale=self.d**-0.5, enable_gqa=True)
        return a[0].transpose(0, 1).reshape(T, self.nq * self.d)

    def _attend(self, q, k, v, past: int) -> torch.Tensor:
        """Causal GQA: query row t (absolute past+t) sees keys 0..past+t; returns [nq, T, D]."""
        T, L, r = q.shape[1], k.shape[1], self.nq // self.nkv
        # query head h uses KV head h // r
        k, v = k.repeat_interleave(r, 0), v.repeat_interleave(r, 0)
        scores = (q @ k.transpose(1, 2)) * self.d**-0.5
        allowed = torch.ones(T, L, dtype=torch.bool, device=q.device).tril(past)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype)
        return probs @ v
