"""The Qwen3.5 vision tower (model-math.md §6), torch, over the `vision/...` logical parameters.

`VisionEncoder(config, params).encode(patches, grids)` takes the preprocessor's patch rows
(merge-block-major, `3·T·P·P` values each, `preprocess.py`) of one or more images or videos and
their patch grids `(t, h, w)`, and returns one row per merged token (`t·h·w / merge²`), in the
text model's width: the embeddings that replace the prompt's placeholder tokens.

Per block: LayerNorm → qkv (bias) → 2-D rotary (row frequencies, then column frequencies,
duplicated, rotate-half over the whole head) → non-causal attention within each frame → proj;
LayerNorm → fc1 → GELU-tanh → fc2. Merger: LayerNorm → 4 rows to one → fc1 → GELU (erf) → fc2.
Runs on the device and in the dtype of its parameters (fp32 on the CPU, bf16 on CUDA); rotary
and softmax in fp32, as transformers does.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .prompt import merged_tokens

ParamSource = Callable[[str, tuple[int, ...]], torch.Tensor]
Grid = tuple[int, int, int]

LN_EPS = 1e-6
ROPE_THETA = 10000.0  # the tower's axial rotary base (HF `Qwen3_5VisionConfig` default)


class _Block:
    def __init__(self, params: ParamSource, b: int, h: int, inner: int):
        p = f"vision/layers/{b}/"
        self.norm1 = (params(p + "norm1_weight", (h,)), params(p + "norm1_bias", (h,)))
        self.norm2 = (params(p + "norm2_weight", (h,)), params(p + "norm2_bias", (h,)))
        # q, k, v as one [3h, h] projection (one GEMM)
        self.qkv = torch.cat([params(p + f"attention/{r}", (h, h))
                              for r in ("query", "key", "value")])
        self.qkv_bias = torch.cat([params(p + f"attention/{r}_bias", (h,))
                                   for r in ("query", "key", "value")])
        self.out = (params(p + "attention/output", (h, h)),
                    params(p + "attention/output_bias", (h,)))
        self.fc1 = (params(p + "mlp/fc1", (inner, h)), params(p + "mlp/fc1_bias", (inner,)))
        self.fc2 = (params(p + "mlp/fc2", (h, inner)), params(p + "mlp/fc2_bias", (h,)))


class VisionEncoder:
    """The tower of one artifact's `vision` component (config: ninfer-format.md §3.1)."""

    def __init__(self, config: dict, params: ParamSource):
        self.config = config
        h, self.heads = config["hidden_size"], config["num_heads"]
        self.hidden, self.head_dim = h, h // self.heads
        self.merge = config["spatial_merge_size"]
        t, p = config["temporal_patch_size"], config["patch_size"]
        self.patch_values = 3 * t * p * p
        self.patch = (params("vision/patch_embedding", (h, self.patch_values)),
                      params("vision/patch_embedding_bias", (h,)))
        positions = config["num_position_embeddings"]
        self.side = int(positions ** 0.5)
        self.position_table = params("vision/position_embedding", (positions, h))
        self.blocks = [_Block(params, b, h, config["intermediate_size"])
                       for b in range(config["depth"])]
        merged, out = h * self.merge ** 2, config["out_hidden_size"]
        m = "vision/merger/"
        self.merger_norm = (params(m + "norm_weight", (h,)), params(m + "norm_bias", (h,)))
        self.merger_fc1 = (params(m + "fc1", (merged, merged)), params(m + "fc1_bias", (merged,)))
        self.merger_fc2 = (params(m + "fc2", (out, merged)), params(m + "fc2_bias", (out,)))
        quarter = self.head_dim // 4  # row and column frequencies: a quarter head each
        self.inv_freq = 1.0 / ROPE_THETA ** (
            torch.arange(quarter, dtype=torch.float32, device=self.device) / quarter)

    @property
    def device(self) -> torch.device:
        return self.patch[0].device

    @property
    def dtype(self) -> torch.dtype:
        return self.patch[0].dtype

    def merged_tokens(self, grid: Grid) -> int:
        """Output rows (prompt placeholder tokens) of one grid."""
        return merged_tokens(grid, self.merge)

    @torch.no_grad()
    def encode(self, patches: torch.Tensor, grids: list[Grid]) -> torch.Tensor:
        """patches [Σ t·h·w, 3·T·P·P] of `grids`, in order -> [Σ t·h·w / merge², out]."""
        if patches.shape != (sum(t * h * w for t, h, w in grids), self.patch_values):
            raise ValueError(f"patches of shape {tuple(patches.shape)} do not match the grids "
                             f"{grids} ({self.patch_values} values a patch)")
        x = F.linear(patches.to(self.device, self.dtype), *self.patch)
        x = x + torch.cat([self._positions(g) for g in grids]).to(x.dtype)
        cos, sin = self._rotary(grids)
        for block in self.blocks:
            x = self._block(block, x, grids, cos, sin)
        x = F.layer_norm(x, (self.hidden,), *self.merger_norm, LN_EPS)
        x = x.reshape(-1, self.hidden * self.merge ** 2)
        return F.linear(F.gelu(F.linear(x, *self.merger_fc1)), *self.merger_fc2)

    def _block_order(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column of each patch of an h×w frame, merge-block-major."""
        m = self.merge
        rows = torch.arange(h, device=self.device)[:, None].expand(h, w)
        cols = torch.arange(w, device=self.device)[None, :].expand(h, w)

        def order(a):
            return a.reshape(h // m, m, w // m, m).transpose(1, 2).flatten()
        return order(rows), order(cols)

    def _positions(self, grid: Grid) -> torch.Tensor:
        """The learned side×side table resampled to h×w (bilinear, align_corners), each frame."""
        t, h, w = grid
        table = self.position_table.float().T.reshape(1, self.hidden, self.side, self.side)
        frame = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0]
        rows, cols = self._block_order(h, w)
        return frame[:, rows, cols].T.repeat(t, 1)

    def _rotary(self, grids: list[Grid]) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos, sin [N, head_dim]: row angles then column angles, the pair duplicated."""
        angles = []
        for t, h, w in grids:
            rows, cols = self._block_order(h, w)
            a = torch.cat([rows[:, None] * self.inv_freq, cols[:, None] * self.inv_freq], -1)
            angles.append(a.repeat(t, 1))
        a = torch.cat(angles)
        a = torch.cat([a, a], -1)
        return a.cos(), a.sin()

    def _block(self, b: _Block, x, grids, cos, sin):
        n = x.shape[0]
        y = F.layer_norm(x, (self.hidden,), *b.norm1, LN_EPS)
        q, k, v = F.linear(y, b.qkv, b.qkv_bias).reshape(n, 3, self.heads, self.head_dim).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        outs, start = [], 0
        for t, h, w in grids:  # each frame attends within itself: frames are a batch
            span = slice(start, start + t * h * w)
            start += t * h * w

            def frames(z):
                return z[span].reshape(t, h * w, self.heads, self.head_dim).transpose(1, 2)
            a = F.scaled_dot_product_attention(frames(q), frames(k), frames(v))
            outs.append(a.transpose(1, 2).reshape(t * h * w, self.hidden))
        x = x + F.linear(torch.cat(outs), *b.out)
        y = F.layer_norm(x, (self.hidden,), *b.norm2, LN_EPS)
        return x + F.linear(F.gelu(F.linear(y, *b.fc1), approximate="tanh"), *b.fc2)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary over the whole head, in fp32 (x [N, heads, D], cos/sin [N, D])."""
    xf, half = x.float(), x.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], -1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)
