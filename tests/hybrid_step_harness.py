"""The benchmark's decoder: the engine's hybrid decode step over KV pools of its own.

`KernelDecoder(model, params, capacity, batch=B)` runs `hybrid_decode.HybridStep` (the step the
engine serves hybrid models with) for B sequences of up to `capacity` tokens: a paged bf16 KV
pool per attention layer with pages handed out in shuffled order (as an allocator would after
churn), GDN rows and device-side positions, so one step is capturable in a CUDA graph and
replays as real autoregressive decode (`greedy_step` feeds back each row's argmax). State comes
from a reference `ModelState` (`load_state`) or is random at a given context (`fill_random`).
"""

from __future__ import annotations

import torch

from ..step.decode_graphs import context_bucket
from ..models.qwen3_5_step import HybridStep, HybridWeights, KvLayer
from ..kernels.paged_attention import PAGE
from ..kernels.sampling import argmax_triton
from ..models.fused import FusedParams
from .roofline import experts_read


class KernelDecoder:
    """B sequences decoded together; `weights` shares an existing decoder's matrices."""

    def __init__(self, model, params: FusedParams, capacity: int, batch: int = 1,
                 weights: HybridWeights | None = None):
        self.weights = weights or HybridWeights(model, params)
        self.model, self.c, self.B, self.capacity = model, model.config, batch, capacity
        self.span = capacity  # the attention kernel's context bound (`HybridStep.step`)
        dev = model.embedding.device
        pages = -(-capacity // PAGE)
        self.kv = []
        for layer in self.weights.layers:
            if layer["kind"] != "linear_attention":
                m = layer["mixer"]
                shape = (batch * pages, PAGE, m.nkv, m.d)
                k = torch.zeros(shape, device=dev, dtype=torch.bfloat16)
                v = torch.zeros(shape, device=dev, dtype=torch.bfloat16)
                self.kv.append(KvLayer(k, v, None, None, self._writer(k, v),
                                       (k.view(-1, m.nkv, m.d), v.view(-1, m.nkv, m.d))))
        self.core = HybridStep(self.weights, batch, pages, lambda: self.kv)
        self.core.table.copy_(torch.randperm(batch * pages, device=dev).view(batch, pages))
        self.token, self.pos = self.core.tokens, self.core.pos

    @staticmethod
    def _writer(k_pages, v_pages):
        def write(slots, k, v):
            k_pages.view(-1, *k_pages.shape[2:]).index_copy_(0, slots, k.to(k_pages.dtype))
            v_pages.view(-1, *v_pages.shape[2:]).index_copy_(0, slots, v.to(v_pages.dtype))
        return write

    def load_state(self, state, row: int = 0) -> None:
        """Copy a reference `ModelState` (contiguous KV, GDN state) into sequence `row`."""
        L, dev = state.seen, self.pos.device
        t = torch.arange(L, device=dev)
        slots = self.core.table[row][t // PAGE] * PAGE + t % PAGE
        gdn = attn = 0
        for layer, src in zip(self.weights.layers, state.layers):
            if layer["kind"] == "linear_attention":
                self.core.conv[gdn][row].copy_(src.conv)
                self.core.ssm[gdn][row].copy_(src.ssm)
                gdn += 1
            else:
                self.kv[attn].write(slots, src.k.transpose(0, 1), src.v.transpose(0, 1))
                attn += 1
        self.pos[row] = L
        self.span = self.capacity

    def fill_random(self, ctx: int, token: int = 1234) -> None:
        """Random KV and GDN state as if every sequence had consumed `ctx` tokens."""
        for t in (*self.core.conv, *self.core.ssm):
            t.normal_(std=0.1 if t.dtype == torch.float32 else 1.0)
        for kv in self.kv:
            kv.k.normal_()
            kv.v.normal_()
        self.pos.fill_(ctx)
        # the engine's graph for this context: its bucket, not the pool's capacity (a 32K
        # split grid costs a 1K-context 35B-A3B step ~10 %); 64 steps of room
        self.span = context_bucket(ctx + 64, self.capacity)
        # distinct inputs: distinct routing per sequence
        self.token.copy_(token + torch.arange(self.B, device=self.token.device))

    def state_bytes(self, ctx: int) -> int:
        """Every sequence's GDN SSM state read + written, conv state, and KV read at `ctx`."""
        n = 0
        for layer in self.weights.layers:
            m = layer["mixer"]
            if layer["kind"] == "linear_attention":
                n += 2 * m.nv * m.dk * m.dv * 4 + 2 * (m.taps - 1) * m.conv_dim * 2
            else:
                n += 2 * ctx * m.nkv * m.d * 2
        return self.B * n

    def weight_bytes(self) -> int:
        """Matrix bytes one step reads: everything once, routed experts for the union bound
        `min(E, B·top_k)` per layer (see `roofline.experts_read`)."""
        n = self.weights.weight_bytes()
        for layer in self.weights.layers:
            if "moe" in layer:
                per_expert = layer["experts_gu"].expert_bytes + layer["experts_down"].expert_bytes
                n += (experts_read(self.c, self.B)[0] - layer["moe"].top_k) * per_expert
        return n

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """One decode step from `token` [B]; returns logits [B, V], advances every position."""
        self.token.copy_(token)
        return self.core.step(self.B, self.span)

    def greedy_step(self):
        """Graph-friendly autoregressive step: feed back each row's argmax."""
        self.token.copy_(argmax_triton(self.core.step(self.B, self.span)))
        return self.token
