"""A test harness for the engine's hybrid step (`qwen3_5_step.HybridStep`) over KV pools of
its own, so its logits can be compared with the reference model's forward row by row.

`StepHarness(model, params, capacity, batch=B)` runs `HybridStep` for B sequences of up to
`capacity` tokens: a paged bf16 KV pool per attention layer with pages handed out in shuffled
order (as an allocator would after churn) and state rows; `load_state` copies a reference
`ModelState` into a row. The engine serves the same step over its shared pool and state slots
(`EngineHybridDecoder`); `ninfer bench` times the engine itself.
"""

from __future__ import annotations

import torch

from ninfer_engine.models.qwen3_5_step import HybridStep
from ninfer_engine.models.qwen3_5_step_weights import HybridWeights, KvLayer
from ninfer_engine.kernels.paged_attention import PAGE
from ninfer_engine.models.fused import FusedParams


class StepHarness:
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

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """One decode step from `token` [B]; returns logits [B, V], advances every position
        (the expert routing read before and settled after, as the engine's decoder does)."""
        self.core.before_step()
        self.token.copy_(token)
        logits = self.core.step(self.B, self.span)
        self.core.after_launch()
        return logits
