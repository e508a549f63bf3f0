"""`ninfer-serve`'s flag table: each flag's `EngineConfig` field and converter, the usage
line, and the profiles (flag lists that `--profile` expands in place).
"""
from __future__ import annotations

from typing import Any, Callable

from .flag_values import (
    _choice,
    _devices,
    _float,
    _int,
    _kv_capacity,
    _or_auto,
    _path,
    _positive_float,
    _prefill_chunk,
    _text,
)

USAGE = (
    "usage: ninfer-serve [model.ninfer] [--profile flash-next|27b] [options]\n"
    "       ninfer-serve {-h|--help}"
)

PROFILES: dict[str, tuple[str, ...]] = {
    "flash-next": (
        "--tp 2 --devices 0,1 --kv-dtype int8 --elastic --max-context 262144 "
        "--max-concurrency 1 --spec mtp --draft-tokens 3"
    ).split(),
    "27b": (
        "--tp 2 --devices 0,1 --kv-dtype int8 --max-context 196608 --device-state-slots 4 "
        "--max-concurrency 1 --spec mtp --draft-tokens 3 --vision --vision-device 0 "
        "--max-vision-tokens 4096 --host-state-slots 8 --host-kv-mib 8192"
    ).split(),
}

LOG_LEVELS = ("trace", "debug", "info", "warn", "error", "critical", "off")
KV_DTYPES = ("bf16", "int8", "fp8", "nvfp4", "k8v4")


# flag -> (EngineConfig field, converter or None for a switch, value a switch sets)
_FLAGS: dict[str, tuple[str, Callable[[str, str], Any] | None, Any]] = {
    "--profile": ("profile", _choice(*PROFILES), None),
    "--host": ("host", _text, None),
    "--port": ("port", _int(1, 65535), None),
    "--api-key": ("api_key", _text, None),
    "--model-id": ("model_id", _text, None),
    "--max-context": ("max_context", _int(1), None),
    "--kv-capacity": ("kv_capacity", _kv_capacity, None),
    "--max-concurrency": ("max_concurrency", _int(1, 8), None),
    "--tp": ("tp", _int(1, 2), None),
    "--devices": ("devices", _devices, None),
    "--device": ("device", _int(0), None),
    "--kv-dtype": ("kv_dtype", _choice(*KV_DTYPES), None),
    "--elastic": ("elastic", None, True),
    "--kv-grow": ("kv_grow", _int(1), None),
    "--kv-budget-gib": ("kv_budget_gib", _positive_float, None),
    "--spec": ("spec", _choice("mtp", "dflash", "dflash2", "ngram"), None),
    "--draft-tokens": ("draft_tokens", _int(1, 15), None),
    "--lm-head-draft": ("lm_head_draft", None, True),
    "--vision": ("vision", None, True),
    "--no-vision": ("vision", None, False),
    "--vision-device": ("vision_device", _int(0), None),
    "--max-vision-tokens": ("max_vision_tokens", _int(64, 16384), None),
    "--kv-lease-window": ("kv_lease_window", _int(0), None),
    "--host-state-slots": ("host_state_slots", _int(0), None),
    "--host-kv-mib": ("host_kv_mib", _int(0), None),
    "--cors": ("cors", None, True),
    "--no-thinking": ("no_thinking", None, True),
    "--preserve-thinking": ("preserve_thinking", None, True),
    "--default-max-tokens": ("default_max_tokens", _int(1), None),
    "--default-thinking-budget": ("default_thinking_budget", _int(1), None),
    "--greedy": ("greedy", None, True),
    "--temperature": ("temperature", _float(0.0, 2.0), None),
    "--top-p": ("top_p", _float(0.0, 1.0, lo_open=True), None),
    "--top-k": ("top_k", _int(0, 20), None),
    "--seed": ("seed", _int(), None),
    "--log-level": ("log_level", _choice(*LOG_LEVELS), None),
    "--max-pending-requests": ("max_pending_requests", _int(0), None),
    "--pending-timeout-ms": ("pending_timeout_ms", _int(1), None),
    "--drain-timeout-ms": ("drain_timeout_ms", _int(0), None),
    "--prefill-chunk": ("prefill_chunk", _prefill_chunk, None),
    "--log-stats-interval-ms": ("log_stats_interval_ms", _int(0), None),
    "--vram-headroom-mib": ("vram_headroom_mib", _int(0), None),
    "--context-cost-presets": ("context_cost_presets", _path, None),
    "--max-request-mib": ("max_request_mib", _int(1), None),
    "--media-cache-mib": ("media_cache_mib", _int(0), None),
    "--media-live-mib": ("media_live_mib", _int(0), None),
    "--media-preprocess-threads": ("media_preprocess_threads", _int(0, 16), None),
    "--media-allow-private": ("media_allow_private", None, True),
    "--device-state-slots": ("device_state_slots", _int(0), None),
    "--max-private-continuations": ("max_private_continuations", _int(0), None),
    "--max-shared-prefixes": ("max_shared_prefixes", _int(0), None),
    "--max-long-anchors-per-continuation": ("max_long_anchors_per_continuation", _int(0), None),
    "--turn-anchors": ("turn_anchors", _int(0), None),
    "--no-prefix-reuse": ("no_prefix_reuse", None, True),
    "--request-log-jsonl": ("request_log_jsonl", _path, None),
    "--response-store-max-records": ("response_store_max_records", _int(0), None),
    "--response-store-max-mib": ("response_store_max_mib", _int(0), None),
    "--chat-template": ("chat_template", _path, None),
    "--min-p": ("min_p", _float(0.0, 1.0), None),
    "--presence-penalty": ("presence_penalty", _float(-2.0, 2.0), None),
    "--frequency-penalty": ("frequency_penalty", _float(-2.0, 2.0), None),
    "--embedding-host": ("embedding_host", None, True),
    "--no-cuda-graph": ("no_cuda_graph", None, True),
    "--log-speculation-detail": ("log_speculation_detail", None, True),
    "--no-tp-mailbox": ("no_tp_mailbox", None, True),
    "--tp-experts": ("tp_experts", _choice("expert", "intermediate"), None),
    "--no-tui": ("no_tui", None, True),
    "--cpu-matmul": ("cpu_matmul", _choice("fp32", "bf16", "int8"), None),
    "--cpu-step": ("cpu_step", _choice("compiled", "eager"), None),
    "--cpu-activations": ("cpu_activations", _choice("fp32", "int16", "int8"), None),
    "--cuda-dtype": ("cuda_dtype", _choice("bf16", "fp32"), None),
    "--cuda-weights": ("cuda_weights", _choice("auto", "packed", "dequant"), None),
    "--prefill-activations": ("prefill_activations", _choice("fp8", "bf16"), None),
    "--no-verify": ("no_verify", None, True),
    "--expert-vram-mib": ("expert_vram_mib", _or_auto(_float(0.0, float("inf"))), None),
    "--expert-miss": ("expert_miss", _choice("auto", "read", "copy", "cpu"), None),
    "--expert-cache": ("expert_cache", _choice("lfu", "lru"), None),
    "--expert-prefetch": ("expert_prefetch", None, True),
    "--expert-cpu-share": ("expert_cpu_share", _or_auto(_float(0.0, 1.0, lo_open=True)), None),
}

FLAG_NAMES = tuple(_FLAGS)


def flag_field(flag: str) -> tuple[str, bool]:
    """The EngineConfig field a flag sets, and whether the flag takes a value."""
    field, conv, _ = _FLAGS[flag]
    return field, conv is not None
