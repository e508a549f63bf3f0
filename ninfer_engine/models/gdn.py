"""Gated DeltaNet (`linear_attention`) layer of Qwen3-Next / Qwen3.5 (model-math.md §2.1).

Torch reference path, device-agnostic, over a step's rows (each its own sequence); on CUDA in
bf16 a step's prompt chunks run through fused Triton kernels instead (`_prompt_rows`).
Per-sequence state is a `GDNState`:
the last K-1 *pre-conv* q|k|v rows (time-major `[K-1, C]`, activation dtype) and the fp32
recurrent state in HF layout `[nv, dk, dv]`, both updated in place (they may be views of a
slot of the engine's state pool: a step's prompt rows then address the pool by slot index,
vLLM's `state_indices`, with no stack of the rows' states and no copy back). A prefill may be
split into any number of chunks: each call continues the state exactly.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from ..host_copy import to_device
from ..kernels import gdn_chunk
from ..kernels._dispatch import use_triton
from ..kernels.gdn_fused import gdn_gated_norm
from ..kernels.gdn_prompt import gdn_prompt_prep, prompt_layout, slot_indices
from ..kernels.gdn_ref import chunked_gated_delta, l2_normalize, recurrent_gated_delta
from ..kernels.gdn_split import GatedNorm
from .layers import Linear
from .packed import prefill_fp8

# prompt rows walk their chunks with `kernels.gdn_split` (the state in order, the output and
# its gated norm in parallel) instead of `gdn_chunk`'s walk: a benchmark's switch
# (bench/prompt_burst.py --gdn-walk split); off, as the H200 found it no faster in the
# engine's prompt steps (bench/results/h200-gdn-split-walk.md)
SPLIT_WALK = False
# the chunk walk's precompute tiles in bf16 (`gdn_chunk`'s `tiles_dtype`): half the bytes the
# precompute writes and the walk reads; the H100's 8-layer 35B-A3B 7,640-token prompt step 23.2
# against 25.9 ms in fp32 (bench/results/h100-gdn-bf16-tiles.md); bench/prompt_burst.py
# --gdn-tiles fp32 switches it off
BF16_TILES = True

ParamSource = Callable[[str, tuple[int, ...]], torch.Tensor]


@dataclass
class GDNState:
    """Recurrent state of one GDN layer for one sequence."""

    conv: torch.Tensor  # [K-1, C] pre-conv q|k|v rows, oldest first
    ssm: torch.Tensor  # [nv, dk, dv] fp32
    # (conv, ssm) after each token of the last verify row, for `rollback`; None otherwise
    trail: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    # where conv and ssm are rows of a state pool (`kv.StatePool.slot`): its tensors of this
    # layer ({"conv": [S, K-1, C], "ssm": [S, nv, dk, dv]}) and the row; prompt steps then
    # address the rows by index in place
    pool: dict[str, torch.Tensor] | None = field(default=None, repr=False, compare=False)
    slot: int = -1

    def rollback(self, kept: int) -> None:
        """Take the state after the first `kept` tokens of the last verify row."""
        conv, ssm = self.trail[kept - 1]
        self.conv.copy_(conv)
        self.ssm.copy_(ssm)
        self.trail = None


class GatedDeltaNet:
    """One GDN mixer bound to `text/layers/i/gdn/*` logical parameters."""

    def __init__(self, config: dict, params: ParamSource, prefix: str,
                 matmul_dtype: torch.dtype | None = None):
        h = config["hidden_size"]
        self.nk, self.nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
        self.dk, self.dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
        self.taps = config["linear_conv_kernel_dim"]
        self.eps = config["rms_norm_eps"]
        kg, vg = self.nk * self.dk, self.nv * self.dv
        self.conv_dim = 2 * kg + vg
        p = prefix + "gdn/"
        self.w_q, self.w_k = params(p + "query", (kg, h)), params(p + "key", (kg, h))
        self.w_v, self.w_z = params(p + "value", (vg, h)), params(p + "z", (vg, h))
        self.w_a = params(p + "a_projection", (self.nv, h))
        self.w_b = params(p + "b_projection", (self.nv, h))
        self.w_out = params(p + "output", (h, vg))
        # `--prefill-activations`: e4m3 prompt rows through fp8-row projections
        self.fp8_act = prefill_fp8(config)
        # the projections as called, few-row (decode) calls through `matmul_dtype` copies
        self.projections = tuple(Linear(w, matmul_dtype, relayout=False, fp8_act=self.fp8_act)
                                 for w in (self.w_q, self.w_k, self.w_v, self.w_z, self.w_a,
                                           self.w_b, self.w_out))
        self.q, self.k, self.v, self.z, self.a, self.b, self.out = self.projections
        # q|k|v|z|b|a as one matrix, where the parameter source fused them (`bind_fused`)
        self.in_proj: Linear | None = None
        self.conv = params(p + "convolution", (self.taps, self.conv_dim))
        self.norm = params(p + "norm", (self.dv,))
        self.a_log = params(p + "a_log", (self.nv,)).float()
        self.dt_bias = params(p + "dt_bias", (self.nv,)).float()

    def bind_fused(self, matrix) -> None:
        """Multiply prompt chunks by `matrix`, this layer's q|k|v|z|b|a rows in one matrix
        (`models.fused.FusedParams`; its members are this layer's projections' views)."""
        self.in_proj = Linear(matrix, relayout=False, fp8_act=self.fp8_act)

    def state_layout(self, dtype: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """`GDNState`'s fields: name -> (shape, dtype), for a state pool's rows."""
        return {"conv": ((self.taps - 1, self.conv_dim), dtype),
                "ssm": ((self.nv, self.dk, self.dv), torch.float32)}

    def new_state(self, dtype: torch.dtype, device: torch.device) -> GDNState:
        """Zero history: the conv sees zeros before the first token, the recurrence starts at 0."""
        return GDNState(**{name: torch.zeros(shape, dtype=dt, device=device)
                           for name, (shape, dt) in self.state_layout(dtype).items()})

    def _conv(self, x: torch.Tensor, state: GDNState) -> torch.Tensor:
        """Causal depthwise conv + SiLU over [T, C], continuing (and updating) the conv state."""
        T = x.shape[0]
        full = torch.cat([state.conv, x], 0)
        state.conv.copy_(full[-(self.taps - 1) :])
        # K shifted multiply-adds: a depthwise conv1d call costs tens of ms on the CPU at T = 1
        w = self.conv.to(x.dtype)
        y = full[:T] * w[0]
        for tap in range(1, self.taps):
            y.add_(full[tap : tap + T] * w[tap])
        return F.silu(y)

    def _conv_rows(self, x: torch.Tensor, states: list[GDNState],
                   lengths: list[int]) -> torch.Tensor:
        """`_conv` of every row of [T, C] at once, row i continuing (and updating) `states[i]`:
        each row's segment is its K-1 state rows then its tokens, so a window never crosses
        into another row, and every output is the same sum of the same products as `_conv`'s."""
        if len(states) == 1:
            return self._conv(x, states[0])
        pieces, picks, ends, at, start = [], [], [], 0, 0
        for state, n in zip(states, lengths):
            pieces += [state.conv, x[start: start + n]]
            picks.append(torch.arange(at, at + n))  # window t of a segment ends at its token t
            at += self.taps - 1 + n
            ends.append(at)
            start += n
        full = torch.cat(pieces)
        torch._foreach_copy_([s.conv for s in states],
                             [full[end - (self.taps - 1): end] for end in ends])
        span = full.shape[0] - (self.taps - 1)
        w = self.conv.to(x.dtype)
        y = full[:span] * w[0]
        for tap in range(1, self.taps):
            y.add_(full[tap: tap + span] * w[tap])
        return F.silu(y.index_select(0, to_device(torch.cat(picks), x.device)))

    def __call__(self, x: torch.Tensor, states: list[GDNState], lengths: list[int],
                 verify: frozenset[int] = frozenset()) -> torch.Tensor:
        """x: [T, H] (normed input), rows of `lengths` tokens -> [T, H]; row i continues
        `states[i]` and updates it in place. The projections, the conv, the q/k norms and the
        gated norm run over all rows at once, the recurrence row by row; a step's prompt chunks
        on CUDA in bf16 take `_prompt_rows` (fused kernels, one walk for every row). A row in
        `verify` keeps its state after each of its tokens (`GDNState.trail`) for a partial
        acceptance."""
        T, dtype = x.shape[0], x.dtype
        if (use_triton(x) and dtype == torch.bfloat16 and not verify and min(lengths) > 1
                and states[0].conv.dtype == dtype):
            return self._prompt_rows(x, states, lengths)
        qkv = torch.cat([proj(x) for proj in (self.q, self.k, self.v)], -1)
        beta = torch.sigmoid(self.b(x)).float()
        g = -self.a_log.exp() * F.softplus(self.a(x).float() + self.dt_bias)
        z = self.z(x).reshape(T, self.nv, self.dv)
        starts = [0, *itertools.accumulate(lengths)]
        # a verify row's conv windows after each token: its state rows, then its inputs
        history = {i: torch.cat([states[i].conv, qkv[starts[i]: starts[i + 1]]], 0)
                   for i in verify}
        mixed = self._conv_rows(qkv, states, lengths)
        kg = self.nk * self.dk
        q = l2_normalize(mixed[:, :kg].float().reshape(T, self.nk, self.dk))
        k = l2_normalize(mixed[:, kg: 2 * kg].float().reshape(T, self.nk, self.dk))
        v = mixed[:, 2 * kg:].float().reshape(T, self.nv, self.dv)
        outs = [self._recurrence(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], state, dtype,
                                 history.get(i))
                for i, (state, a, b) in enumerate(zip(states, starts, starts[1:]))]
        o = torch.cat(outs) if len(outs) > 1 else outs[0]
        return self.out(self._gated_norm(o, z).reshape(T, -1))

    def _prompt_rows(self, x: torch.Tensor, states: list[GDNState],
                     lengths: list[int]) -> torch.Tensor:
        """`__call__` for a step's prompt chunks on CUDA in bf16: one projection GEMM (where
        fused), the conv, SiLU, q/k norms, g and beta in one launch (`kernels.gdn_prompt`),
        the chunk walk over every row, the gated norm in one launch."""
        C, vg, nv = self.conv_dim, self.nv * self.dv, self.nv
        if self.in_proj is not None:
            proj = self.in_proj(x)
            qkv, z, b, a = proj.split([C, vg, nv, nv], -1)
        else:
            qkv = torch.cat([proj(x) for proj in (self.q, self.k, self.v)], -1)
            z, b, a = self.z(x), self.b(x), self.a(x)
        layout = prompt_layout(tuple(lengths), x.device)
        # the split walk's output launch applies the gated norm itself; the chunk walk's
        # output goes to the gated norm in bf16, which rounds it there first anyway (as HF)
        walk = dict(tf32=True, split=SPLIT_WALK, norm=GatedNorm(
            z, self.norm, self.eps, layout.meta[: layout.padded]) if SPLIT_WALK else None,
            tiles_dtype=torch.bfloat16 if BF16_TILES and not SPLIT_WALK else torch.float32,
            out_dtype=torch.float32 if SPLIT_WALK else torch.bfloat16)
        pool = states[0].pool
        if pool is not None and all(s.pool is pool for s in states):
            # rows of one state pool (the engine's running slots): read and written in place
            # by slot index; only the new conv rows go back, in one scatter
            slots = slot_indices(tuple(s.slot for s in states), x.device)
            q, k, v, g, beta, conv = gdn_prompt_prep(
                qkv, b, a, pool["conv"], self.conv, self.a_log, self.dt_bias, self.nk, self.dk,
                layout, slots)
            o, _ = gdn_chunk.chunk_gated_delta_padded(
                q, k, v, g, beta, pool["ssm"], layout.first, slots=slots, **walk)
            pool["conv"].index_copy_(0, slots, conv)
        else:  # states held apart (tests, a bench's own): stacked, then copied back
            q, k, v, g, beta, conv = gdn_prompt_prep(
                qkv, b, a, torch.stack([s.conv for s in states]), self.conv, self.a_log,
                self.dt_bias, self.nk, self.dk, layout)
            o, ssm = gdn_chunk.chunk_gated_delta_padded(
                q, k, v, g, beta, torch.stack([s.ssm for s in states]), layout.first, **walk)
            torch._foreach_copy_([s.conv for s in states] + [s.ssm for s in states],
                                 [*conv.unbind(0), *ssm.unbind(0)])
        if not SPLIT_WALK:
            o = gdn_gated_norm(o, z, self.norm, self.eps, layout.at)
        return self.out(o)

    def _recurrence(self, q, k, v, g, beta, state: GDNState, dtype,
                    history: torch.Tensor | None) -> torch.Tensor:
        """One row's gated delta rule over its normed q, k [n, nk, dk] and v [n, nv, dv];
        [n, nv, dv] in `dtype`. `history` (a verify row's state rows, then its inputs): record
        the state after each token in `state.trail`."""
        keep = history is not None
        if q.shape[0] > 1 and use_triton(q) and dtype != torch.float32 and not keep:
            # precompute and chunk walk in two Triton launches with TF32 dots, reading each
            # q/k head for its value heads in place; the exact fp32 path keeps torch
            # (bench/results/h200-gdn-chunk.json)
            o, ssm = gdn_chunk.chunk_gated_delta(q, k, v, g, beta, state.ssm, tf32=True)
        else:
            # value head j reads q/k head j // r
            r = self.nv // self.nk
            q, k = q.repeat_interleave(r, 1), k.repeat_interleave(r, 1)
            if keep:
                trail: list[torch.Tensor] = []
                o, ssm = recurrent_gated_delta(q, k, v, g, beta, state.ssm, trail)
                state.trail = [(history[t + 1: t + self.taps], s) for t, s in enumerate(trail)]
            else:
                rule = recurrent_gated_delta if q.shape[0] == 1 else chunked_gated_delta
                o, ssm = rule(q, k, v, g, beta, state.ssm)
        state.ssm.copy_(ssm)  # in place: the state may be a view of a pool slot
        return o.to(dtype)

    def _gated_norm(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Plain RMSNorm per value head times SiLU(z), with HF's rounding points (§2.1 step 8)."""
        dtype = o.dtype
        of = o.float()
        of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.norm * of.to(dtype) * F.silu(z.float())).to(dtype)
