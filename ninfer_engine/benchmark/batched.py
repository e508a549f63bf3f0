"""Static-buffer decode of B sequences in one step, over a `KernelDecoder`'s weights.

`BatchedDecoder(decoder, batch, capacity)` reuses the decoder's matrices (so an fp8 run does
not quantise twice) and holds its own per-sequence state: GDN conv `[B, K-1, C]` and fp32 SSM
`[B, nv, dk, dv]` state, a paged KV pool of `B × pages` pages with a shuffled page table
`[B, pages]`, and device positions `[B]`. One step is graph-capturable: dense matmuls on
`[B, H]` (cuBLAS bf16 or the fp8-row dequant GEMV), GDN and paged attention over B rows, and
the routed experts through `moe_gemv` with one row per (token, slot) — B·top_k slots in one
launch, each reading its expert (no host sync, no Python loop over tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels.gdn_decode import gdn_decode_triton
from ..kernels.moe_gemv import moe_gemv_triton
from ..kernels.paged_attention import PAGE, paged_attention_triton
from ..kernels.rmsnorm import rms_norm_triton
from ..kernels.rotary import rope_triton
from ..kernels.sampling import argmax_triton
from .decode import KernelDecoder
from .roofline import experts_read


class BatchedDecoder:
    """B sequences decoded together with the weights of `decoder`; `capacity` tokens each."""

    def __init__(self, decoder: KernelDecoder, batch: int, capacity: int):
        self.dec, self.c, self.B = decoder, decoder.c, batch
        self.model, self.eps = decoder.model, decoder.eps
        dev = self.model.embedding.device
        self.capacity = capacity
        self.pages = -(-capacity // PAGE)
        self.state = []
        for layer in decoder.layers:
            m = layer["mixer"]
            if layer["kind"] == "linear_attention":
                s = dict(conv=torch.zeros(batch, m.taps - 1, m.conv_dim, device=dev,
                                          dtype=torch.bfloat16),
                         ssm=torch.zeros(batch, m.nv, m.dk, m.dv, device=dev))
            else:
                shape = (batch * self.pages, PAGE, m.nkv, m.d)
                s = dict(k=torch.zeros(shape, device=dev, dtype=torch.bfloat16),
                         v=torch.zeros(shape, device=dev, dtype=torch.bfloat16))
            self.state.append(s)
        # pages handed out in a shuffled order, interleaved between the sequences
        self.table = torch.randperm(batch * self.pages, device=dev).int().view(batch, self.pages)
        self.rows = torch.arange(batch, device=dev)
        self.pos = torch.zeros(batch, device=dev, dtype=torch.long)
        self.token = torch.zeros(batch, device=dev, dtype=torch.long)

    # -- state -------------------------------------------------------------------------------

    def load_state(self, b: int, state) -> None:
        """Copy a reference `ModelState` (contiguous KV, GDN state) into sequence slot `b`."""
        L, dev = state.seen, self.pos.device
        t = torch.arange(L, device=dev)
        slots = self.table[b].long()[t // PAGE] * PAGE + t % PAGE
        for layer, s, src in zip(self.dec.layers, self.state, state.layers):
            if layer["kind"] == "linear_attention":
                s["conv"][b].copy_(src.conv)
                s["ssm"][b].copy_(src.ssm)
            else:
                for name, kv in (("k", src.k), ("v", src.v)):
                    pool = s[name].view(-1, *s[name].shape[2:])
                    pool.index_copy_(0, slots, kv.transpose(0, 1).to(pool.dtype))
        self.pos[b] = L

    def fill_random(self, ctx: int, token: int = 1234) -> None:
        """Random KV and GDN state as if every sequence had consumed `ctx` tokens."""
        for s in self.state:
            if "ssm" in s:
                s["conv"].normal_()
                s["ssm"].normal_(std=0.1)
            else:
                s["k"].normal_()
                s["v"].normal_()
        self.pos.fill_(ctx)
        # distinct inputs: distinct routing per sequence
        self.token.copy_((token + self.rows) % self.c["vocab_size"])

    # -- bytes -------------------------------------------------------------------------------

    def weight_bytes(self) -> int:
        """Matrix bytes one step reads: everything once, routed experts for the union bound
        `min(E, B·top_k)` per layer (see `roofline.experts_read`)."""
        n = self.dec.weight_bytes()
        for layer in self.dec.layers:
            if "moe" in layer:
                per_expert = (layer["experts_gu"][0].numel()
                              + layer["experts_down"][0].numel()) * 2
                n += (experts_read(self.c, self.B)[0] - layer["moe"].top_k) * per_expert
        return n

    def state_bytes(self, ctx: int) -> int:
        """Every sequence's GDN state read + written, conv state and KV at context `ctx`."""
        return self.B * self.dec.state_bytes(ctx)

    # -- the step ----------------------------------------------------------------------------

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """One decode step from `token` [B]; returns logits [B, V], advances every position."""
        x = F.embedding(token, self.model.embedding)
        delta, h = x, None
        for layer, s in zip(self.dec.layers, self.state):
            b = layer["block"]
            y, h = rms_norm_triton(delta, b.input_norm, self.eps, h, True)
            gdn = layer["kind"] == "linear_attention"
            mix = self._gdn(layer, s, y) if gdn else self._attn(layer, s, y)
            y, h = rms_norm_triton(mix, b.post_norm, self.eps, h, True)
            g, u = layer["w_gu"](y).chunk(2, -1)
            delta = layer["w_down"](F.silu(g) * u)
            if "moe" in layer:
                delta = delta * torch.sigmoid(F.linear(y, layer["moe"].shared_score))
                delta = delta + self._experts(layer, y)
        y, _ = rms_norm_triton(delta, self.model.final_norm, self.eps, h, True)
        self.pos += 1
        return self.dec.head(y)

    def greedy_step(self):
        """Graph-friendly autoregressive step of all B sequences."""
        self.token.copy_(argmax_triton(self.step(self.token)))
        return self.token

    def _gdn(self, layer, s, y):
        m, B = layer["mixer"], self.B
        kg, vg = m.nk * m.dk, m.nv * m.dv
        qkv, z, b, a = layer["w_in"](y).split([2 * kg + vg, vg, m.nv, m.nv], -1)
        window = torch.cat([s["conv"], qkv[:, None]], 1)  # [B, K, C]
        s["conv"].copy_(window[:, 1:])
        qkv = F.silu((window.float() * m.conv.float()).sum(1))
        q, k, v = qkv.split([kg, kg, vg], -1)
        g = -m.a_log.exp() * F.softplus(a.float() + m.dt_bias)
        o = gdn_decode_triton(q.reshape(B, m.nk, m.dk), k.reshape(B, m.nk, m.dk),
                              v.reshape(B, m.nv, m.dv), g, torch.sigmoid(b.float()), s["ssm"])
        o = o.to(torch.bfloat16).float()
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)
        o = (m.norm * o.to(torch.bfloat16) * F.silu(z.reshape(B, m.nv, m.dv).float()))
        return layer["w_out"](o.to(torch.bfloat16).reshape(B, vg))

    def _attn(self, layer, s, y):
        m, B = layer["mixer"], self.B
        qd, kvd = m.nq * m.d, m.nkv * m.d
        q, gate, k, v = layer["w_in"](y).split([qd, qd, kvd, kvd], -1)
        q, _ = rms_norm_triton(q.reshape(B * m.nq, m.d), m.q_norm, self.eps, None, True)
        k, _ = rms_norm_triton(k.reshape(B * m.nkv, m.d), m.k_norm, self.eps, None, True)
        theta = self.c["rope_parameters"]["rope_theta"]
        q = rope_triton(q.view(B, m.nq, m.d), self.pos, m.rope.rd, theta)
        k = rope_triton(k.view(B, m.nkv, m.d), self.pos, m.rope.rd, theta)
        slot = self.table[self.rows, self.pos // PAGE].long() * PAGE + self.pos % PAGE
        s["k"].view(-1, m.nkv, m.d).index_copy_(0, slot, k)
        s["v"].view(-1, m.nkv, m.d).index_copy_(0, slot, v.reshape(B, m.nkv, m.d))
        a = paged_attention_triton(q, s["k"], s["v"], self.table, (self.pos + 1).int(),
                                   max_seq_len=self.capacity)
        return layer["w_out"](a.reshape(B, qd) * torch.sigmoid(gate))

    def _experts(self, layer, y):
        """Top-k routed SwiGLU experts of every token: B·k (token, slot) rows, one launch each
        for gate|up and down."""
        moe, B = layer["moe"], self.B
        k = moe.top_k
        probs = torch.softmax(F.linear(y, moe.router).float(), -1)
        weights, ids = torch.topk(probs, k, -1)  # [B, k]
        if moe.renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        ids = ids.reshape(B * k)
        rows = y[:, None].expand(B, k, y.shape[-1]).reshape(B * k, -1)
        if B * k == 1:  # moe_gemv reads a single row as shared by every slot: same thing
            rows = y
        g, u = moe_gemv_triton(rows, layer["experts_gu"], ids).chunk(2, -1)
        down = moe_gemv_triton(F.silu(g) * u, layer["experts_down"], ids)  # [B·k, H]
        out = (down.view(B, k, -1) * weights.to(y.dtype)[..., None]).float().sum(1)
        return out.to(y.dtype)
