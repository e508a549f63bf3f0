"""The JSONL request log (`--request-log-jsonl FILE`, contract §9).

One JSON object per line, appended and flushed per event. Every line has `event`,
`timestamp_unix_ms` and `server_instance_id`. Events: `server_start` (artifact type, schema
version, config, memory, GPU environment, argv with the key redacted), `request_start`, exactly
one terminal event per prepared request (`request_done`, `request_error` or
`request_rejected`), `request_rejected` without an id for generation requests refused before
preparation finished, and `throughput` per `--log-stats-interval-ms` (idle intervals skipped).

Prompts, outputs, stop strings and keys are never written. In `timings_seconds`, `prepare`,
`ttft` and `total` are measured from the HTTP request's arrival (`ttft` is the engine's, the
same figure as the console, the stderr line and `/metrics`; `first_output` is when that token
reached this process, what a client sees less the socket); `prefill` and `decode` are the
engine's phase durations, `vision` the vision tower's share of the prefill (null for a request
without media). A `throughput` event covers the time since the previous one.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import platform
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from ninfer_engine.config import EngineConfig
from ninfer_engine.stats import EngineStats, interval_throughput
from ninfer_engine.types import Timings, Usage

ARTIFACT_TYPE = "ninfer_serve_request_log"
SCHEMA_VERSION = 1
REDACTED = "<redacted>"
# The process argv for `server_start`, set by the CLI after `create_app` (absent: null).
SERVER_ARGV = web.AppKey("ninfer_server_argv", list)
_GPU_ENVIRONMENT = ("CUDA_VISIBLE_DEVICES", "NINFER_CUDA_SYNC", "NINFER_RAM_GUARD",
                    "NINFER_HOST_TIER_RAM_GUARD")


def redact_argv(argv: list[str], key: str | None) -> list[str]:
    """`argv` with the value of `--api-key` (both spellings) and any copy of the key hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg == "--api-key":
            out.append(arg)
            hide_next = True
        elif arg.startswith("--api-key="):
            out.append(f"--api-key={REDACTED}")
        else:
            out.append(REDACTED if key and key in arg else arg)
    return out


def config_record(config: EngineConfig) -> dict[str, Any]:
    """The effective settings, JSON-ready, with the key redacted."""
    record = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    record["api_key"] = REDACTED if config.api_key else None
    return {k: str(v) if isinstance(v, Path) else v for k, v in record.items()}


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def speculative(timings: Timings, backend: str, window: int) -> dict[str, Any]:
    """A request's `speculative{…}` (contract §4): its counters, and with
    `--log-speculation-detail` each round's accepted length and the prompt n-gram overlap."""
    rounds = timings.draft_rounds
    record: dict[str, Any] = {
        "backend": backend, "draft_window": window, "rounds": len(rounds),
        "drafted_tokens": timings.draft_n, "accepted_tokens": timings.draft_accepted,
        "acceptance": round(timings.draft_accepted / timings.draft_n, 6) if timings.draft_n
        else None,
        "tokens_per_round": round(1 + timings.draft_accepted / len(rounds), 6) if rounds
        else None,
        "fallback_steps": timings.draft_fallback,
        "accepted_per_position": [sum(1 for a in rounds if a > i) for i in range(window)]}
    if timings.prompt_ngram_overlap is not None:  # --log-speculation-detail
        record["round_accepted"] = list(rounds)
        record["prompt_ngram_overlap"] = round(timings.prompt_ngram_overlap, 6)
    return record


