"""The sparse MoE FFN of Qwen3-Next / Qwen3.5-MoE (model-math.md §2.4); its SwiGLU: `swiglu`.

Torch reference path over [T, H] activations.

Routed experts are dispatched by sorting: the T·k (token, slot) pairs are sorted by expert id
(one stable argsort), the rows are gathered into expert-contiguous order, each expert runs on
its contiguous slice, and the weighted outputs are put back into (token, slot) order and summed
over the k slots. Three ways to run the experts on the sorted rows:

* `swiglu.grouped_experts`: `torch._grouped_mm` over the stacked `[E, 2I, H]` / `[E, H, I]`
  expert tensors (two launches, no host sync). Used on CUDA in bf16 when the experts are row
  views of stacked tensors (as `models.fused.FusedParams` hands them out, found by
  `swiglu.stacked_experts`).
  An fp8 stack here (a rank-split layer's) is first decoded to bf16, its routed experts only.
* `kernels.moe_grouped` for fp8 stacks on CUDA: two Triton grouped GEMMs that read the codes
  in place (no bf16 copy of the routed experts), gather each sorted row's token themselves and
  store each slot's weighted output in (token, slot) order; SiLU fused into the first. With
  `--prefill-activations fp8` (the default; config key `FP8_ACTIVATIONS_KEY`) an fp8-row
  stack's prompt-sized steps (64- and 128-row tiles) round the tokens and the SwiGLU output to
  e4m3, one power-of-two scale a row (`kernels.act_quant`), and multiply fp8 × fp8 in the
  tensor cores, as vLLM's W8A8 fp8 MoE does: ~1.5–1.9× faster GEMMs at 4–8K tokens on the
  H200, a few % more rounding error in the experts' output. Decode rows keep bf16 activations.
* a per-expert loop over the slices, with one host sync per call (`bincount(...).tolist()`).

Where the shared expert is expert E of the fp8 stacks (`FusedParams.shared_in_stack`) a CUDA
step runs it through the grouped kernels too, as slot k of every token weighed by
sigmoid(score), with the router and score in one GEMM (`bind_fused`) and the routing in one
launch (`kernels.moe_route`, the decode step's).
"""

from __future__ import annotations

import logging

import torch

from ..kernels._dispatch import use_triton
from ..kernels.moe_grouped import (ROW_TILES, fp8_act_supported, grouped_supports,
                                   moe_grouped_down, moe_grouped_swiglu, tile_plan)
from ..kernels.moe_route import route_topk
from ..kernels.slot_sum import slot_sum
from .packed import linear, prefill_fp8
from .swiglu import ParamSource, SwiGLU, grouped_experts, stacked_experts

log = logging.getLogger(__name__)
_GROUPED_MM = {"ok": hasattr(torch, "_grouped_mm")}  # flips to False after the first failure


def _rows_to_multiple(matrix, multiple: int):
    """A plain matrix with zero rows appended up to a multiple of `multiple` rows (anything
    else as it is)."""
    if not isinstance(matrix, torch.Tensor) or matrix.shape[0] % multiple == 0:
        return matrix
    pad = matrix.new_zeros(-matrix.shape[0] % multiple, *matrix.shape[1:])
    return torch.cat([matrix, pad])


def _meta(w) -> bool:
    return isinstance(w, torch.Tensor) and w.is_meta


