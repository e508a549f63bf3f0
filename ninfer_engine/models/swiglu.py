"""`SwiGLU`: the gated MLP of the dense layers and of each MoE expert, and the experts stacked.

A `SwiGLU` is `down(SiLU(gate·h) ⊙ up·h)` over [T, H] activations (model-math.md §2.3), its
projections bound by name from a `ParamSource`. A MoE layer's experts whose weights are row
views of stacked `[E, 2I, H]` gate|up and `[E, H, I]` down tensors (the layout
`models.fused.FusedParams` hands out, bf16 or fp8 plane by plane) are found as `ExpertStack`s
by `stacked_experts`; `grouped_experts` runs such stacks over expert-sorted rows with two
`torch._grouped_mm` launches (fp8 stacks decoded to the rows' dtype first, the routed experts
only): the CUDA bf16 path of `moe.SparseMoE`.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .experts import ExpertStack, fp8_block
from .layers import Linear

ParamSource = Callable[[str, tuple[int, ...]], torch.Tensor]


class SwiGLU:
    """`down(SiLU(gate·h) ⊙ up·h)` bound to `{prefix}{gate,up,down}`."""

    def __init__(self, params: ParamSource, prefix: str, hidden: int, width: int,
                 matmul_dtype: torch.dtype | None = None, fp8_act: bool = False):
        """`fp8_act`: e4m3 prompt rows through fp8-row projections (`PackedMatrix.linear`)."""
        self.fp8_act = fp8_act
        self.gate = params(prefix + "gate", (width, hidden))
        self.up = params(prefix + "up", (width, hidden))
        self.down = params(prefix + "down", (hidden, width))
        # the projections as called, few-row (decode) calls through `matmul_dtype` copies
        self.projections = tuple(Linear(w, matmul_dtype, relayout=False, fp8_act=fp8_act)
                                 for w in (self.gate, self.up, self.down))

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The MLP's output for tokens x [T, H], plus `residual` where given."""
        gate, up, down = self.projections
        out = down(F.silu(gate(x)) * up(x))
        return out if residual is None else residual + out


def _same_view(t: torch.Tensor, ref: torch.Tensor) -> bool:
    return (t.data_ptr() == ref.data_ptr() and t.shape == ref.shape
            and t.stride() == ref.stride())


def _planes(w) -> tuple[torch.Tensor, ...] | None:
    """A member's tensors: the bf16 matrix, or an fp8 one-block `PackedMatrix`'s codes and
    scales; None for anything else."""
    if isinstance(w, torch.Tensor):
        return (w,)
    block = fp8_block(w)
    return None if block is None else block.planes


def stacked_experts(experts: list[SwiGLU]) -> tuple[ExpertStack, ExpertStack] | None:
    """The stacked `(gate_up [E, 2I, H], down [E, H, I])` the experts are views of, else None.

    Expert e must be `gate = gate_up[e, :I]`, `up = gate_up[e, I:]`, `down = down[e]` (the
    layout of `FusedParams`), plane by plane for fp8 experts (codes, then row or group scales;
    each of the two stacks bf16 or fp8 on its own).
    The stacks are rebuilt over expert 0's storage and every expert checked against them, not
    found through `Tensor._base`, which views made under `torch.inference_mode` do not keep.
    """
    width, hidden, n = experts[0].gate.shape[0], experts[0].down.shape[0], len(experts)
    members = [[_planes(getattr(x, m)) for m in ("gate", "up", "down")] for x in experts]
    if any(p is None for ps in members for p in ps):
        return None

    def stack(view, rows):  # [n, rows, ...] from expert 0's view, if it fits the storage
        if not view.is_contiguous():
            return None
        inner = view[0].numel() if view.dim() > 1 else 1
        size = view.untyped_storage().nbytes() // view.element_size()
        if view.storage_offset() + n * rows * inner > size:
            return None
        return view.as_strided((n, rows, *view.shape[1:]), (rows * inner, *view.stride()))

    gate0, _, down0 = members[0]  # gate|up and down may differ (Q4 gate|up, Q6 down)
    gate_up = [stack(p, 2 * width) for p in gate0]
    down = [stack(p, hidden) for p in down0]
    if any(s is None for s in (*gate_up, *down)):
        return None
    for (gate, up, dn) in members:
        if len(gate) != len(gate_up) or len(up) != len(gate_up) or len(dn) != len(down):
            return None
    for e, (gate, up, dn) in enumerate(members):
        if not (all(_same_view(p, s[e, :width]) for p, s in zip(gate, gate_up))
                and all(_same_view(p, s[e, width:]) for p, s in zip(up, gate_up))
                and all(_same_view(p, s[e]) for p, s in zip(dn, down))):
            return None
    return ExpertStack(*gate_up), ExpertStack(*down)


def grouped_experts(xs: torch.Tensor, gate_up: ExpertStack, down: ExpertStack,
                    offs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """SwiGLU experts over expert-sorted rows `xs [S, H]` with two `torch._grouped_mm` launches.

    Rows `offs[e-1]:offs[e]` (int32 cumulative counts, `offs[-1] == S`; `counts[e]` rows) go
    through expert e. fp8 stacks are decoded to xs's dtype first, the routed experts only
    (`ExpertStack.weights_for`; unrouted experts have no rows, so their garbage is not read);
    the decoded gate|up buffer is released before the down one is made.
    """
    w = gate_up.weights_for(counts, xs.dtype)
    gu = torch._grouped_mm(xs, w.transpose(-2, -1), offs=offs)  # [S, 2I]
    del w
    gate, up = gu.chunk(2, -1)
    act = F.silu(gate) * up
    del gu, gate, up
    return torch._grouped_mm(act, down.weights_for(counts, xs.dtype).transpose(-2, -1),
                             offs=offs)
