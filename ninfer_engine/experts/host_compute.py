"""`HostCompute`: a tier's missed experts computed on the CPU from the host store, in fp32.

The base of `tier.LayerTier` (whose `host_gu`, `host_down` and `width` it reads): `cpu_sum`
gives the weighted sum of (row, expert) pairs over host rows, `cpu_expert` one expert over
rows (`MissCosts` times it). fp8-row stacks go through the compiled `kernels.cpu_experts`,
which reads the codes where they are (bf16 rows, as a GPU step's are, in its bf16 form: act
rounded to bf16 between the projections as the device kernels round it); any other form is
decoded exactly into fp32 (`_host_fp32`: e4m3 codes through a table times their row or group
scales, else dequantized) for torch. On the GPU the same experts run in the bf16 kernels, so
the two differ by the GPU side's bf16 rounding.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..kernels.cpu_experts import cpu_experts_unavailable, fp8_experts, takes
from ..models.packed import FP8_GROUPS, FP8_ROW, PackedMatrix


def _dense(member, dtype) -> torch.Tensor:
    return member.dequantize(dtype) if isinstance(member, PackedMatrix) else member.to(dtype)


# every e4m3 code's value: a table gather decodes codes ~2x faster than torch's fp8 cast on
# the host (a Flash-Next gate|up, 2 M codes: 17 vs 33 ms on one core of the test box)
_E4M3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def _host_fp32(member) -> torch.Tensor:
    """A host-store member as fp32, fp8 codes through `_E4M3` times their row or group scales
    (the values `fp8_dequant` gives, bit for bit); any other form dequantized."""
    block = member.blocks[0] if isinstance(member, PackedMatrix) and len(
        member.blocks) == 1 else None
    if block is None or block.fmt not in (FP8_ROW, FP8_GROUPS):
        return _dense(member, torch.float32)
    codes, scale = block.planes
    n, k = codes.shape
    w = torch.index_select(_E4M3, 0, codes.reshape(-1).view(torch.uint8).int()).view(n, k)
    if scale.dim() == 1:
        return w.mul_(scale.float()[:, None])
    w.view(n, scale.shape[1], -1).mul_(scale.float()[..., None])
    return w


class HostCompute:
    """See the module docstring; the subclass sets `host_gu`, `host_down` (`ExpertStack`s of
    the host store) and `width` (the experts' intermediate size I)."""

    def cpu_expert(self, x: torch.Tensor, e: int) -> torch.Tensor:
        """Expert e over host rows `x` in fp32 from the host store."""
        n = x.shape[0]
        return self.cpu_sum(x, list(range(n)), [e] * n, [1.0] * n)

    def cpu_sum(self, x: torch.Tensor, rows: list[int], experts: list[int],
                weights: list[float], threads: int = 0) -> torch.Tensor:
        """Σ weights[i] · expert experts[i] of host row x[rows[i]], per row of `x`, in fp32
        from the host store: fp8-row stacks by the compiled kernel (`kernels.cpu_experts`,
        the codes read where they are; bf16 rows as they come, its bf16 form), any other
        form through torch. `threads`: the compiled kernel's OpenMP team (0: its default)."""
        x = x.contiguous() if x.dtype == torch.bfloat16 else x.float().contiguous()
        out = torch.zeros(x.shape[0], self.host_down.w.shape[1])
        if self.compiled:
            return fp8_experts(x, rows, experts, weights, self.host_gu, self.host_down, out,
                               threads)
        for e in dict.fromkeys(experts):  # each expert decoded once, over all its rows
            at = [i for i, x_e in enumerate(experts) if x_e == e]
            index = torch.tensor([rows[i] for i in at])
            part = self._torch_expert(x[index].float(), e)
            out.index_add_(0, index, part * torch.tensor([weights[i] for i in at])[:, None])
        return out

    @functools.cached_property
    def compiled(self) -> bool:
        """Whether `cpu_sum` runs the compiled kernel (fp8-row stacks, a kernel built here)."""
        return takes(self.host_gu, self.host_down) and cpu_experts_unavailable() is None

    def _torch_expert(self, x: torch.Tensor, e: int) -> torch.Tensor:
        h = F.linear(x, _host_fp32(self.host_gu.member(e)))
        return F.linear(F.silu(h[:, : self.width]) * h[:, self.width:],
                        _host_fp32(self.host_down.member(e)))
