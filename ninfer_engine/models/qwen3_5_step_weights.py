"""The weights of the hybrid family's decode step (`qwen3_5_step.HybridStep`), and how it
reads an attention layer's paged K/V.

`HybridWeights` takes a `Qwen35Model` built over `models.fused.FusedParams` and keeps, per
layer, one matrix per decode GEMV group (GDN q|k|v|z|b|a, attention q|gate|k|v, MLP gate|up,
MoE router|shared score(|shared gate|up)) plus the stacked routed experts (bf16 or fp8
`models.experts.ExpertStack`s, holding the shared expert too where it is stored in their form):
the Triton FMA GEMV for one bf16 row, cuBLAS for several, or the fused dequant GEMVs of
`models.packed` where the weights are stored quantized (`FusedLinear`). `KvLayer`: one
attention layer's pages as the paged-attention kernel reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels.dequant_gemv import dequant_gemv, gated, kernel_tiles
from ..kernels.dequant_gemv_kernels import PLAIN
from .fused import FusedParams
from .packed import FP8_GROUPS, FP8_ROW, GEMV_MAX_ROWS, PackedMatrix, linear


class FusedLinear:
    """`x Wᵀ`: one row of a dense weight on CUDA through the Triton FMA GEMV (faster than
    cuBLAS at batch 1 on every H200 shape swept), up to `gemv_rows` through its dot path,
    more through cuBLAS, a `PackedMatrix` through its packed kernels.

    `gate`, `act`: the input is `x · act(gate)` (SwiGLU's `silu(g) · u`, the attention output
    gate), read by the GEMV itself or computed by one launch first (`dequant_gemv` picks);
    `acc`: an fp32 `[B, N]` buffer the product is added into and returned, where the GEMV is
    the dequant kernel (one bf16 row, or one fp8 block); elsewhere (cuBLAS, other packed
    formats) `acc` is left alone and the bf16 product returned (the RMSNorm after it takes
    either)."""

    def __init__(self, w: torch.Tensor | PackedMatrix, gemv_rows: int = 1,
                 fp8_act: bool = False):
        self.w, self.fp8_act = w, fp8_act  # `fp8_act`: `PackedMatrix.linear`'s, past the GEMVs
        # rows up to which a plain weight takes the Triton GEMV (`gemv_rows`) rather than cuBLAS;
        # an fp32 weight (`--cuda-dtype fp32`, the exact path) always takes cuBLAS
        self.gemv_rows = (gemv_rows if isinstance(w, torch.Tensor) and w.is_cuda
                          and w.dtype in PLAIN and kernel_tiles(w.shape[1], None) else 0)
        fp8 = (isinstance(w, PackedMatrix) and len(w.blocks) == 1
               and w.blocks[0].fmt in (FP8_ROW, FP8_GROUPS))
        self.planes = w.blocks[0].planes if fp8 else None

    def __call__(self, x, gate=None, act=None, acc=None):
        if 0 < x.shape[0] <= self.gemv_rows and x.dtype == self.w.dtype:
            return dequant_gemv(x, self.w, None, gate=gate, act=act, out=acc)
        if self.planes is not None and x.shape[0] <= GEMV_MAX_ROWS:
            return dequant_gemv(x, *self.planes, gate=gate, act=act, out=acc)
        return linear(x if gate is None else gated(x, gate, act), self.w, self.fp8_act)

    def nbytes(self):
        return self.w.nbytes


class HybridWeights:
    """The fused per-layer matrices of a `Qwen35Model` built over `FusedParams`."""

    def __init__(self, model, params: FusedParams):
        c = model.config
        self.c, self.model, self.eps = c, model, c["rms_norm_eps"]
        self.head = FusedLinear(model.head_projection.weight)  # a rank's rows at --tp 2
        self.layers = [layer_weights(c["layer_types"][i], block, params, f"text/layers/{i}/")
                       for i, block in enumerate(model.blocks)]

    def weight_bytes(self) -> int:
        """Bytes of every matrix and vector a batch-1 step reads (routed experts: top_k)."""
        n = self.head.nbytes() + self.model.final_norm.numel() * 2
        for layer in self.layers:
            n += sum(layer[k].nbytes() for k in ("w_in", "w_gu", "w_down", "w_out")
                     if k in layer)
            if "moe" in layer:
                # an expert's bytes as served: 2 a weight in bf16, 1 + scales in fp8
                per_expert = layer["experts_gu"].expert_bytes + layer["experts_down"].expert_bytes
                n += (layer["moe"].top_k + layer["shared_slot"]) * per_expert
        return n


def layer_weights(kind: str, block, params: FusedParams, prefix: str) -> dict:
    """One decoder layer's step matrices (`block`: its module, built over `params`, whose
    names start with `prefix`: `text/layers/i/`, or the MTP head's `mtp/layers/0/`)."""
    group = "gdn/" if kind == "linear_attention" else "attention/"
    m = block.mixer
    act = m.fp8_act  # `--prefill-activations`, for every many-row product of the layer
    layer = dict(kind=kind, block=block, mixer=m,
                 w_in=FusedLinear(params.fused[prefix + group], fp8_act=act),
                 w_out=FusedLinear(m.w_out if group == "gdn/" else m.w_o, fp8_act=act))
    if hasattr(block.ffn, "router"):
        moe = block.ffn
        shared_slot = params.shared_in_stack(prefix + "moe/")
        # one GEMV for router | shared score (| shared gate|up), `models.fused`
        layer.update(moe=moe, shared_slot=shared_slot, tier=moe.tier,
                     experts_gu=params.fused[prefix + "moe/experts/gate_up"],
                     experts_down=params.fused[prefix + "moe/experts/down"],
                     # a verify row's 4 rows of router|score (257 outputs) ran as cuBLAS's
                     # sm75 split-K GEMM, its reduce and a cast: ~13 µs a layer on the H200
                     # (h200-verify-step.md); the router's rows keep bf16 activations
                     w_gu=FusedLinear(params.fused[prefix + "moe/"], gemv_rows=GEMV_MAX_ROWS))
        if not shared_slot:
            layer["w_down"] = FusedLinear(moe.shared.down, fp8_act=act)
    else:
        layer.update(w_gu=FusedLinear(params.fused[prefix + "mlp/"], fp8_act=act),
                     w_down=FusedLinear(block.ffn.down, fp8_act=act))
    return layer


@dataclass
class KvLayer:
    """One attention layer's paged K/V as the kernel reads it, and how new rows are stored.

    `k`, `v`: bf16 rows `[pages, PAGE, kv_heads, D]`, or the tuple of a KV codec's component
    page views (`KvStorage.page_view`: any KV dtype); `k_scale`, `v_scale`: the int8 group
    scales of bare int8 codes, else None (see `kernels.paged_attention`). `rows`: where K and
    V are plain rows in the activation dtype, those rows `[slots, kv_heads, D]`: the q/k
    norm kernel then writes new K/V itself (`qk_norm_rope_triton(kv_rows=)`), not `write`."""

    k: torch.Tensor | tuple[torch.Tensor, ...]
    v: torch.Tensor | tuple[torch.Tensor, ...]
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    write: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]  # (slots, k, v)
    rows: tuple[torch.Tensor, torch.Tensor] | None = None
