"""The `ninfer-serve` command line: parsing and validation -> `EngineConfig`.

Table-driven rather than argparse so that every error is one line naming the flag, `-h` is
accepted only first, and profiles expand in place (later flags win). The flag table and the
profiles are in `flag_table.py`, the value converters and `UsageError` in `flag_values.py`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import EngineConfig
from .flag_table import _FLAGS, PROFILES
from .flag_values import UsageError

CUDA_SYNC_POLICIES = ("spin", "blocking", "yield", "auto")


@dataclass(frozen=True)
class ParsedArgs:
    config: EngineConfig
    explicit: frozenset[str]  # flags given on the command line or by the profile
    help: bool = False


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

