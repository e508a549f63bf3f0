"""`EngineConfig`: every `ninfer-serve` setting, frozen, validated once by `flags.parse_args`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PAGE_TOKENS = 64
# output limit of a request without `max_tokens` when neither `--default-max-tokens` nor the
# artifact's generation_config.json `max_new_tokens` sets one (`sampling_presets`)
DEFAULT_MAX_TOKENS = 8192


@dataclass(frozen=True)
class EngineConfig:
    artifact: Path
    profile: str | None = None
    # network
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    model_id: str | None = None
    cors: bool = False
    max_request_mib: int = 384
    # capacity
    max_context: int = 8192
    kv_capacity: int | None = None  # tokens; None = follows max_context
    # `--kv-capacity auto` (CUDA): the engine sets `kv_capacity` (a `dataclasses.replace`d copy)
    # from the memory free after the weights, less this headroom (`kv.sizing`)
    kv_capacity_auto: bool = False
    vram_headroom_mib: int = 1024
    max_concurrency: int = 1
    max_pending_requests: int = 16
    pending_timeout_ms: int = 30000
    drain_timeout_ms: int = 10000  # graceful stop: how long running requests may still finish
    prefill_chunk: int | None = None  # tokens; None ("auto"): `serving.prefill_chunk_for`
    kv_dtype: str = "bf16"
    kv_lease_window: int = 4096
    elastic: bool = False
    kv_grow: int = 8192
    kv_budget_gib: float | None = None
    # routed experts (ours, `ninfer_engine.experts`): the device memory they may use (None:
    # all on the device), or `--expert-vram-mib auto`; how a miss runs; the slot policy;
    # next-layer prefetch
    expert_vram_mib: float | None = None
    expert_vram_auto: bool = False
    expert_miss: str = "auto"
    expert_cache: str = "lfu"
    expert_prefetch: bool = False
    # the share of a layer-step's missed experts the captured step computes on the host's
    # cores (`experts.host_jobs`; None: none, every miss read over the bus; "auto": the count
    # that balances the host job's timed costs against the bus, `tiers.balanced_count`)
    expert_cpu_share: float | str | None = None
    # devices
    tp: int = 1
    devices: tuple[int, ...] = ()
    device: int = 0
    no_cuda_graph: bool = False
    embedding_host: bool = False
    no_tp_mailbox: bool = False
    # `--tp-experts`: routed experts split by intermediate (what the CUDA-graph step runs) or by
    # expert id (eager only: the fused MoE kernels index experts by global id)
    tp_experts: str = "intermediate"
    # speculation
    spec: str | None = None
    draft_tokens: int | None = None
    lm_head_draft: bool = False
    log_speculation_detail: bool = False
    # vision
    vision: bool = False
    vision_device: int = 0
    max_vision_tokens: int = 16384
    media_cache_mib: int = 1024
    media_live_mib: int = 2048
    media_preprocess_threads: int = 0
    media_allow_private: bool = False  # ours: media URLs may resolve to internal addresses
    # prefix reuse and tiers
    host_state_slots: int | None = None
    host_kv_mib: int | None = None
    device_state_slots: int | None = None
    max_private_continuations: int | None = None
    max_shared_prefixes: int | None = None
    max_long_anchors_per_continuation: int | None = None
    turn_anchors: int = 1
    no_prefix_reuse: bool = False
    # request defaults and sampler overrides
    no_thinking: bool = False
    preserve_thinking: bool = False
    default_max_tokens: int | None = None  # None: the artifact's max_new_tokens, else 8192
    default_thinking_budget: int | None = None
    greedy: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    chat_template: Path | None = None
    context_cost_presets: Path | None = None
    # logs and stores
    log_level: str = "info"
    log_stats_interval_ms: int = 5000
    request_log_jsonl: Path | None = None
    response_store_max_records: int = 1024
    response_store_max_mib: int = 256
    # ours
    no_tui: bool = False
    cpu_matmul: str = "fp32"  # bf16|int8: decode projections narrowed on the CPU (faster, inexact)
    # CPU decode rows: one compiled C call a step ("compiled", where the machine and artifact
    # allow it; else the eager step, with the reason logged), or "eager" torch ops
    cpu_step: str = "compiled"
    # the lookahead decode step (`step.lookahead`); None: where the decode graphs are captured
    # (the GPU: on the CPU a step is synchronous and there is nothing to overlap)
    lookahead: bool | None = None
    # `--spec mtp`'s verify rounds accepted and drafted on the device (`step.verify_chain`),
    # where the graphs and the rows allow; off: the host accepts (a benchmark's A/B)
    verify_chain: bool = True
    # ... and the next such round launched before this one is read (`step.chain_ahead`)
    chain_ahead: bool = True
    # the engine in a process of its own (`engine_process`); None: on CUDA without --vision
    # (`engine_factory._in_own_process`, which NINFER_ENGINE_PROCESS overrides)
    engine_process: bool | None = None
    # the compiled step's GEMV inputs: fp32 (the exact product of the stored weights), or
    # quantized per 32 to int16 or int8 (llama.cpp's Q8_0 x Q8_0) for integer dot products:
    # fewer instructions a weight, the activations rounded
    cpu_activations: str = "fp32"
    cuda_dtype: str = "bf16"  # weights and activations on CUDA; "fp32" is the exact path
    cuda_weights: str = "auto"  # how packed projections are served on CUDA: auto|packed|dequant
    # prompt steps' routed-expert GEMMs over fp8-row stacks on CUDA: e4m3 activations (fp8 × fp8
    # MMA) or bf16 ones (`models.moe`)
    prefill_activations: str = "fp8"
    cuda_sync: str = "spin"
    no_verify: bool = False  # skip checking the artifact's metadata.payload_sha256 at load

    @property
    def kv_tokens(self) -> int:
        """Size of the shared KV pool in tokens, rounded up to whole pages (under
        `--kv-capacity auto`, --max-context until the engine has sized the pool)."""
        tokens = self.kv_capacity or self.max_context
        return -(-tokens // PAGE_TOKENS) * PAGE_TOKENS
