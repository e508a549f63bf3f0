"""A static-buffer batch-1 decode step of a Qwen3.5 hybrid stack on the ninfer kernels.

`KernelDecoder` takes a `Qwen35Model` built over `models.fused.FusedParams` and runs one GEMV
per fused group. It runs batch-1 decode over static buffers (paged bf16 KV, in-place GDN conv/SSM
state, a device-side position), so one step is capturable in a CUDA graph and replays as real
autoregressive decode; dense matmuls use cuBLAS bf16 or the fused fp8-row dequant GEMV, routed
experts the `moe_gemv` kernel (bf16 only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import dequant_gemv as dq
from ..kernels.gdn_decode import gdn_decode_triton
from ..kernels.moe_gemv import moe_gemv_triton
from ..kernels.paged_attention import PAGE, paged_attention_triton
from ..kernels.rmsnorm import rms_norm_triton
from ..kernels.rotary import rope_triton
from ..kernels.sampling import argmax_triton
from ..models.fused import FusedParams


class _Linear:
    """`x Wᵀ` through cuBLAS bf16, or the fp8-row dequant GEMV over a quantised copy."""

    def __init__(self, w: torch.Tensor, fp8: bool):
        self.w = w
        self.q = dq.quantize_fp8_row(w) if fp8 else None

    def __call__(self, x):
        return F.linear(x, self.w) if self.q is None else dq.dequant_gemv_triton(x, *self.q)

    def nbytes(self):
        ts = self.q if self.q is not None else (self.w,)
        return sum(t.numel() * t.element_size() for t in ts)


class KernelDecoder:
    """Static batch-1 decode of a dense `Qwen35Model`'s weights with the ninfer kernels."""

    def __init__(self, model, params: FusedParams, capacity: int, fp8: bool = False):
        c = model.config
        self.c, self.model, self.eps = c, model, c["rms_norm_eps"]
        dev = model.embedding.device
        self.head = _Linear(model.head, fp8)
        self.layers = []
        for i, block in enumerate(model.blocks):
            kind = c["layer_types"][i]
            group = "gdn/" if kind == "linear_attention" else "attention/"
            prefix = f"text/layers/{i}/"
            m = block.mixer
            layer = dict(kind=kind, block=block, mixer=m,
                         w_in=_Linear(params.fused[prefix + group], fp8),
                         w_out=_Linear(m.w_out if group == "gdn/" else m.w_o, fp8))
            if hasattr(block.ffn, "router"):
                assert not fp8, "routed experts run in bf16 only"
                moe = block.ffn
                layer.update(moe=moe, experts_gu=params.fused[prefix + "moe/experts/gate_up"],
                             experts_down=params.fused[prefix + "moe/experts/down"],
                             w_gu=_Linear(params.fused[prefix + "moe/shared/"], False),
                             w_down=_Linear(moe.shared.down, False))
            else:
                layer.update(w_gu=_Linear(params.fused[prefix + "mlp/"], fp8),
                             w_down=_Linear(block.ffn.down, fp8))
            if group == "gdn/":
                layer["conv"] = torch.zeros(m.taps - 1, m.conv_dim, device=dev,
                                            dtype=torch.bfloat16)
                layer["ssm"] = torch.zeros(1, m.nv, m.dk, m.dv, device=dev)
            else:
                n_pages = -(-capacity // PAGE)
                shape = (n_pages, PAGE, m.nkv, m.d)
                layer["k"] = torch.zeros(shape, device=dev, dtype=torch.bfloat16)
                layer["v"] = torch.zeros(shape, device=dev, dtype=torch.bfloat16)
            self.layers.append(layer)
        n_pages = -(-capacity // PAGE)
        # pages handed out in a shuffled order, as a real allocator would after churn
        self.table = torch.randperm(n_pages, device=dev).int()[None]
        self.capacity = capacity
        self.pos = torch.zeros(1, device=dev, dtype=torch.long)
        self.token = torch.zeros(1, device=dev, dtype=torch.long)

    def load_state(self, state):
        """Copy a reference `ModelState` (contiguous KV, GDN state) into the static buffers."""
        L = state.seen
        slots = self.table[0].long()[torch.arange(L, device=self.pos.device) // PAGE] * PAGE \
            + torch.arange(L, device=self.pos.device) % PAGE
        for layer, s in zip(self.layers, state.layers):
            if layer["kind"] == "linear_attention":
                layer["conv"].copy_(s.conv)
                layer["ssm"][0].copy_(s.ssm)
            else:
                for name, src in (("k", s.k), ("v", s.v)):
                    pool = layer[name].view(-1, *layer[name].shape[2:])
                    pool.index_copy_(0, slots, src.transpose(0, 1))
        self.pos.fill_(L)

    def fill_random(self, ctx: int, token: int = 1234) -> None:
        """Random KV and GDN state as if `ctx` tokens had been consumed; next input `token`."""
        for layer in self.layers:
            if layer["kind"] == "linear_attention":
                layer["conv"].normal_()
                layer["ssm"].normal_(std=0.1)
            else:
                layer["k"].normal_()
                layer["v"].normal_()
        self.pos.fill_(ctx)
        self.token.fill_(token)

    def state_bytes(self, ctx: int) -> int:
        """GDN SSM state read + written, conv state, and the KV read at context `ctx`."""
        n = 0
        for layer in self.layers:
            m = layer["mixer"]
            if layer["kind"] == "linear_attention":
                n += 2 * m.nv * m.dk * m.dv * 4 + 2 * (m.taps - 1) * m.conv_dim * 2
            else:
                n += 2 * ctx * m.nkv * m.d * 2
        return n

    def weight_bytes(self) -> int:
        """Bytes of every matrix and vector one step reads (the embedding row is negligible)."""
        n = self.head.nbytes() + self.model.final_norm.numel() * 2
        for layer in self.layers:
            n += sum(layer[k].nbytes() for k in ("w_in", "w_gu", "w_down", "w_out"))
            if "moe" in layer:
                moe = layer["moe"]
                n += (moe.router.numel() + moe.shared_score.numel()) * 2
                per_expert = layer["experts_gu"][0].numel() + layer["experts_down"][0].numel()
                n += moe.top_k * per_expert * 2
        return n

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """One decode step from `token` [1]; returns logits [1, V], advances the position."""
        layers = self.layers
        x = F.embedding(token, self.model.embedding)
        delta, h = x, None
        for layer in layers:
            b = layer["block"]
            if h is None:
                y, h = rms_norm_triton(delta, b.input_norm, self.eps, None, True)
            else:
                y, h = rms_norm_triton(delta, b.input_norm, self.eps, h, True)
            gdn = layer["kind"] == "linear_attention"
            mix = self._gdn(layer, y) if gdn else self._attn(layer, y)
            y, h = rms_norm_triton(mix, b.post_norm, self.eps, h, True)
            gu = layer["w_gu"](y)
            g, u = gu.chunk(2, -1)
            delta = layer["w_down"](F.silu(g) * u)
            if "moe" in layer:
                delta = delta * torch.sigmoid(F.linear(y, layer["moe"].shared_score))
                delta = delta + self._experts(layer, y)
        y, _ = rms_norm_triton(delta, self.model.final_norm, self.eps, h, True)
        self.pos += 1
        return self.head(y)

    def _gdn(self, layer, y):
        m = layer["mixer"]
        kg, vg = m.nk * m.dk, m.nv * m.dv
        proj = layer["w_in"](y)[0]
        qkv, z, b, a = proj.split([2 * kg + vg, vg, m.nv, m.nv])
        window = torch.cat([layer["conv"], qkv[None]], 0)
        layer["conv"].copy_(window[1:])
        qkv = F.silu((window.float() * m.conv.float()).sum(0))
        q, k, v = qkv.split([kg, kg, vg])
        g = -m.a_log.exp() * F.softplus(a.float() + m.dt_bias)
        o = gdn_decode_triton(q.view(1, m.nk, m.dk), k.view(1, m.nk, m.dk),
                              v.view(1, m.nv, m.dv), g[None], torch.sigmoid(b.float())[None],
                              layer["ssm"])[0]
        o = o.to(torch.bfloat16).float()
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)
        o = (m.norm * o.to(torch.bfloat16) * F.silu(z.view(m.nv, m.dv).float())).to(torch.bfloat16)
        return layer["w_out"](o.view(1, vg))

    def _experts(self, layer, y):
        """Top-k routed SwiGLU experts, weights renormalised, all on the device."""
        moe = layer["moe"]
        probs = torch.softmax(F.linear(y, moe.router).float(), -1)
        weights, ids = torch.topk(probs[0], moe.top_k)
        weights = (weights / weights.sum()).to(y.dtype)
        gu = moe_gemv_triton(y, layer["experts_gu"], ids)
        g, u = gu.chunk(2, -1)
        down = moe_gemv_triton(F.silu(g) * u, layer["experts_down"], ids)
        return (down * weights[:, None]).float().sum(0, keepdim=True).to(y.dtype)

    def _attn(self, layer, y):
        m = layer["mixer"]
        qd, kvd = m.nq * m.d, m.nkv * m.d
        q, gate, k, v = layer["w_in"](y)[0].split([qd, qd, kvd, kvd])
        q, _ = rms_norm_triton(q.view(m.nq, m.d), m.q_norm, self.eps, None, True)
        k, _ = rms_norm_triton(k.view(m.nkv, m.d), m.k_norm, self.eps, None, True)
        q = rope_triton(q[None], self.pos, m.rope.rd, self.c["rope_parameters"]["rope_theta"])
        k = rope_triton(k[None], self.pos, m.rope.rd, self.c["rope_parameters"]["rope_theta"])
        slot = self.table[0, self.pos // PAGE].long() * PAGE + self.pos % PAGE
        layer["k"].view(-1, m.nkv, m.d).index_copy_(0, slot, k)
        layer["v"].view(-1, m.nkv, m.d).index_copy_(0, slot, v.view(1, m.nkv, m.d))
        lens = (self.pos + 1).int()
        a = paged_attention_triton(q, layer["k"], layer["v"], self.table, lens,
                                   max_seq_len=self.capacity)
        a = a.view(1, qd) * torch.sigmoid(gate[None])
        return layer["w_out"](a)

    def greedy_step(self):
        """Graph-friendly autoregressive step: feed back the argmax of the last logits."""
        self.token.copy_(argmax_triton(self.step(self.token)))
        return self.token
