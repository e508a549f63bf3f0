"""Small shared building blocks: RMSNorm, rotary embedding, a layout-aware linear, and the
attention mask of queries that end a row."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from .int8_rows import Int8Rows
from .packed import PackedMatrix

# SDPA's backends but cuDNN's: torch 2.11 picks cuDNN first on the H200, which builds a plan
# for every new shape (38-50 ms a call); rows whose keys grow by one a step (an MTP or DFlash
# draft step) never repeat one
_NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v, **kwargs)` without the cuDNN backend: the
    models' eager attention (fallbacks and drafters; the engine's steps use the paged
    kernels)."""
    with sdpa_kernel(_NO_CUDNN):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Plain RMSNorm `x̂·w` over the last dimension."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def trailing_causal_mask(queries: int, keys: int, device: torch.device):
    """SDPA's `attn_mask` for `queries` rows that end a sequence of `keys` positions (query t
    sees keys 0 .. keys - queries + t). On CUDA torch's lower-right `CausalBias`, which runs
    flash attention with GQA and builds no mask: with a boolean mask and GQA, SDPA took cuDNN
    on the H200 (a new plan at every new length, 38-50 ms a call, torch 2.11) and, without
    cuDNN, falls back to the math backend's [heads, queries, keys] scores. Elsewhere the
    boolean mask."""
    if torch.device(device).type == "cuda":
        return causal_lower_right(queries, keys)
    start = keys - queries
    q_pos = torch.arange(start, keys, device=device)
    return torch.arange(keys, device=device)[None, :] <= q_pos[:, None]


NARROW_MAX_ROWS = 16  # a decode batch; longer inputs are prefill chunks


class Linear:
    """`y = x Wᵀ` with the weight stored in the layout that is faster on the device.

    On the CPU, single-row GEMV over a wide matrix (out ≥ in) ran 1.4-1.8x faster stored
    [in, out] than [out, in] (SmolLM2 shapes, AVX2, torch 2.13), while narrow ones (the MLP
    down projection) were faster as [out, in]; other devices keep [out, in].
    """

    def __init__(self, weight: torch.Tensor | PackedMatrix,
                 compute_dtype: torch.dtype | None = None, relayout: bool = True,
                 fp8_act: bool = False) -> None:
        """`fp8_act`: a packed fp8-row weight multiplies many-row inputs as e4m3 codes
        (`PackedMatrix.linear`)."""
        out_features, in_features = weight.shape
        self.k_major, self.weight, self.fp8_act = False, weight, fp8_act
        self.narrow: torch.Tensor | Int8Rows | None = None
        if isinstance(weight, PackedMatrix):  # quantized on CUDA: its own kernels
            return
        # relayout=False multiplies by `weight` itself: the hybrid family's modules keep it
        # (the CUDA decoder and the MoE stacks read it), so a relaid copy would double it
        if relayout:
            self.k_major = weight.device.type == "cpu" and out_features >= in_features
            self.weight = weight.t().contiguous() if self.k_major else weight.contiguous()
        # A narrower copy for few-row (decode) calls cuts the bytes a memory-bound GEMV
        # streams (bf16 on the CPU: 2.5x faster than fp32 for SmolLM2's matrices; int8 rows a
        # quarter of fp32, `Int8Rows`); many-row (prefill) calls keep the full-precision
        # weight, where AVX2 bf16 GEMM (and the int8 GEMV kernel) is slower.
        if compute_dtype == torch.int8:
            self.narrow = Int8Rows(weight)
        elif compute_dtype is not None and compute_dtype != weight.dtype:
            self.narrow = weight.to(compute_dtype).contiguous()

    @property
    def narrow_bytes(self) -> int:
        """Bytes of the decode copy (0 without one)."""
        return 0 if self.narrow is None else self.narrow.nbytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, PackedMatrix):
            return self.weight.linear(x, self.fp8_act)
        if self.narrow is not None and x.shape[0] <= NARROW_MAX_ROWS:
            if isinstance(self.narrow, Int8Rows):
                return self.narrow(x)
            return F.linear(x.to(self.narrow.dtype), self.narrow).to(x.dtype)
        return torch.matmul(x, self.weight) if self.k_major else F.linear(x, self.weight)


def warm_up_few_rows(linears, dtype: torch.dtype, device: torch.device) -> int:
    """Run each distinct packed weight of `linears` at one and two rows: the GEMV kernels'
    variants of an eager step's few rows (Triton tells row counts apart only by `== 1` and
    `% 16`), which the decode graphs' fused kernels do not run. A `--spec mtp` burst on the
    H100 and the H200 compiled the GDN's `a` and `b` projections' several-row variants in
    traffic (0.15-0.23 s each). Returns how many weights ran."""
    shapes = set()
    for linear in linears:
        weight = linear.weight
        if not isinstance(weight, PackedMatrix):  # dense: cuBLAS, nothing compiles
            continue
        # a fused group's member is a view: its planes' alignment is part of the variant
        key = (weight.shape, tuple((b.fmt, b.rows, *(p.data_ptr() % 16 for p in b.planes))
                                   for b in weight.blocks))
        if key in shapes:
            continue
        shapes.add(key)
        for rows in (1, 2):
            linear(torch.zeros(rows, weight.shape[1], dtype=dtype, device=device))
    return len(shapes)


class RotaryEmbedding:
    """NeoX split-half RoPE over the full head (`rotate_half`), cos/sin tables grown on demand."""

    def __init__(self, head_dim: int, theta: float, device: torch.device | str = "cpu") -> None:
        # fp32 like transformers and llama.cpp, so positions rotate identically to the references
        steps = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device)
        exponents = steps.float() / head_dim
        self.inv_freq = 1.0 / (theta**exponents)
        self.cos = torch.empty(0, head_dim // 2, device=device)
        self.sin = torch.empty(0, head_dim // 2, device=device)

    def _grow(self, positions: int) -> None:
        size = max(positions, 2 * self.cos.shape[0], 1024)
        t = torch.arange(size, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(t, self.inv_freq)
        self.cos = freqs.cos()
        self.sin = freqs.sin()

    def tables(
        self, positions: torch.Tensor, max_position: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin as [T, 1, D/2] for the given absolute positions."""
        if max_position >= self.cos.shape[0]:
            self._grow(max_position + 1)
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] rotated by split-half RoPE: (x1·c − x2·s, x2·c + x1·s), in fp32 tables,
    returned in x's dtype."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
