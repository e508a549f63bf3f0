"""The `ninfer-serve` command line: flag table, profiles, validation -> `EngineConfig`.

Table-driven rather than argparse so that every error is one line naming the flag, `-h` is
accepted only first, and profiles expand in place (later flags win).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import EngineConfig

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

CUDA_SYNC_POLICIES = ("spin", "blocking", "yield", "auto")
LOG_LEVELS = ("trace", "debug", "info", "warn", "error", "critical", "off")
KV_DTYPES = ("bf16", "int8", "fp8", "nvfp4", "k8v4")


class UsageError(Exception):
    """A bad command line or environment: one line; the CLI prints it with usage, exit 1."""


@dataclass(frozen=True)
class ParsedArgs:
    config: EngineConfig
    explicit: frozenset[str]  # flags given on the command line or by the profile
    help: bool = False


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[str, str], int]:
    def conv(flag: str, raw: str) -> int:
        try:
            value = int(raw, 10)
        except ValueError:
            raise UsageError(f"{flag}: expected an integer, got {raw!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"{lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}"
            raise UsageError(f"{flag}: {value} is out of range {bounds}")
        return value

    return conv


def _float(lo: float, hi: float, lo_open: bool = False) -> Callable[[str, str], float]:
    def conv(flag: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"{flag}: expected a number, got {raw!r}") from None
        if value != value or value > hi or value < lo or (lo_open and value == lo):
            left = "(" if lo_open else "["
            raise UsageError(f"{flag}: {raw} is out of range {left}{lo}, {hi}]")
        return value

    return conv


def _choice(*choices: str) -> Callable[[str, str], str]:
    def conv(flag: str, raw: str) -> str:
        if raw not in choices:
            raise UsageError(f"{flag}: {raw!r} is not one of {', '.join(choices)}")
        return raw

    return conv


def _text(flag: str, raw: str) -> str:
    if not raw.strip():
        raise UsageError(f"{flag}: must not be empty")
    return raw


def _path(flag: str, raw: str) -> Path:
    return Path(_text(flag, raw)).expanduser()


def _devices(flag: str, raw: str) -> tuple[int, ...]:
    parts = raw.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise UsageError(f"{flag}: expected two device indices A,B, got {raw!r}")
    a, b = (int(p) for p in parts)
    if a == b:
        raise UsageError(f"{flag}: the two devices must differ, got {raw!r}")
    return (a, b)


def _kv_capacity(flag: str, raw: str) -> int | str:
    return "auto" if raw == "auto" else _int(1)(flag, raw)


def _prefill_chunk(flag: str, raw: str) -> int | None:
    return None if raw == "auto" else _int(1)(flag, raw)


def _or_auto(parse: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    """`auto`, or what `parse` makes of the value."""
    return lambda flag, raw: "auto" if raw == "auto" else parse(flag, raw)


def _positive_float(flag: str, raw: str) -> float:
    return _float(0.0, float("inf"), lo_open=True)(flag, raw)


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
_VISION_FLAGS = ("--vision", "--vision-device", "--max-vision-tokens")
_CACHE_CAPACITY_FLAGS = (
    "--device-state-slots",
    "--max-private-continuations",
    "--max-shared-prefixes",
    "--max-long-anchors-per-continuation",
)


def expand_profile(args: list[str]) -> list[str]:
    """Insert the profile's flags right after the artifact path, so later flags override them."""
    head = [args[0]] if args and not args[0].startswith("-") else []
    rest = args[len(head):]
    profile, out, i = None, [], 0
    while i < len(rest):
        if rest[i] == "--profile":
            if i + 1 >= len(rest):
                raise UsageError("--profile: expected a value (flash-next or 27b)")
            profile = _FLAGS["--profile"][1]("--profile", rest[i + 1])
            i += 2
            continue
        if rest[i].startswith("--profile="):
            profile = _FLAGS["--profile"][1]("--profile", rest[i].split("=", 1)[1])
            i += 1
            continue
        out.append(rest[i])
        i += 1
    expanded = list(PROFILES[profile]) if profile else []
    return head + (["--profile", profile] if profile else []) + expanded + out


def parse_args(argv: list[str], environ: dict[str, str] | None = None) -> ParsedArgs:
    """Parse and validate `ninfer-serve` arguments (without the program name)."""
    environ = os.environ if environ is None else environ
    if argv and argv[0] in ("-h", "--help"):
        return ParsedArgs(EngineConfig(artifact=Path()), frozenset(), help=True)
    args = expand_profile(list(argv))
    values: dict[str, Any] = {}
    explicit: list[str] = []
    artifact: Path | None = None
    i = 0
    if args and not args[0].startswith("-"):
        artifact = Path(args[0]).expanduser()
        i = 1
    while i < len(args):
        token = args[i]
        name, inline = token, None
        if token.startswith("--") and "=" in token:
            name, inline = token.split("=", 1)
        if name in ("-h", "--help"):
            raise UsageError(f"{name} is only accepted as the first argument")
        if name not in _FLAGS:
            if not token.startswith("-"):
                raise UsageError(f"unexpected argument {token!r} (the artifact path comes first)")
            raise UsageError(f"unknown flag {name}")
        field, conv, switch_value = _FLAGS[name]
        if conv is None:
            if inline is not None:
                raise UsageError(f"{name} takes no value")
            if name == "--no-vision":  # clears a profile's vision flags
                for flag in _VISION_FLAGS:
                    values.pop(_FLAGS[flag][0], None)
                explicit = [f for f in explicit if f not in _VISION_FLAGS]
            values[field] = switch_value
            i += 1
        else:
            if inline is None:
                if i + 1 >= len(args):
                    raise UsageError(f"{name}: expected a value")
                inline, i = args[i + 1], i + 2
            else:
                i += 1
            values[field] = conv(name, inline)
        explicit.append(name)
    given = frozenset(explicit)
    config = _build_config(artifact, values, given, environ)
    return ParsedArgs(config, given)


