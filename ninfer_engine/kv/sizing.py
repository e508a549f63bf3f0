"""`--kv-capacity auto`: the shared KV pool sized from the device memory left after the weights.

Once the weights are resident (and the allocator's cache is emptied), the engine reads the
device's free memory and sizes the pool as

    budget = free − headroom − reserve
    pages  = ⌊budget / page_bytes⌋                  (whole 64-token pages, never rounded up)
    tokens = pages × page_tokens                    (failing startup if below --max-context)

- `headroom` is `--vram-headroom-mib` (default 1024 MiB): what the engine does not itemise —
  CUDA graphs, cuBLAS/Triton workspaces, the sampler, allocator fragmentation;
- `reserve` is what the engine allocates after the pool and can compute: the fp8 experts'
  prefill bf16 scratch (`models.experts.prefill_scratch_bytes`), one prefill chunk's
  activations (`prefill_activation_bytes`, at the engine's prefill chunk), the hybrid
  family's recurrent-state slots (--max-concurrency running + the prefix-checkpoint slots,
  each measured on one real slot; the pools are allocated after the KV pool), a drafter's
  per-sequence contexts (`--spec dflash`, `--spec mtp`: --max-concurrency of them at
  --max-context, `Speculator.context_bytes`), and `ALLOC_SLACK` per KV tensor (the caching
  allocator rounds each large block up to 2 MiB);
- `page_bytes` is K and V of every attention layer in the `--kv-dtype`'s storage, codes and
  scales, and the drafter rows a slot keeps (`--spec dflash` or `--spec mtp` with prefix
  reuse), as `KvStorage` lays it out (`kv.cache.kv_page_layout`).

`--elastic` pools grow by copying into bigger tensors, holding old and new together, so the
capacity is the largest one whose every growth fits the budget (`elastic_capacity_pages`).
There is no upper cap: like vLLM's `gpu_memory_utilization`, what is free becomes KV (prefix
checkpoints use the pages beyond the running requests').
"""
from __future__ import annotations

GIB = 2**30
MIB = 2**20
ALLOC_SLACK = 2 * MIB  # per KV tensor: the CUDA caching allocator's rounding of large blocks
# over `prefill_activation_bytes`' sum: what it does not itemise (norm upcasts, fragmentation)
ACTIVATION_SAFETY = 2


class KvSizingError(RuntimeError):
    """`--kv-capacity auto` cannot give --max-context: one line with the numbers (exit 1)."""


def elastic_capacity_pages(budget_pages: int, step_pages: int) -> int:
    """The largest `--elastic` capacity C whose growths all fit in `budget_pages`.

    The pool starts at min(step, C) pages and grows a step at a time (the last one partial, up
    to C); each growth holds the old and the new tensors together, so with k·step the largest
    whole-step size below C, the peak is k·step + C. Largest C with that ≤ budget:
    k = ⌊(budget − 1) / (2·step)⌋, C = min((k + 1)·step, budget − k·step).
    """
    if budget_pages <= 0:
        return 0
    k = (budget_pages - 1) // (2 * step_pages)
    return min((k + 1) * step_pages, budget_pages - k * step_pages)


def auto_kv_tokens(free_bytes: int, headroom_bytes: int, reserve_bytes: int,
                   bytes_per_token: int, page_tokens: int, max_context: int,
                   grow_tokens: int | None = None) -> int:
    """KV pool size in tokens (whole pages) for `--kv-capacity auto` (module docstring).

    `grow_tokens`: `--kv-grow` under `--elastic` (None: a fixed pool). Raises `KvSizingError`
    naming the flags and the numbers when the result would be below `max_context`.
    """
    page_bytes = bytes_per_token * page_tokens
    budget = free_bytes - headroom_bytes - reserve_bytes
    pages = max(budget, 0) // page_bytes
    if grow_tokens is not None:
        pages = elastic_capacity_pages(pages, -(-grow_tokens // page_tokens))
    need_pages = -(-max_context // page_tokens)
    if pages < need_pages:
        fits = free_bytes - reserve_bytes - need_pages * page_bytes  # the most headroom that fits
        hint = f" (at most {fits // MIB} fits)" if fits >= 0 and grow_tokens is None else ""
        raise KvSizingError(
            f"--kv-capacity auto: {free_bytes / GIB:.2f} GiB free after the weights, minus "
            f"--vram-headroom-mib {headroom_bytes // MIB} and {reserve_bytes / GIB:.2f} GiB for "
            f"prefill and state slots, leaves {pages * page_tokens} KV tokens at "
            f"{bytes_per_token} bytes each{' under --elastic growth' if grow_tokens else ''}, "
            f"fewer than --max-context {max_context} ({need_pages * page_bytes / GIB:.2f} GiB): "
            f"lower --max-context, --vram-headroom-mib{hint} or --prefill-chunk, or pick a "
            f"smaller --kv-dtype")
    return pages * page_tokens


def prefill_activation_bytes(text_config: dict, chunk_tokens: int, act_bytes: int) -> int:
    """A conservative bound on one prefill chunk's transient activations, from the config:

        chunk × ACTIVATION_SAFETY × (act_bytes·4·H + mixer + ffn)   bytes

    - 4·H: the residual stream, its norm, the mixer's and the FFN's outputs;
    - mixer, the widest layer kind present: attention — act_bytes·(q and its gate 2·nq·D, k and
      v 2·nkv·D, the attention output nq·D); Gated DeltaNet — act_bytes·(the conv's input and
      output 2·(2·nk·dk + nv·dv), z, the core output and its norm 3·nv·dv) plus the chunked
      kernel's fp32 buffers 4·(q k v upcast 2·nk·dk + nv·dv, the 64-token chunk tiles
      nv·(3·dk + dv + 64), the output nv·dv);
    - ffn, the widest present: dense SwiGLU act_bytes·3·I (gate|up, act); routed MoE
      act_bytes·(top_k·(3·I_moe + 4·H) (the rows sorted by expert, gate|up, act, the expert
      outputs, weighted, put back) + the shared expert 3·I_shared) + the router's fp32
      softmax 4·E.

    Mixer and FFN never hold their buffers together, so the sum already over-counts; the
    safety factor covers what is not itemised (norm upcasts, fragmentation). Logits are taken
    for a few rows only (`--vram-headroom-mib` covers them).
    """
    c = text_config
    h = c["hidden_size"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    d = c.get("head_dim") or h // heads
    mixer = act_bytes * (3 * heads * d + 2 * kv_heads * d)
    if "linear_attention" in (c.get("layer_types") or []):
        nk_dk = c["linear_num_key_heads"] * c["linear_key_head_dim"]
        nv, dk, dv = (c["linear_num_value_heads"], c["linear_key_head_dim"],
                      c["linear_value_head_dim"])
        conv = 2 * nk_dk + nv * dv
        fp32 = conv + nv * (3 * dk + dv + 64) + nv * dv
        mixer = max(mixer, act_bytes * (2 * conv + 3 * nv * dv) + 4 * fp32)
    moe = c.get("num_experts", 0) > 0
    ffn = 0
    if not moe or c.get("mlp_only_layers"):
        ffn = act_bytes * 3 * c["intermediate_size"]
    if moe:
        routed = c["num_experts_per_tok"] * (3 * c["moe_intermediate_size"] + 4 * h)
        shared = 3 * c.get("shared_expert_intermediate_size", 0)
        ffn = max(ffn, act_bytes * (routed + shared) + 4 * c["num_experts"])
    return chunk_tokens * ACTIVATION_SAFETY * (act_bytes * 4 * h + mixer + ffn)
