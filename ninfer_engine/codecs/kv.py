"""KV storage dtypes: quantize K/V rows on write, dequantize whole pages on read.

A `KvCodec` owns the layout of one of K or V in the shared pool: a tuple of tensors whose first
dim is the token slot (`page * PAGE_TOKENS + offset`). `--kv-dtype` picks one codec for K and one
for V (`codecs_for`):

| dtype   | K                               | V                               |
|---------|---------------------------------|---------------------------------|
| `bf16`  | unquantized, activation dtype   | the same                        |
| `int8`  | int8, fp16 scale per 32 values  | the same                        |
| `fp8`   | e4m3, fp32 scale per head vector| the same                        |
| `nvfp4` | E2M1 + e4m3 scale per 16 values + fp32 scale per head vector | the same |
| `k8v4`  | int8 as `int8`                  | int4, fp16 scale per 16 values  |

`bf16` stores the model's activation dtype: bf16 on a GPU, fp32 on the CPU reference path.
The flat slot dim views as `[pages, page_tokens, ...]` (`KvStorage.page_view`), the layout of
`kernels.paged_attention`: the paged decode and prefill kernels read every format of this table
in place, K and V each in its own, and dequantise in registers (`kernels.paged_kv`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from .blockscale import E2M1

KV_DTYPES = ("bf16", "int8", "fp8", "nvfp4", "k8v4")
FP8_MAX = 448.0
FP4_MAX = 6.0
_TINY = 1e-12  # keeps an all-zero vector's scale finite
FP16_TINY = 2.0**-14  # smallest normal fp16: an fp16 scale never rounds to 0


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors as raw bytes: CPU index ops are not implemented for float8 dtypes."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


class KvCodec(ABC):
    """Storage format of one of K or V for `heads × dim` rows."""

    name: str

    @abstractmethod
    def allocate(self, slots: int, heads: int, dim: int, device: torch.device) -> tuple:
        """Uninitialised storage for `slots` token slots (reads never pass the written end, and
        untouched host pages cost no RAM)."""

    @abstractmethod
    def encode(self, x: torch.Tensor) -> tuple:
        """x [n, heads, dim] -> one tensor per storage component, each [n, ...]."""

    @abstractmethod
    def decode(self, parts: tuple, dtype: torch.dtype) -> torch.Tensor:
        """Components [n, ...] (as stored) -> [n, heads, dim] in `dtype`."""

    def write(self, storage: tuple, slots: torch.Tensor, x: torch.Tensor) -> None:
        """Quantize x [n, heads, dim] into the token slots `slots` [n]."""
        for stored, part in zip(storage, self.encode(x)):
            as_bits(stored).index_copy_(0, slots, as_bits(part))

    def read(self, storage: tuple, pages: torch.Tensor, page_tokens: int,
             dtype: torch.dtype) -> torch.Tensor:
        """Whole pages `pages` [p] -> [p * page_tokens, heads, dim]."""
        parts = tuple(as_bits(s).view(-1, page_tokens, *s.shape[1:]).index_select(0, pages)
                      .flatten(0, 1).view(s.dtype) for s in storage)
        return self.decode(parts, dtype)


class PlainCodec(KvCodec):
    """Unquantized rows in the given dtype."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.name = "bf16"

    def allocate(self, slots, heads, dim, device):
        return (torch.empty(slots, heads, dim, dtype=self.dtype, device=device),)

    def encode(self, x):
        return (x.to(self.dtype),)

    def decode(self, parts, dtype):
        return parts[0].to(dtype)


def _fp16_scale(groups: torch.Tensor, levels: float) -> torch.Tensor:
    """fp16 absmax scale per group (last dim reduced, kept); codes divide by this exact value."""
    return (groups.abs().amax(-1, keepdim=True) / levels).half().clamp_min(FP16_TINY)


class Int8Codec(KvCodec):
    """Symmetric int8 with one fp16 scale per `group` consecutive values of a head vector."""

    name = "int8"

    def __init__(self, group: int = 32) -> None:
        self.group = group

    def _group(self, dim: int) -> int:
        return self.group if dim % self.group == 0 else dim

    def allocate(self, slots, heads, dim, device):
        groups = dim // self._group(dim)
        return (torch.empty(slots, heads, dim, dtype=torch.int8, device=device),
                torch.empty(slots, heads, groups, dtype=torch.float16, device=device))

    def encode(self, x):
        n, h, d = x.shape
        g = x.float().view(n, h, -1, self._group(d))
        scale = _fp16_scale(g, 127.0)
        codes = (g / scale.float()).round_().clamp_(-127, 127).to(torch.int8)
        return codes.view(n, h, d), scale.squeeze(-1)

    def decode(self, parts, dtype):
        codes, scale = parts
        n, h, d = codes.shape
        g = codes.view(n, h, scale.shape[-1], -1).float() * scale.float().unsqueeze(-1)
        return g.view(n, h, d).to(dtype)