class SparseMoE:
    """Softmax-over-all-experts top-k routing, SwiGLU experts, sigmoid-gated shared expert.

    Bound to `{prefix}moe/{router, shared_score, experts/e/*, shared/*}`. No capacity limit.
    """

    def __init__(self, config: dict, params: ParamSource, prefix: str,
                 matmul_dtype: torch.dtype | None = None):
        h = config["hidden_size"]
        self.n_experts = config["num_experts"]
        self.top_k = config["num_experts_per_tok"]
        self.renormalise = config.get("norm_topk_prob", True)
        p = prefix + "moe/"
        self.router = params(p + "router", (self.n_experts, h))
        self.shared_score = params(p + "shared_score", (1, h))
        width = config["moe_intermediate_size"]
        # under tensor parallelism by expert id a rank holds experts [start, end) only
        self.local = tuple(config.get("tp_local_experts", (0, self.n_experts)))
        # `--prefill-activations`: e4m3 activations in the grouped GEMMs of fp8-row stacks
        self.fp8_activations = prefill_fp8(config)
        self.experts = [SwiGLU(params, f"{p}experts/{e}/", h, width, matmul_dtype)
                        for e in range(*self.local)]
        self.shared = SwiGLU(params, p + "shared/", h, config["shared_expert_intermediate_size"],
                             matmul_dtype, self.fp8_activations)
        # the router and the shared score stay exact: they pick and weigh the experts;
        # offloaded experts are meta placeholders (`ninfer_engine.experts`), not weights held
        self.projections = tuple(proj for m in (*self.experts, self.shared)
                                 for proj in m.projections if not _meta(proj.weight))
        self.stacked = stacked_experts(self.experts)
        # the stacks with the shared expert as expert E (`FusedParams.shared_in_stack`): prompt
        # steps run it as one more slot of the grouped kernels (weight sigmoid(score))
        self.stacked_shared = (stacked_experts([*self.experts, self.shared])
                               if self.local == (0, self.n_experts) else None)
        # router|score rows (`bind_fused`), zero rows after them up to a multiple of 8
        self.router_score: torch.Tensor | None = None
        self.tier = None  # `experts.LayerTier` where the routed experts are offloaded

    def bind_fused(self, matrix) -> None:
        """`matrix`: this layer's MoE group (`models.fused.FusedParams`), router rows then the
        shared score's: where the shared expert is in the stacks, prompt steps multiply by both
        at once and route in one launch (`kernels.moe_route`: E ≤ 512, k + 1 ≤ 16)."""
        if self.stacked_shared is not None and self.n_experts <= 512 and self.top_k < 16:
            # a prompt step's GEMM of E + 1 = 257 output columns (rows of 514 bytes, not
            # 16-byte aligned) took cuBLAS's sm75 kernel, 156 µs a layer at 7,632 tokens on
            # the H200; zero rows up to a multiple of 8 keep the rows aligned (a 1 MB copy)
            self.router_score = _rows_to_multiple(matrix[: self.n_experts + 1], 8)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k (weights [T, k] in x's dtype, expert ids [T, k]); softmax in fp32 over all E."""
        probs = torch.softmax(linear(x, self.router), -1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, -1)
        if self.renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(x.dtype), ids

    def use_grouped(self, x: torch.Tensor) -> bool:
        """Whether to run the experts with `grouped_experts` (CUDA, bf16, stacked experts)."""
        return (self.stacked is not None and _GROUPED_MM["ok"] and x.is_cuda
                and x.dtype == torch.bfloat16)

    def _fp8_grouped(self, x: torch.Tensor, stacks=None) -> bool:
        """Whether the routed experts run as `kernels.moe_grouped` (every expert of the layer
        in fp8 `stacks`, default `stacked`, on this device; not an offloaded or rank-split
        layer)."""
        stacks = stacks or self.stacked
        return (stacks is not None and use_triton(x) and x.dtype == torch.bfloat16
                and stacks[0].scale is not None and self.tier is None
                and self.local == (0, self.n_experts)
                and all(grouped_supports(s.scale, s.w) for s in stacks))

    def _experts_sorted(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The experts over expert-sorted rows `xs`, `counts[e]` rows for expert e (rows of
        another rank's experts give zeros: their rank adds them in the all-reduce)."""
        if self.tier is not None:
            return self.tier.experts_sorted(xs, counts)
        start, end = self.local
        if end - start < self.n_experts:  # this rank's experts' rows are one contiguous run
            first, n = (int(v) for v in (counts[:start].sum(), counts[start:end].sum()))
            out = torch.zeros_like(xs)
            if n:
                out[first: first + n] = self._local_experts(xs[first: first + n],
                                                            counts[start:end])
            return out
        return self._local_experts(xs, counts)

    def _local_experts(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """This rank's experts over their expert-sorted rows, `counts[e]` rows for expert e."""
        if self.use_grouped(xs):
            try:
                return grouped_experts(xs, *self.stacked,
                                       torch.cumsum(counts, 0, dtype=torch.int32), counts)
            except RuntimeError as err:  # unsupported GPU / shape: loop from now on
                _GROUPED_MM["ok"] = False
                log.warning("torch._grouped_mm failed (%s); per-expert MoE dispatch", err)
        outs, start = [], 0
        for e, n in enumerate(counts.tolist()):  # the one host sync
            if n:
                outs.append(self.experts[e](xs[start : start + n]))
                start += n
        return torch.cat(outs) if outs else torch.zeros_like(xs)

    def routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
               stacks=None, residual: torch.Tensor | None = None) -> torch.Tensor:
        """Σ_slots weight · expert(x) for routing `(weights, ids)` [T, k], by sorted dispatch
        (through the grouped kernels over `stacks`, default `stacked`, where they run), plus
        `residual` where given (the grouped path adds it in the slots' sum)."""
        flat = ids.reshape(-1)
        # ids of E experts, or of the E + 1 of stacks holding the shared expert too
        experts = self.n_experts if stacks is None else stacks[0].w.shape[0]
        # (token, slot) pairs in expert order; int16 keys: a 16-bit radix sort (2 passes on
        # CUDA, where int64 ids took 8)
        order = torch.argsort(flat.to(torch.int16) if experts < 2 ** 15 else flat, stable=True)
        stacks = stacks or self.stacked
        # not torch.bincount: on CUDA it reads the ids' min and max on the host (two syncs a
        # MoE layer of every eager step); integer atomics sum exactly
        counts = flat.new_zeros(experts).index_add_(0, flat, torch.ones_like(flat))
        if self._fp8_grouped(x, stacks):
            gate_up, down = stacks
            tiles = tile_plan(counts, flat.shape[0])
            fp8 = self.fp8_activations and all(fp8_act_supported(s.w, s.scale, tiles.bm)
                                               for s in stacks)
            act = moe_grouped_swiglu(x, order, ids.shape[1], tiles, gate_up.w, gate_up.scale,
                                     fp8_act=fp8)
            slots = moe_grouped_down(act, order, weights.reshape(-1), tiles, down.w, down.scale,
                                     fp8_act=fp8)
            return slot_sum(slots.view(*ids.shape, x.shape[-1]), residual)
        ys = self._experts_sorted(x[order // self.top_k], counts)
        ys = ys * weights.reshape(-1)[order, None]
        slots = torch.empty_like(ys)
        slots[order] = ys  # back to (token, slot) order
        out = slots.view(*ids.shape, x.shape[-1]).sum(1)  # deterministic, unlike a scatter-add
        return out if residual is None else residual + out

    def capturable(self) -> bool:
        """Whether `__call__` runs on CUDA without a host sync (a CUDA graph can hold it): the
        grouped kernels over fp8 stacks, or `torch._grouped_mm` over bf16 ones; not an
        offloaded layer or a rank's share (their dispatch reads counts on the host)."""
        if self.tier is not None or self.local != (0, self.n_experts) or self.stacked is None:
            return False
        probe = torch.empty(0, dtype=torch.bfloat16, device=self.stacked[0].w.device)
        if not probe.is_cuda:
            return False
        shared = self.stacked_shared if self.router_score is not None else None
        if shared is not None and self._fp8_grouped(probe, shared):
            return True
        return self._fp8_grouped(probe) or (self.use_grouped(probe)
                                            and self.stacked[0].scale is None)

    def warm_up(self, dtype: torch.dtype, device: torch.device) -> bool:
        """Run this layer once on random tokens at each row tile of the grouped kernels
        (`moe_grouped.ROW_TILES`), so every variant compiles before serving whatever prompt
        lengths the engine's warm-up requests make (a 4,096-token step took 128-row tiles,
        and the first 8x120 burst compiled the 64-row ones: 1.1 s). False where those kernels
        do not run (nothing to compile)."""
        probe = torch.empty(0, dtype=dtype, device=device)
        shared = self.stacked_shared if self.router_score is not None else None
        # the stacks `__call__` takes: with the shared expert where they run grouped, else the
        # routed experts alone
        stacks = shared if shared is not None and self._fp8_grouped(probe, shared) else None
        if not self._fp8_grouped(probe, stacks):
            return False
        experts = (stacks or self.stacked)[0].w.shape[0]
        gen = torch.Generator(device=device).manual_seed(0)
        for start, _ in ROW_TILES:
            tokens = max(1, -(-start * experts // self.top_k))
            self(torch.randn(tokens, self.router.shape[1], dtype=dtype, device=device,
                             generator=gen))
        return True

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output for tokens x [T, H], plus `residual` where given."""
        shared = self.stacked_shared
        if self.router_score is not None and self._fp8_grouped(x, shared):
            # one routing launch (`kernels.moe_route`, the decode step's): the shared expert
            # as slot k of every token, weighed by sigmoid(its score)
            logits = linear(x, self.router_score)[:, : self.n_experts + 1]
            weights, ids = route_topk(logits, self.top_k, self.renormalise, shared=True)
            return self.routed(x, weights, ids, shared, residual)
        weights, ids = self.route(x)
        out = self.routed(x, weights, ids)
        shared = torch.sigmoid(linear(x, self.shared_score)) * self.shared(x)
        return out + shared if residual is None else residual + (out + shared)
