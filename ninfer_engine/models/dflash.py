"""The DFlash / DFlash2 block-diffusion drafters (z-lab; model-math.md §3.3), a torch forward.

Followed from github.com/z-lab/dflash `dflash/model.py` (commit 44947fb): `DFlashDraftModel.
forward`, `Qwen3DFlashDecoderLayer.forward`, `Qwen3DFlashAttention.forward` and
`dflash_generate`:
* the target's tap features s_t (HF `hidden_states[l+1]` of `target_layer_ids`, concatenated)
  become `c_t = hidden_norm(fc(s_t))` (a plain RMSNorm after the projection);
* every layer projects c_t, without its input norm, into context keys and values: `k_norm(k_proj
  (c_t))` rotated at t, `v_proj(c_t)`. They are kept per sequence and extended only with
  committed target features (`dflash_generate` crops its draft cache back to `start`);
* a proposal is one forward over the noise block `[anchor, MASK×k]` (the target's embedding) at
  positions L..L+k, whose rows attend, non-causally, to the context and to the whole block; a
  sliding layer only to keys with |Δpos| < window (flash-attention's symmetric window);
* `norm` of the last layer's output, through the target's head: mask row i predicts the token
  at its own position L+i (no shift).
Blocks are dense Qwen3 blocks: plain RMSNorms `x̂·w`, per-head q/k norms, full-head split-half
RoPE, SwiGLU. The drafter has no embedding or head of its own.
DFlash2 (`models.dflash2`) adds a grouped dynamic convolution around each attention and MLP,
over the block's rows, and picks its drafts with a candidate selector's walk instead of the
argmax (a sampled row's walk samples and keeps its proposal distribution); its block
embeddings may be scaled (`input_embedding_scale`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from ..artifact.dflash_names import ARCHITECTURES, BACKENDS, backend as component_of, mismatch
from ..host_copy import to_device
from .dflash2 import CandidateSelector, GroupedConv, block_positions, conv_in, conv_out
from .layers import Linear, RotaryEmbedding, apply_rope, sdpa
from .mtp import MtpKv
from .swiglu import SwiGLU


class DFlashMissing(ValueError):
    """The artifact has no usable `dflash` component, or it does not fit the target."""


@dataclass(frozen=True)
class DFlashConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    theta: float
    windows: tuple[int | None, ...]  # per layer: the sliding window, None for a full layer
    taps: tuple[int, ...]  # target layers whose residual outputs condition the drafter
    mask_token: int
    block: int  # the anchor and masks a proposal was trained on (z-lab's `block_size`)
    top: str = "dflash"  # the component, "dflash2" for DFlash2 (its names' prefix)
    conv_taps: int = 0  # DFlash2's convolutions (0: none) over groups of `conv_group` channels
    conv_group: int = 16
    selector_rank: int = 0  # DFlash2's candidate selector (0: drafts by argmax)
    selector_top_k: int = 0
    embedding_scale: float = 1.0  # the block's embeddings times this (DFlash2)
    logit_scale: float = 1.0  # the selector's unary logits times this, then softcapped
    softcap: float | None = None

    @classmethod
    def from_component(cls, c: dict, target: dict, where: str) -> "DFlashConfig":
        """The component config `c` checked against the text config `target`; `DFlashMissing`
        with one line naming the first mismatch."""
        why = mismatch(c, target)
        if why is not None:
            raise DFlashMissing(f"the {component_of(c)} component of {where} {why}")
        dc, window = c["dflash_config"], c.get("sliding_window")
        kinds = c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]
        theta = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 1e6))
        return cls(c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                   c["head_dim"], c["intermediate_size"], c["rms_norm_eps"], float(theta),
                   tuple(window if k == "sliding_attention" else None for k in kinds),
                   tuple(dc["target_layer_ids"]), int(dc["mask_token_id"]),
                   int(c.get("block_size", 16)), component_of(c),
                   int(dc.get("conv_kernel_size", 0)), int(dc.get("conv_group_size", 16)),
                   int(dc.get("selector_rank", 0)), int(dc.get("selector_top_k", 0)),
                   float(dc.get("input_embedding_scale", 1.0)),
                   float(dc.get("output_multiplier", 1.0)),
                   float(dc["final_logit_softcapping"]) if dc.get("final_logit_softcapping")
                   else None)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm: normalised in fp32, cast back, times w."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class DFlashContext:
    """One sequence's context: per layer, the keys (normed, rotated) and values of the committed
    positions `first[n] .. end - 1`; a full layer keeps them all (`first[n]` = `start`), a
    sliding one only the last window's (the next block's queries, at `end` on, see no older)."""

    def __init__(self, model: "DFlashModel", start: int) -> None:
        c = model.config
        self.start = self.end = start
        self.first = [start] * len(model.layers)
        self.kv = [MtpKv(c.kv_heads, c.head_dim, model.dtype, model.device)
                   for _ in model.layers]

    def rewind(self, end: int) -> None:
        """Back to the positions before `end` (still held by every layer: a bench's repeats)."""
        for first, cache in zip(self.first, self.kv):
            cache.truncate(end - first)
        self.end = end

    def _trim(self, n: int, window: int) -> None:
        """Drop layer n's positions before `end - window` once they are a window's worth (one
        copy of a window per window appended)."""
        cache = self.kv[n]
        drop = cache.length - window
        if drop >= window:
            for t in (cache.k, cache.v):
                t[:, :window] = t[:, drop: cache.length].clone()
            cache.length = window
            self.first[n] += drop


class _Layer:
    def __init__(self, params, p: str, c: DFlashConfig, matmul_dtype):
        h, d = c.hidden, c.head_dim
        self.input_norm = params(p + "input_norm", (h,))
        self.post_norm = params(p + "post_attention_norm", (h,))
        self.q, self.k, self.v, self.o = (
            Linear(params(p + "attention/" + n, s), matmul_dtype, relayout=False)
            for n, s in (("query", (c.heads * d, h)), ("key", (c.kv_heads * d, h)),
                         ("value", (c.kv_heads * d, h)), ("output", (h, c.heads * d))))
        self.q_norm = params(p + "attention/query_norm", (d,))
        self.k_norm = params(p + "attention/key_norm", (d,))
        self.mlp = SwiGLU(params, p + "mlp/", h, c.ffn, matmul_dtype)
        self.attention_conv, self.mlp_conv = (
            GroupedConv(params, p + branch, h, c.conv_taps, c.conv_group, matmul_dtype)
            if c.conv_taps else None for branch in ("attention_conv/", "mlp_conv/"))


class DFlashModel:
    """The drafter's weights over `target` (a `Qwen35Model`: its embedding and head)."""

    def __init__(self, target, config: DFlashConfig, params,
                 matmul_dtype: torch.dtype | None = None) -> None:
        self.target, self.config = target, config
        top = config.top
        self.fc = Linear(params(f"{top}/input_projection",
                                (config.hidden, len(config.taps) * config.hidden)),
                         matmul_dtype, relayout=False)
        self.hidden_norm = params(f"{top}/hidden_norm", (config.hidden,))
        self.final_norm = params(f"{top}/final_norm", (config.hidden,))
        self.layers = [_Layer(params, f"{top}/layers/{n}/", config, matmul_dtype)
                       for n in range(len(config.windows))]
        self.selector = (CandidateSelector(params, config.hidden, target.vocab_size,
                                           config.selector_rank, config.selector_top_k,
                                           config.logit_scale, config.softcap)
                         if config.selector_rank else None)
        self.rope = RotaryEmbedding(config.head_dim, config.theta, target.device)

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def dtype(self) -> torch.dtype:
        return self.target.dtype

    def _kv(self, layer: _Layer, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        c = self.config
        k = _rms(layer.k(x).view(-1, c.kv_heads, c.head_dim), layer.k_norm, c.eps)
        return apply_rope(k, *rope), layer.v(x).view(-1, c.kv_heads, c.head_dim)

    def _rope(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin at host `positions` (one copy to the device; no read back of a maximum)."""
        return self.rope.tables(to_device(positions, self.device, torch.long), max(positions))

    def extend(self, ctx: DFlashContext, features: torch.Tensor) -> None:
        """Append the tap features [T, n·H] of the next T committed positions to `ctx`."""
        self.extend_rows([ctx], [self.condition(features)])

    @torch.no_grad()
    def condition(self, features: torch.Tensor) -> torch.Tensor:
        """c_t = hidden_norm(fc(s_t)) of tap features [T, n·H]: [T, H], what a context keeps
        of a position (and the KV pool's drafter rows hold: `step.dflash_drafter`)."""
        return _rms(self.fc(features.to(self.dtype)), self.hidden_norm, self.config.eps)

    @torch.no_grad()
    def extend_rows(self, contexts: list[DFlashContext], conds: list[torch.Tensor]) -> None:
        """Append the conditioning rows [T, H] (`condition`) of the next T committed positions
        to each context, all at once: the projections see every row's positions together
        (one launch each, not one a row)."""
        rows = [c.shape[0] for c in conds]
        cond = torch.cat(conds)
        rope = self._rope([p for ctx, n in zip(contexts, rows)
                           for p in range(ctx.end, ctx.end + n)])
        for ctx, n in zip(contexts, rows):
            ctx.end += n
        for i, (layer, window) in enumerate(zip(self.layers, self.config.windows)):
            k, v = self._kv(layer, cond, rope)
            for ctx, kr, vr in zip(contexts, k.split(rows), v.split(rows)):
                ctx.kv[i].extend(kr.transpose(0, 1), vr.transpose(0, 1))
                if window is not None:
                    ctx._trim(i, window)

    @torch.no_grad()
    def restore(self, cond: torch.Tensor) -> DFlashContext:
        """The context of positions 0 .. T-1 from their conditioning rows [T, H] (a reused
        prefix's, from the pool): a full layer projects them all, a sliding one only the last
        window's (the next block's queries, at T on, see no older)."""
        T, ctx = cond.shape[0], DFlashContext(self, 0)
        cos, sin = self._rope(list(range(T)))
        for i, (layer, window) in enumerate(zip(self.layers, self.config.windows)):
            first = 0 if window is None else max(T - window, 0)
            k, v = self._kv(layer, cond[first:], (cos[first:], sin[first:]))
            ctx.kv[i].extend(k.transpose(0, 1), v.transpose(0, 1))
            ctx.first[i] = first
        ctx.end = T
        return ctx

    @torch.no_grad()
    def propose(self, anchors: list[int], contexts: list[DFlashContext],
                ks: list[int]) -> list[torch.Tensor]:
        """For each row: the final-normed outputs [k, H] of its k mask rows, from the noise
        block [anchor, MASK×k] at positions `ctx.end ..` (the anchor's position)."""
        c, dev = self.config, self.device
        tokens, sizes = [], [1 + k for k in ks]
        for anchor, k in zip(anchors, ks):
            tokens += [anchor] + [c.mask_token] * k
        x = self.target.embed(to_device(tokens, dev, torch.long))
        if c.embedding_scale != 1.0:
            x = x * c.embedding_scale
        rope = self._rope([p for ctx, k in zip(contexts, ks)
                           for p in range(ctx.end, ctx.end + 1 + k)])
        at = block_positions(sizes, dev) if c.conv_taps else None  # DFlash2's convolutions
        for n, (layer, window) in enumerate(zip(self.layers, c.windows)):
            y, after = conv_in(layer.attention_conv, _rms(x, layer.input_norm, c.eps), at)
            q = apply_rope(_rms(layer.q(y).view(-1, c.heads, c.head_dim), layer.q_norm, c.eps),
                           *rope)
            k, v = self._kv(layer, y, rope)
            outs = []
            for ctx, qi, ki, vi in zip(contexts, q.split(sizes), k.split(sizes),
                                       v.split(sizes)):
                outs.append(self._attend(ctx, n, qi, ki, vi, window))
            x = x + conv_out(layer.attention_conv, layer.o(torch.cat(outs)), after, at)
            y, after = conv_in(layer.mlp_conv, _rms(x, layer.post_norm, c.eps), at)
            x = x + conv_out(layer.mlp_conv, layer.mlp(y), after, at)
        h = _rms(x, self.final_norm, c.eps)
        return [rows[1:] for rows in h.split(sizes)]

    @torch.no_grad()
    def drafts(self, hidden: list[torch.Tensor], anchors: list[int], vocab: int,
               draws: list | None = None) -> tuple[list[list[int]], list]:
        """Each row's drafts from `propose`'s outputs (its anchor token first in the walk of a
        DFlash2 selector; else each mask row's argmax), ids below `vocab`, never the mask; and
        each row's proposal distributions (`CandidateSelector.walk`: None for point-mass
        drafts). `draws[r]`: row r's (temperature, uniforms) for a sampled DFlash2 walk."""
        h = torch.cat(hidden)
        logits = self.logits(h)[:, :vocab]
        mask = self.config.mask_token
        if mask < vocab:  # (a tiny test vocabulary: the mask id is a tokenizer id)
            logits[:, mask] = float("-inf")
        sizes = [len(rows) for rows in hidden]
        flat, proposals = ((logits.argmax(-1).tolist(), [None] * len(sizes))
                           if self.selector is None
                           else self.selector.walk(logits, h, anchors, sizes, draws))
        starts = [0, *itertools.accumulate(sizes)]
        return [flat[a:b] for a, b in zip(starts, starts[1:])], proposals

    def _attend(self, ctx, n, q, k, v, window):
        """Non-causal attention of one row's block over its context and itself: [1+k, heads·D].
        The block's keys go into the context buffer past its end (one copy of the block, not of
        the context) and are cut off again: they are not context."""
        c = self.config
        cache = ctx.kv[n]
        keys, values = cache.extend(k.transpose(0, 1), v.transpose(0, 1))
        cache.truncate(cache.length - q.shape[0])
        mask = None
        if window is not None:  # symmetric: |Δpos| < window; the block at ctx.end ..
            qpos = torch.arange(ctx.end, ctx.end + q.shape[0], device=q.device)
            kpos = torch.arange(ctx.first[n], ctx.end + q.shape[0], device=q.device)
            mask = (qpos[:, None] - kpos[None, :]).abs() < window
        out = sdpa(q.transpose(0, 1), keys, values, attn_mask=mask,
                   scale=1.0 / math.sqrt(c.head_dim), enable_gqa=c.heads != c.kv_heads)
        return out.transpose(0, 1).reshape(q.shape[0], -1)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The target's head over drafter outputs: [T, H] -> [T, V]."""
        return self.target.logits(h)


def load_dflash(artifact, target, device: torch.device, dtype: torch.dtype,
                matmul_dtype: torch.dtype | None = None, backend: str = "dflash") -> DFlashModel:
    """The drafter of `artifact`'s `backend` ("dflash" or "dflash2") component over `target`;
    `DFlashMissing` naming what is absent or does not fit otherwise."""
    from .qwen3_5 import Qwen35Model

    where = getattr(artifact, "path", None) or getattr(artifact, "name", None) or "the artifact"
    if not isinstance(target, Qwen35Model):
        raise DFlashMissing(f"--spec {backend} needs a Qwen3.5-family model (its drafter reads "
                            "the target's layer features)")
    if target.ranks.parallel:
        raise DFlashMissing(f"--spec {backend} under --tp above 1 is not built yet")
    components = getattr(artifact, "components", None) or {}
    if backend not in components:
        raise DFlashMissing(f"--spec {backend} needs a {backend} component (the drafter's "
                            f"weights); {where} has none: convert a z-lab "
                            f"{'DFlash2' if backend == 'dflash2' else 'DFlash'} checkpoint into "
                            f"it, or add a random one with `ninfer synth --{backend}`")
    c = components[backend].get("config", {})
    arch = (c.get("architectures") or ["?"])[0]
    if BACKENDS.get(arch) != backend:
        raise DFlashMissing(f'the {backend} component of {where} is "{arch}", not '
                            f"{ARCHITECTURES[backend]}")
    config = DFlashConfig.from_component(c, target.config, str(where))

    def params(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if not artifact.has_parameter(name):
            raise DFlashMissing(f'the {backend} component of {where} lacks "{name}"')
        return artifact.parameter(name, shape).to(device, dtype)

    return DFlashModel(target, config, params, matmul_dtype)
