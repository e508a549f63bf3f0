"""The engine's memory at load: the shared KV pool (and, under `--elastic`, its pages lent to
the expert-slot cache), state slots and the prefix tree (`build_memory`), and the pool's size
under `--kv-capacity auto` (`auto_kv_capacity`, the arithmetic in `kv.sizing`), read from the
device once the weights are resident."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from .config import PAGE_TOKENS, EngineConfig
from .kv import ElasticPagePool, KvStorage, PagePool, SequenceMemory, codecs_for, kv_page_layout
from .kv.host_tier import HostTier, check_host_ram
from .kv.memory import SNAPSHOT_TOKENS
from .kv.snapshot_policy import SnapshotLimits
from .kv.sizing import (ALLOC_SLACK, GIB, MIB, KvSizingError, auto_kv_tokens,
                        prefill_activation_bytes)
from .models.experts import free_device_bytes, prefill_scratch_bytes

log = logging.getLogger("ninfer.engine")


def auto_kv_capacity(config: EngineConfig, model: Any, text_config: dict, device: torch.device,
                     prefill_chunk: int, speculator: Any = None, page_rows: int = 0,
                     drafter_layers: int = 0) -> tuple[EngineConfig, int | None]:
    """`--kv-capacity auto`: `config` with `kv_capacity` sized from the device memory free now
    that the weights are resident (`kv.sizing`), and the prefill-activation estimate (for
    chunks of `prefill_chunk` tokens) it kept free: the margin `check_prefill_scratch` then
    checks against. A `speculator`'s per-sequence drafter contexts are kept free too, and
    `page_rows` (the drafter rows a KV slot holds) and `drafter_layers` (the drafter's own
    attention layers in the pool, `build_memory`) count in a page's bytes. Not auto:
    (config, None)."""
    if not config.kv_capacity_auto:
        return config, None
    state_slots = config.max_concurrency + (
        0 if config.no_prefix_reuse else _checkpoint_slots(config))
    if config.spec:  # the graph step keeps each verify row's state after every draft
        state_slots += config.max_concurrency * (config.draft_tokens or 0)
    states = recurrent_state_bytes(model) * state_slots
    drafters = config.max_concurrency * (
        speculator.context_bytes(config.max_context) if speculator is not None else 0)
    if device.type == "cuda":  # loading's transient blocks go back: mem_get_info sees them
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    free = free_device_bytes(device)
    if free is None:
        raise KvSizingError("--kv-capacity auto needs a CUDA device; this machine has none")
    layers, heads, dim = model.kv_layout()
    page_bytes, tensors = kv_page_layout(layers + drafter_layers, heads, dim,
                                         codecs_for(config.kv_dtype, model.dtype), PAGE_TOKENS,
                                         page_rows * model.dtype.itemsize)
    activations = prefill_activation_bytes(text_config, prefill_chunk, model.dtype.itemsize)
    scratch = prefill_scratch_bytes(model)
    reserve = scratch + activations + states + drafters + tensors * ALLOC_SLACK
    headroom = config.vram_headroom_mib * MIB
    tokens = auto_kv_tokens(free, headroom, reserve, page_bytes // PAGE_TOKENS, PAGE_TOKENS,
                            config.max_context, config.kv_grow if config.elastic else None)
    log.info("--kv-capacity auto: %d tokens (%d pages, %.2f GiB of %s KV%s) from %.2f GiB free "
             "after the weights, minus --vram-headroom-mib %d and %.2f GiB reserved (prefill "
             "scratch %.2f, prefill activations %.2f, state slots %.2f, drafter contexts %.2f)",
             tokens, tokens // PAGE_TOKENS, tokens // PAGE_TOKENS * page_bytes / GIB,
             config.kv_dtype, ", --elastic cap" if config.elastic else "", free / GIB,
             config.vram_headroom_mib, reserve / GIB, scratch / GIB, activations / GIB,
             states / GIB, drafters / GIB)
    return dataclasses.replace(config, kv_capacity=tokens), activations


def recurrent_state_bytes(model: Any) -> int:
    """Bytes of one recurrent-state slot (a state slot's tensors), 0 without recurrent layers:
    one slot is built on the device and measured, so its layout is not restated here."""
    new_state = getattr(model, "new_recurrent_state", None)
    if new_state is None:
        return 0
    return sum(value.nbytes for layer in new_state() for value in vars(layer).values()
               if isinstance(value, torch.Tensor))


def _checkpoint_slots(config: EngineConfig) -> int:
    """Prefix-tree snapshot slots: `--device-state-slots`, else two per admitted request and at
    least 4: a conversation keeps a prompt-end and an answer-end snapshot (with one slot the
    answer's replaced the prompt's, so the same prompt again found nothing to restore)."""
    return max(4, 2 * config.max_concurrency) if config.device_state_slots is None else (
        config.device_state_slots)


def build_memory(config: EngineConfig, model: Any, prefill_chunk: int = SNAPSHOT_TOKENS,
                 page_rows: int = 0, drafter_layers: int = 0) -> SequenceMemory:
    """The shared KV pool (`--kv-capacity`, `--kv-dtype`, `--elastic`, `--kv-grow`), state slots,
    the prefix tree and the per-request budget (`--kv-budget-gib`). A long hybrid prompt is
    snapshotted every `prefill_chunk` tokens, where its chunks end anyway. `page_rows`: the
    width of a drafter row each KV slot keeps too (`kv.cache.KvStorage`); `drafter_layers`:
    attention layers of a drafter's own after the model's (`--spec mtp`'s MTP layer), paged
    like them."""
    layers, heads, dim = model.kv_layout()
    layers += drafter_layers
    pages = config.kv_tokens // PAGE_TOKENS
    pool = (ElasticPagePool(pages, -(-config.kv_grow // PAGE_TOKENS)) if config.elastic
            else PagePool(pages))
    storage = KvStorage(pool, layers, heads, dim, codecs_for(config.kv_dtype, model.dtype),
                        model.dtype, model.device, page_rows)
    checkpoints = _checkpoint_slots(config)
    # a lease never outgrows the context: the decode step's page tables hold that many pages
    budget = -(-config.max_context // PAGE_TOKENS)
    if config.kv_budget_gib is not None:
        budget = min(budget, int(config.kv_budget_gib * 2**30) // storage.page_bytes)
    tiers = getattr(model, "expert_tiers", None)
    if config.elastic and tiers is not None:  # capacity not grown into becomes expert slots
        tiers.lend(pool, storage.page_bytes)
    return SequenceMemory(storage, config.kv_lease_window, config.max_concurrency, checkpoints,
                          not config.no_prefix_reuse, config.kv_dtype,
                          getattr(model, "state_pool", None), budget, prefill_chunk,
                          _host_tier(config, model, storage), snapshot_limits(config))


def snapshot_limits(config: EngineConfig) -> SnapshotLimits:
    """`--max-private-continuations` / `--max-shared-prefixes`: device snapshots of each kind,
    past which the lowest-standing moves to the host tier (or is dropped); unset (ours, not the
    contract's 2C / max(C, 4)): the device slots alone bound them, since at those budgets a
    6-page engine test's conversations lost their prompt-end snapshots to long anchors that
    filled the rest of the pool. `--max-long-anchors-per-continuation` (2): chunk snapshots on
    one conversation's path, either tier (`kv.snapshot_policy`)."""
    long = config.max_long_anchors_per_continuation
    return SnapshotLimits(config.max_private_continuations, config.max_shared_prefixes,
                          2 if long is None else long)


def _host_tier(config: EngineConfig, model: Any, storage: KvStorage):
    """The prefix cache's host tier (`--host-kv-mib`, `--host-state-slots`; both default to
    0: none), checked against the RAM available (`NINFER_HOST_TIER_RAM_GUARD`)."""
    # a model without attention layers (a truncated hybrid) stores no K/V: no host pages
    pages = (config.host_kv_mib or 0) * MIB // storage.page_bytes if storage.page_bytes else 0
    slots = config.host_state_slots or 0
    if not pages and not slots:
        return None
    check_host_ram(pages * storage.page_bytes + slots * recurrent_state_bytes(model),
                   f"--host-kv-mib {config.host_kv_mib or 0} --host-state-slots {slots}")
    pinned = storage.device.type == "cuda"
    return lambda snapshots: HostTier(
        storage, pages, snapshots.host_copy(slots, pinned) if snapshots and slots else None)
