"""Routed experts on CUDA: the form each layer's experts are served in, and their stacks.

Serving form (`expert_form`, by stored format and `--cuda-weights`); the expert kernels read a
bf16 stack or an fp8 one (`kernels.moe_fused`/`moe_down` decode, `kernels.moe_dequant` for
prefill):

- fp8-row (`fp8_e4m3fn_row_bf16`): kept as stored, e4m3 codes + the bf16 row scales, under
  `auto` and `packed` (1 byte a weight: the 80B-A3B class takes ~82 GB instead of ~160).
- Q4/Q5 g64 (the official Qwen recipes' gate/up/down): `packed` repacks them exactly into e4m3
  codes + their fp16 group scales (`packed.repack_fp8_groups`: |q| ≤ 16 is exact in e4m3;
  1.03 bytes a weight); `auto` keeps today's bf16 expansion when the model with bf16 experts
  fits the device (`bf16_fits`), else repacks them too. bf16 is kept where it fits because
  prefill's grouped matmul reads a bf16 stack directly, where an fp8 stack is first decoded
  into a bf16 scratch per chunk (`models.moe`); decode reads half the bytes from fp8 (not
  measured yet against bf16 on the H200). Note the expansion rounds q · fp16-scale to bf16,
  the fp8 groups keep it exact.
- Q6/Q8/nvfp4 and plain formats: bf16 (Q6 and Q8 codes need more than e4m3's 4 significant
  bits, so no exact fp8 form; nvfp4 would need 16-column fp32 group scales: not built).
- `dequant` (and the CPU, and `--cuda-dtype fp32`): always the plain dtype.

`ExpertStack` is one layer's experts of one kind, `[E, 2I, H]` gate|up or `[E, H, I]` down, as
bf16 weights or e4m3 codes with `[E, N]` row or `[E, N, K // G]` group scales; `stack_experts`
fills one expert at a time (no second full-size copy) and hands each expert out as row views
(tensors, or one-block `PackedMatrix`es over the stack's planes, so the reference path's
`packed.linear` runs them unchanged).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..artifact.synth import parameter_shapes
from ..kernels.moe_dequant import dequantize_routed
from .packed import (DENSE, FP8_GROUPS, FP8_ROW, REPACK_FP8, PackedBlock, PackedMatrix,
                     load_packed, repack_fp8_groups)

# share of the free device memory the model with bf16 experts may take for `auto` to keep them
# bf16: the rest is for the KV pool, activations, CUDA graphs
BF16_SHARE = 0.85
FP8_FORMS = (FP8_ROW, FP8_GROUPS)


def is_routed_expert(name: str) -> bool:
    return name.startswith("text/layers/") and "/moe/experts/" in name


def expert_form(fmt: str, cols: int, mode: str, bf16_fits: bool) -> str:
    """The form (`FP8_ROW`, `FP8_GROUPS` or `DENSE`) a routed expert stored as `fmt` with `cols`
    columns is served in under `--cuda-weights mode`; see the module docstring."""
    if mode == "dequant":
        return DENSE
    if fmt == FP8_ROW:
        return FP8_ROW
    if fmt in REPACK_FP8 and cols % 128 == 0 and (mode == "packed" or not bf16_fits):
        return FP8_GROUPS  # whole 128-column groups: no padded columns to drop
    return DENSE


def bf16_model_bytes(config: dict) -> int:
    """Bytes of the model with every parameter in bf16 (an upper bound of any served form)."""
    return 2 * sum(_numel(s) for s in parameter_shapes(config).values())


def bf16_fits(config: dict, free_bytes: int | None) -> bool:
    """Whether the bf16-expert model fits `BF16_SHARE` of `free_bytes` (None: unknown, yes)."""
    return free_bytes is None or bf16_model_bytes(config) <= BF16_SHARE * free_bytes


def free_device_bytes(device) -> int | None:
    """Free memory of a CUDA device, None elsewhere."""
    device = torch.device(device)
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def serve_expert(w: PackedMatrix, mode: str, fits: bool) -> PackedMatrix | None:
    """`w` (one packed expert matrix) in its fp8 serving form, or None when it is served bf16."""
    fmts = {b.fmt for b in w.blocks}
    form = expert_form(fmts.pop(), w.shape[1], mode, fits) if len(fmts) == 1 else DENSE
    if form == DENSE:
        return None
    blocks = [repack_fp8_groups(b) if form == FP8_GROUPS else b for b in w.blocks]
    merged = PackedMatrix.cat([PackedMatrix([b]) for b in blocks])  # row parts of one object
    return merged if len(merged.blocks) == 1 else None


def load_expert(weights, name: str, shape: tuple[int, int], device, mode: str,
                fits: bool) -> PackedMatrix | None:
    """Routed expert `name` in its fp8 serving form, or None (the caller decodes it to bf16)."""
    if mode == "dequant":
        return None
    row_parts = getattr(weights, "row_parts", None)
    parts = row_parts(name, shape) if row_parts is not None else None
    if not parts or any(expert_form(fmt, shape[1], mode, fits) == DENSE for fmt, *_ in parts):
        return None  # decided on the stored formats: nothing is copied for a bf16 expert
    packed = load_packed(weights, name, shape, device)
    return None if packed is None else serve_expert(packed, mode, fits)


@dataclass(frozen=True, eq=False)
class ExpertStack:
    """`w [E, N, K]`: bf16 weights (scale None), or e4m3 codes with `scale` `[E, N]` (fp8-row)
    or `[E, N, K // G]` (fp8 groups)."""

    w: torch.Tensor
    scale: torch.Tensor | None = None

    @property
    def fmt(self) -> str:
        if self.scale is None:
            return DENSE
        return FP8_ROW if self.scale.dim() == 2 else FP8_GROUPS

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert: what a decode slot reads."""
        n = self.w[0].numel() * self.w.element_size()
        return n + (0 if self.scale is None else self.scale[0].numel() * self.scale.element_size())

    def member(self, e: int, r0: int = 0, r1: int | None = None) -> torch.Tensor | PackedMatrix:
        """Rows `[r0, r1)` of expert e as a view of the stack."""
        r1 = self.w.shape[1] if r1 is None else r1
        if self.scale is None:
            return self.w[e, r0:r1]
        planes = (self.w[e, r0:r1], self.scale[e, r0:r1])
        return PackedMatrix([PackedBlock(self.fmt, r1 - r0, self.w.shape[2], planes)])

    def weights_for(self, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The stack as `dtype` weights for a grouped matmul whose expert e has `counts[e]` rows:
        a bf16 stack as it is; an fp8 one decoded into a fresh `[E, N, K]` buffer (the caching
        allocator hands the same block back layer after layer), routed experts only."""
        if self.scale is None:
            return self.w
        out = torch.empty(self.w.shape, dtype=dtype, device=self.w.device)
        return dequantize_routed(self.w, self.scale, counts, out)


Getter = Callable[[int, str, tuple[int, int]], "torch.Tensor | PackedMatrix"]
SharedGetter = Callable[[str, tuple[int, int]], "torch.Tensor | PackedMatrix"]


def stack_experts(get: Getter, n: int, width: int, hidden: int,
                  shared: SharedGetter | None = None) -> tuple[ExpertStack, ExpertStack]:
    """(gate|up `[n, 2·width, hidden]`, down `[n, hidden, width]`) from `get(e, member, shape)`.

    A stack is fp8 when expert 0's members of it are all one fp8 form (same scale layout),
    else bf16 (packed members decoded); every expert must come in expert 0's form.
    `shared(member, shape)`, the layer's shared expert of the same width: stacked as expert n
    (stacks of n + 1) when each of its members is already in its stack's form (a bf16 tensor
    for a bf16 stack, the same fp8 layout for an fp8 one), so that the decode kernels run it as
    one more slot (`kernels.moe_route`, shared=True); otherwise left out."""
    gu_shape, down_shape = (width, hidden), (hidden, width)
    first = {m: get(0, m, gu_shape) for m in ("gate", "up")}
    first["down"] = get(0, "down", down_shape)
    extra = None
    if shared is not None:
        extra = {m: shared(m, gu_shape) for m in ("gate", "up")}
        extra["down"] = shared("down", down_shape)
        gu_form, down_form = _stack_form([first["gate"], first["up"]]), _stack_form([first["down"]])
        if not all(_in_form(extra[m], gu_form) for m in ("gate", "up")) or not _in_form(
                extra["down"], down_form):
            extra = None
    total = n + (extra is not None)
    gate_up = _empty([first["gate"], first["up"]], total, 2 * width, hidden)
    down = _empty([first["down"]], total, hidden, width)
    for e in range(total):
        parts = first if e == 0 else extra if e == n else {
            m: get(e, m, gu_shape) for m in ("gate", "up")}
        if 0 < e < n:
            parts["down"] = get(e, "down", down_shape)
        put_member(gate_up, e, 0, parts["gate"])
        put_member(gate_up, e, width, parts["up"])
        put_member(down, e, 0, parts["down"])
    return gate_up, down


def fp8_block(part) -> PackedBlock | None:
    """The block of an fp8 expert member (a one-block `PackedMatrix` of e4m3 codes and
    scales), None for anything else."""
    if isinstance(part, PackedMatrix) and len(part.blocks) == 1 and \
            part.blocks[0].fmt in FP8_FORMS:
        return part.blocks[0]
    return None


def _form(part) -> tuple | None:
    """(fmt, scale shape after the rows, scale dtype) of an fp8 member, None for bf16."""
    block = fp8_block(part)
    if block is None:
        return None
    scale = block.planes[1]
    return block.fmt, tuple(scale.shape[1:]), scale.dtype


def _stack_form(parts: list) -> tuple | None:
    """The fp8 form of a stack whose expert 0 has these members, None for a bf16 stack."""
    forms = {_form(p) for p in parts}
    return forms.pop() if len(forms) == 1 and None not in forms else None


def _in_form(part, form: tuple | None) -> bool:
    """Whether `part` goes into a stack of `form` as it is (no decoding, no requantizing)."""
    return isinstance(part, torch.Tensor) if form is None else _form(part) == form


def _empty(parts: list, n: int, rows: int, cols: int) -> ExpertStack:
    form = _stack_form(parts)
    device = parts[0].device
    if form is not None:
        _, tail, sdtype = form
        return ExpertStack(torch.empty(n, rows, cols, dtype=torch.float8_e4m3fn, device=device),
                           torch.empty(n, rows, *tail, dtype=sdtype, device=device))
    dtype = next((p.dtype for p in parts if isinstance(p, torch.Tensor)), torch.bfloat16)
    return ExpertStack(torch.empty(n, rows, cols, dtype=dtype, device=device))


def put_member(stack: ExpertStack, e: int, r0: int, part) -> None:
    """Rows `r0..` of expert e of `stack` from `part` (any device), in the stack's form."""
    rows = part.shape[0]
    if stack.scale is None:
        stack.w[e, r0 : r0 + rows] = (part.dequantize(stack.w.dtype)
                                      if isinstance(part, PackedMatrix) else part)
        return
    form = _form(part)
    if form is None or form[0] != stack.fmt or form[1] != tuple(stack.scale.shape[2:]):
        raise ValueError(f"routed expert {e} is served as {form or 'bf16'}, expert 0 as "
                         f"{stack.fmt}: one layer's experts must share a storage format")
    codes, scale = part.blocks[0].planes
    stack.w[e, r0 : r0 + rows] = codes
    stack.scale[e, r0 : r0 + rows] = scale


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def prefill_scratch_bytes(model) -> int:
    """Bytes a prefill chunk decodes fp8 routed experts into (`ExpertStack.weights_for`: the
    largest fp8 stack as bf16; gate|up is released before down is made), 0 without fp8
    stacks. Allocated on first use, after the KV pool: `check_prefill_scratch` makes sure it
    fits."""
    stacks = getattr(getattr(model, "params", None), "fused", {}).values()
    return max((2 * s.w.numel() for s in stacks if isinstance(s, ExpertStack) and
                s.scale is not None), default=0)


def check_prefill_scratch(model, free_bytes: int | None, margin: int = 1 << 30) -> None:
    """Raise a clear startup error where the fp8 experts' prefill scratch plus `margin` (the
    chunk's activations) does not fit in `free_bytes` (None: not a CUDA device, no check),
    instead of running out of memory on the first prompt."""
    need = prefill_scratch_bytes(model)
    if need and free_bytes is not None and free_bytes < need + margin:
        raise RuntimeError(
            f"prefill decodes the fp8 routed experts into a {need / 2**30:.1f} GiB bf16 buffer "
            f"(plus ~{margin / 2**30:.0f} GiB of activations), but only "
            f"{free_bytes / 2**30:.1f} GiB is free after the weights and the KV pool: lower "
            f"--kv-capacity")