def _build_config(
    artifact: Path | None, values: dict[str, Any], given: frozenset[str], environ: dict[str, str]
) -> EngineConfig:
    if values.get("kv_capacity") == "auto":
        values["kv_capacity"] = None
        values["kv_capacity_auto"] = True
    if values.get("expert_vram_mib") == "auto":
        values["expert_vram_mib"] = None
        values["expert_vram_auto"] = True
    if values.get("spec") and values.get("draft_tokens") is None:
        values["draft_tokens"] = 7 if values["spec"].startswith("dflash") else 3
    values["cuda_sync"] = _env_choice(environ, "NINFER_CUDA_SYNC", CUDA_SYNC_POLICIES, "spin")
    for var in ("NINFER_RAM_GUARD", "NINFER_HOST_TIER_RAM_GUARD"):
        _env_choice(environ, var, ("0", "1"), "1")
    config = EngineConfig(artifact=artifact or default_artifact(environ), **values)
    _check_combinations(config, given)
    return config


def _env_choice(environ: dict[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = environ.get(name, "")
    if value == "":
        return default
    if value not in choices:
        raise UsageError(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value


def _check_combinations(c: EngineConfig, given: frozenset[str]) -> None:
    def need(flag: str, required: str, ok: bool) -> None:
        if flag in given and not ok:
            raise UsageError(f"{flag} requires {required}")

    if c.tp == 2 and not c.devices:
        raise UsageError("--tp 2 requires --devices A,B")
    need("--kv-grow", "--elastic", c.elastic)
    need("--kv-budget-gib", "--elastic", c.elastic)
    need("--draft-tokens", "--spec", c.spec is not None)
    need("--lm-head-draft", "--spec", c.spec is not None)
    need("--vram-headroom-mib", "--kv-capacity auto or --expert-vram-mib auto",
         c.kv_capacity_auto or c.expert_vram_auto)
    offload = c.expert_vram_mib is not None or c.expert_vram_auto
    need("--expert-miss", "--expert-vram-mib", offload)
    need("--expert-cache", "--expert-vram-mib", offload)
    need("--expert-prefetch", "--expert-vram-mib", offload)
    need("--expert-cpu-share", "--expert-vram-mib", offload)
    if c.expert_cpu_share is not None and c.expert_miss not in ("auto", "read"):
        raise UsageError(f"--expert-cpu-share: the captured step's (--expert-miss auto|read), "
                         f"not --expert-miss {c.expert_miss}")
    if c.spec == "mtp" and c.draft_tokens is not None and not 1 <= c.draft_tokens <= 5:
        raise UsageError(f"--draft-tokens: {c.draft_tokens} is out of range 1..5 for --spec mtp")
    if c.spec == "dflash2" and c.tp == 2 and not c.lm_head_draft:
        raise UsageError("--spec dflash2 at --tp 2 requires --lm-head-draft")
    if c.prefill_chunk is not None and c.prefill_chunk % 128:
        raise UsageError(f"--prefill-chunk: {c.prefill_chunk} is not a multiple of 128")
    if c.kv_capacity is not None and c.kv_capacity < c.max_context:
        raise UsageError(
            f"--kv-capacity: {c.kv_capacity} is smaller than --max-context {c.max_context}"
        )
    if c.no_prefix_reuse:
        conflicting = [f for f in _CACHE_CAPACITY_FLAGS if f in given]
        if conflicting:
            raise UsageError(f"--no-prefix-reuse conflicts with {conflicting[0]}")
    if c.request_log_jsonl is not None:
        if not c.request_log_jsonl.parent.is_dir():
            raise UsageError(
                f"--request-log-jsonl: directory {c.request_log_jsonl.parent} does not exist"
            )
        if c.request_log_jsonl.resolve() == c.artifact.resolve():
            raise UsageError("--request-log-jsonl: refusing to write over the artifact")
    for flag, path in (("--chat-template", c.chat_template),
                       ("--context-cost-presets", c.context_cost_presets)):
        if path is not None and not path.is_file():
            raise UsageError(f"{flag}: {path} is not a readable file")


def ninfer_home(environ: dict[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get("NINFER_HOME") or Path.home() / ".cache" / "ninfer").expanduser()


def default_artifact(environ: dict[str, str] | None = None) -> Path:
    """The model `install.sh` prepares; served when no artifact path is given."""
    return ninfer_home(environ) / "models" / "smollm2-135m-instruct.ninfer"

