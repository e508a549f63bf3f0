"""Causal GQA attention over a flat token batch made of per-request segments.

A forward pass carries several requests at once: each `Segment` is a run of consecutive tokens
of one request (a prefill chunk, or one decode token) starting at cache position `start`.
The segment's cache is any `SequenceKv`: the paged pool view (`kv.PagedKvCache`) in the
engine, or the contiguous reference cache (`ContiguousKvCache`) for standalone use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


class SequenceKv(Protocol):
    """One sequence's K/V across layers, rows laid out [position, kv_heads, head_dim]."""

    def reserve(self, tokens: int) -> bool:
        """Room for `tokens` positions; False when it cannot grow."""

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, kv_heads, D] at positions start .. start+T-1."""

    def read(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V [end, kv_heads, D] of positions 0 .. end-1."""


@dataclass(frozen=True)
class Segment:
    cache: SequenceKv
    start: int  # cache position of the segment's first token
    length: int


@dataclass(frozen=True)
class _Plan:
    segment: Segment
    offset: int  # row of the segment's first token in the flat batch
    mask: torch.Tensor | None  # None: no mask (one query) or a square causal block
    is_causal: bool


def plan_segments(segments: list[Segment], device: torch.device) -> list[_Plan]:
    """Per-segment masks, built once per forward and shared by every layer."""
    plans, offset = [], 0
    for seg in segments:
        mask, is_causal = None, False
        if seg.length > 1 and seg.start == 0:
            is_causal = True
        elif seg.length > 1:
            # chunked prefill: query i sees cache positions ≤ start + i (bottom-right causal)
            q_pos = torch.arange(seg.start, seg.start + seg.length, device=device)
            k_pos = torch.arange(seg.start + seg.length, device=device)
            mask = k_pos[None, :] <= q_pos[:, None]
        if not seg.cache.reserve(seg.start + seg.length):
            raise RuntimeError("the KV cache cannot grow to hold this segment")
        plans.append(_Plan(seg, offset, mask, is_causal))
        offset += seg.length
    return plans


def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           plans: list[_Plan], scale: float) -> torch.Tensor:
    """Store k/v [T, kv_heads, D] in each segment's cache and attend; returns [T, heads·D]."""
    outputs = []
    for plan in plans:
        seg = plan.segment
        rows = slice(plan.offset, plan.offset + seg.length)
        end = seg.start + seg.length
        seg.cache.write(layer, seg.start, k[rows], v[rows])
        keys, values = seg.cache.read(layer, end)
        out = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1).unsqueeze(0),
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=plan.mask, is_causal=plan.is_causal, scale=scale, enable_gqa=True,
        )
        outputs.append(out[0].transpose(0, 1).reshape(seg.length, -1))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)