class Fp8Codec(KvCodec):
    """e4m3 codes with one fp32 scale per head vector (absmax maps to 448)."""

    name = "fp8"

    def allocate(self, slots, heads, dim, device):
        return (torch.empty(slots, heads, dim, dtype=torch.float8_e4m3fn, device=device),
                torch.empty(slots, heads, 1, dtype=torch.float32, device=device))

    def encode(self, x):
        xf = x.float()
        scale = xf.abs().amax(-1, keepdim=True).clamp_min(_TINY) / FP8_MAX
        return (xf / scale).to(torch.float8_e4m3fn), scale

    def decode(self, parts, dtype):
        codes, scale = parts
        return (codes.float() * scale).to(dtype)


# E2M1 magnitude midpoints and whether a tie rounds up (where the upper code is even: RNE)
_E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False),
               (3.5, True), (5.0, False))


def _e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """`blockscale.e2m1_codes` with the midpoints as scalars: no host table is copied
    to the device per write, which a CUDA graph could not capture (the decode step writes K/V)."""
    magnitude = values.abs()
    code = torch.zeros(values.shape, dtype=torch.uint8, device=values.device)
    for mid, tie_up in _E2M1_STEPS:
        code += magnitude >= mid if tie_up else magnitude > mid
    return code | torch.signbit(values).to(torch.uint8) << 3


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., d] (values < 16) -> [..., d/2] bytes, low nibble = even index."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 15, packed >> 4], -1).flatten(-2)


class Nvfp4Codec(KvCodec):
    """E2M1 codes, an e4m3 scale per 16 values and an fp32 scale per head vector.

    The vector scale maps the largest block scale onto e4m3's range, so block scales keep their
    precision whatever the vector's magnitude.
    """

    name = "nvfp4"
    BLOCK = 16

    def __init__(self) -> None:
        self._e2m1: dict[torch.device, torch.Tensor] = {}  # the table per device, copied once

    def allocate(self, slots, heads, dim, device):
        return (torch.empty(slots, heads, dim // 2, dtype=torch.uint8, device=device),
                torch.empty(slots, heads, dim // self.BLOCK, dtype=torch.float8_e4m3fn,
                            device=device),
                torch.empty(slots, heads, 1, dtype=torch.float32, device=device))

    def encode(self, x):
        n, h, d = x.shape
        blocks = x.float().view(n, h, -1, self.BLOCK)
        block_max = blocks.abs().amax(-1)  # [n, h, groups]
        vector = block_max.amax(-1, keepdim=True).clamp_min(_TINY) / (FP4_MAX * FP8_MAX)
        block_scale = (block_max / (FP4_MAX * vector)).to(torch.float8_e4m3fn)
        effective = (block_scale.float() * vector).clamp_min(_TINY).unsqueeze(-1)
        codes = _e2m1_codes((blocks / effective).view(n, h, d))
        return _pack_nibbles(codes), block_scale, vector

    def decode(self, parts, dtype):
        packed, block_scale, vector = parts
        n, h, _ = packed.shape
        table = self._e2m1.get(packed.device)
        if table is None:
            table = self._e2m1[packed.device] = E2M1.to(packed.device)
        values = table[_unpack_nibbles(packed).long()]
        scale = block_scale.float() * vector  # [n, h, groups]
        blocks = values.view(n, h, scale.shape[-1], self.BLOCK) * scale.unsqueeze(-1)
        return blocks.view(n, h, -1).to(dtype)


class Int4Codec(KvCodec):
    """Symmetric int4 (-7..7, stored offset by 8) with one fp16 scale per 16 values."""

    name = "int4"
    GROUP = 16

    def allocate(self, slots, heads, dim, device):
        return (torch.empty(slots, heads, dim // 2, dtype=torch.uint8, device=device),
                torch.empty(slots, heads, dim // self.GROUP, dtype=torch.float16, device=device))

    def encode(self, x):
        n, h, d = x.shape
        g = x.float().view(n, h, -1, self.GROUP)
        scale = _fp16_scale(g, 7.0)
        codes = ((g / scale.float()).round_().clamp_(-7, 7) + 8).to(torch.uint8)
        return _pack_nibbles(codes.view(n, h, d)), scale.squeeze(-1)

    def decode(self, parts, dtype):
        packed, scale = parts
        n, h, _ = packed.shape
        codes = _unpack_nibbles(packed).float() - 8
        g = codes.view(n, h, scale.shape[-1], self.GROUP) * scale.float().unsqueeze(-1)
        return g.view(n, h, -1).to(dtype)


def codecs_for(kv_dtype: str, activation_dtype: torch.dtype) -> tuple[KvCodec, KvCodec]:
    """The (K, V) codecs of a `--kv-dtype` value."""
    if kv_dtype == "bf16":
        return PlainCodec(activation_dtype), PlainCodec(activation_dtype)
    if kv_dtype == "int8":
        return Int8Codec(), Int8Codec()
    if kv_dtype == "fp8":
        return Fp8Codec(), Fp8Codec()
    if kv_dtype == "nvfp4":
        return Nvfp4Codec(), Nvfp4Codec()
    if kv_dtype == "k8v4":
        return Int8Codec(), Int4Codec()
    raise ValueError(f"unknown KV dtype {kv_dtype!r} (expected one of {', '.join(KV_DTYPES)})")