class RequestLog:
    """An open request log file; all methods run on the server's event loop."""

    def __init__(self, path: Path) -> None:
        """Open `path` for appending (restarts share one file); OSError names the flag."""
        try:
            self._file = open(path, "a", encoding="utf-8")
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise OSError(exc.errno, f"cannot open --request-log-jsonl {path}: {reason}") from exc
        self.instance_id = uuid.uuid4().hex
        self._spec: tuple[str, int] | None = None  # (backend, draft window), from server_start

    def close(self) -> None:
        self._file.close()

    def write(self, event: str, **fields: Any) -> None:
        record = {"event": event, "timestamp_unix_ms": int(time.time() * 1000),
                  "server_instance_id": self.instance_id, **fields}
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()  # a crash loses no finished event

    def server_start(self, config: EngineConfig, argv: list[str] | None,
                     stats: EngineStats) -> None:
        if stats.spec is not None:
            self._spec = stats.spec.backend, stats.spec.window
        self.write(
            "server_start",
            artifact_type=ARTIFACT_TYPE,
            schema_version=SCHEMA_VERSION,
            pid=os.getpid(),
            python=platform.python_version(),
            config=config_record(config),
            argv=None if argv is None else redact_argv(argv, config.api_key),
            memory={"host": dataclasses.asdict(stats.host),
                    "devices": [dataclasses.asdict(d) for d in stats.devices]},
            gpu_environment={"variables": {k: os.environ.get(k) for k in _GPU_ENVIRONMENT},
                             "devices": [d.name for d in stats.devices]},
        )

    def request_start(self, number: int, request_id: str, protocol: str, stream: bool,
                      messages: int, max_output: int, thinking: str, client: str | None) -> None:
        self.write("request_start", id=number, request_id=request_id, protocol=protocol,
                   stream=stream, message_count=messages,
                   limits={"max_output_tokens": max_output}, thinking=thinking, client=client)

    def request_rejected(self, number: int | None, request_id: str, protocol: str, phase: str,
                         error: dict[str, Any]) -> None:
        """`error` holds the fields the client received: status, type, code, param."""
        self.write("request_rejected", id=number, request_id=request_id, protocol=protocol,
                   phase=phase, **error)

    def request_error(self, number: int, request_id: str, protocol: str, outcome: str,
                      phase: str, status: int, code: str | None) -> None:
        self.write("request_error", id=number, request_id=request_id, protocol=protocol,
                   outcome=outcome, phase=phase, status=status, code=code)

    def request_done(self, number: int, request_id: str, protocol: str, finish: str,
                     stop_sequence_matched: bool, usage: Usage, timings: Timings,
                     prepare_s: float, ttft_s: float | None, total_s: float,
                     first_output_s: float | None = None) -> None:
        computed = timings.prompt_n or usage.prompt_tokens - usage.cached_tokens
        self.write(
            "request_done", id=number, request_id=request_id, protocol=protocol,
            result={"finish_reason": finish, "stop_sequence_matched": stop_sequence_matched,
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "computed_prefill_tokens": computed,
                    "prefix_cache_hit_tokens": usage.cached_tokens,
                    "prefix_reuse_path": timings.reuse_path},
            timings_seconds={"prepare": _seconds(prepare_s), "ttft": _seconds(ttft_s),
                             "first_output": _seconds(first_output_s),
                             "vision": _seconds(timings.vision_s) if timings.vision_s else None,
                             "prefill": _seconds(timings.prefill_s),
                             "decode": _seconds(timings.decode_s), "total": _seconds(total_s)},
            engine_timing={"queue_wait_seconds": _seconds(timings.queue_s),
                           "prompt_computed_tokens": timings.prompt_n,
                           "prompt_cached_tokens": timings.cache_n,
                           "predicted_tokens": timings.predicted_n},
            speculative=None if self._spec is None else speculative(timings, *self._spec),
        )

    def throughput(self, stats: EngineStats, before: EngineStats | None = None) -> None:
        """One `throughput` event over the time since `before` (the previous event's)."""
        tp = interval_throughput(before, stats)
        queue, kv, counters = stats.queue, stats.kv, stats.counters
        phases = [r.phase for r in queue.running]
        experts = None if stats.experts is None else dataclasses.asdict(stats.experts)
        spec = None
        if stats.spec is not None:
            spec = {**dataclasses.asdict(stats.spec), "acceptance": stats.spec.acceptance,
                    "tokens_per_round": stats.spec.tokens_per_round}
        self.write(
            "throughput",
            interval_s=_seconds(tp.interval_s),
            decode_tokens=tp.decode_tokens, prefill_tokens=tp.prefill_tokens,
            decode_tok_s=tp.decode_tok_s, prefill_tok_s=tp.prefill_tok_s, batch_avg=tp.batch,
            scheduler={"running": len(phases), "prefilling": phases.count("prefill"),
                       "decode_ready": phases.count("decode"), "waiting": len(queue.pending)},
            cache={"prefix_cache_queries": counters.prefix_cache_queries,
                   "prefix_cache_hits": counters.prefix_cache_hits},
            kv={"page_tokens": kv.page_tokens, "total": kv.total, "used": kv.used,
                "free": kv.free, "lent": kv.lent},
            experts=experts,
            spec=spec,
        )


def is_idle(stats: EngineStats, before: EngineStats | None = None) -> bool:
    """No tokens since `before` and nobody running or waiting, or an engine not serving."""
    tp = interval_throughput(before, stats)
    busy = tp.decode_tokens or tp.prefill_tokens or stats.queue.running or stats.queue.pending
    return not (stats.live and busy)


async def log_throughput(log: RequestLog, snapshot: Callable[[], EngineStats],
                         interval_s: float) -> None:
    """Write a `throughput` event every `interval_s` seconds until cancelled."""
    before = snapshot()
    while True:
        await asyncio.sleep(interval_s)
        stats = snapshot()
        if not is_idle(stats, before):
            log.throughput(stats, before)
        before = stats
