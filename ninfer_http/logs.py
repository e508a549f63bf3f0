"""stderr logging (contract §9): `YYYY-MM-DD HH:MM:SS.mmm  LEVEL  message`, groups joined by ` | `.

`configure_logging()` installs the format on the `ninfer` and `aiohttp` loggers;
`RequestTrace` writes the `req#N started|done|rejected|failed|cancelled` lines of one prepared
request. No line ever contains a prompt, an output or a key.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import time
from typing import Callable, TextIO

from ninfer_engine.stats import EngineStats, interval_throughput, time_to_first_token
from ninfer_engine.types import Timings, Usage

from .observers import trace_observer
from .usage import decode_rate

TRACE = 5
LEVELS = {
    "trace": TRACE,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "off": logging.CRITICAL + 10,
}
_LEVEL_NAMES = {TRACE: "TRACE", logging.WARNING: "WARN"}

log = logging.getLogger("ninfer.http")


class NinferFormatter(logging.Formatter):
    """`2026-01-31 12:00:00.123  INFO  message`, local time."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        level = _LEVEL_NAMES.get(record.levelno, record.levelname)
        text = f"{when}.{int(record.msecs):03d}  {level}  {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure_logging(level: str = "info", stream: TextIO | None = None) -> logging.Handler:
    """Send `ninfer.*` (at `level`) and `aiohttp.*` (warnings and worse) to stderr.

    Calling it again replaces the handler it installed before.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; expected one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(NinferFormatter())
    for name, threshold in (("ninfer", LEVELS[level]), ("aiohttp", max(LEVELS[level], 30))):
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if isinstance(h.formatter, NinferFormatter)]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(threshold)
        logger.propagate = False
    return handler


def count(n: int) -> str:
    return f"{n:,}"


def size(n_bytes: float) -> str:
    """`512 B`, `96.0 MiB`, `5.1 GiB`."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes:.0f} B"


def duration(seconds: float) -> str:
    """`323 ms`, `21.0s`, `5m 21.0s`, `1h 02m 03.0s`."""
    if seconds < 1.0:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60.0:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(seconds, 60.0)
    if minutes < 60:
        return f"{int(minutes)}m {secs:.1f}s"
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}h {minutes:02d}m {secs:04.1f}s"


def listening_line(host: str, port: int, model_id: str, auth: bool) -> str:
    shown = f"[{host}]" if ":" in host else host
    auth_text = "auth bearer" if auth else "auth disabled"
    return f"listening on http://{shown}:{port} | model {model_id} | {auth_text}"


_FINISH_LABELS = {"stop": "stop token", "length": "length limit"}


class RequestTrace:
    """The stderr lines of one prepared generation request; exactly one terminal line."""

    _numbers = itertools.count(1)

    def __init__(
        self,
        protocol: str,
        stream: bool,
        messages: int,
        max_output: int,
        thinking: str,
        client: str | None = None,
    ) -> None:
        self.number = next(self._numbers)
        self.closed = False  # set by the terminal line
        self.protocol = protocol
        self.client = client
        self.started_at = time.monotonic()
        self._observer = trace_observer()  # /metrics and the request log hear the same events
        kind = f"{protocol} stream" if stream else protocol
        groups = [kind, f"{count(messages)} messages", f"max output {count(max_output)}",
                  f"thinking {thinking}"]
        if client is not None:
            groups.append(f"client {client}")
        if self._observer.request_id:
            groups.append(f"id {self._observer.request_id}")
        self._emit(logging.INFO, "started", *groups)
        self._observer.started(self, stream, messages, max_output, thinking, client)

    def _emit(self, level: int, *groups: str) -> None:
        log.log(level, "req#%d %s", self.number, " | ".join(groups))

    def done(
        self,
        finish: str,
        stop_sequence: str | None,
        usage: Usage,
        timings: Timings,
        first_output_at: float | None,
    ) -> None:
        """The `done` line: finish, who, queue wait and TTFT (both from arrival, the engine's
        `timings`), tokens and rate. `first_output_at` is when the first token reached us."""
        label = "stop sequence" if stop_sequence else _FINISH_LABELS.get(finish, finish)
        groups = [self.protocol, label]
        if self.client is not None:
            groups.append(f"client {self.client}")
        groups += [f"prompt {count(usage.prompt_tokens)}",
                   f"output {count(usage.completion_tokens)}"]
        if usage.cached_tokens:
            share = 100.0 * usage.cached_tokens / max(usage.prompt_tokens, 1)
            groups.append(f"cache {count(usage.cached_tokens)} ({share:.1f}%)")
        groups.append(f"queue {timings.queue_s * 1000:.0f} ms")
        ttft = time_to_first_token(timings, usage.completion_tokens)
        if ttft is not None:
            groups.append(f"TTFT {ttft * 1000:.0f} ms")
        groups.append(f"total {duration(time.monotonic() - self.started_at)}")
        groups.append(f"decode {decode_rate(timings):.1f} tok/s")
        if timings.draft_n:
            share = 100.0 * timings.draft_accepted / timings.draft_n
            accepted = f"{timings.draft_accepted}/{timings.draft_n}"
            groups.append(f"draft accepted {accepted} ({share:.0f}%)")
        if timings.draft_rounds:
            per_round = 1 + timings.draft_accepted / len(timings.draft_rounds)
            groups.append(f"{per_round:.2f} tok/round")
        self.closed = True
        self._emit(logging.INFO, "done", *groups)
        self._observer.done(self, finish, stop_sequence, usage, timings, first_output_at)

    def ended(self, outcome: str, phase: str, status: int, code: str | None) -> None:
        """A terminal line for `rejected`, `failed` or `cancelled` during `phase`."""
        reason = (code or "error").replace("_", " ")
        level = logging.WARNING if outcome == "failed" else logging.INFO
        self.closed = True
        self._emit(level, f"{outcome} during {phase}", f"HTTP {status}", reason)
        self._observer.ended(self, outcome, phase, status, code)


def throughput_line(stats: EngineStats, before: EngineStats | None = None) -> str | None:
    """The periodic `throughput` line over the time since `before` (the snapshot of the last
    line), or None for an idle interval or an engine that is not serving."""
    if not stats.live:
        return None
    tp = interval_throughput(before, stats)
    running, waiting = stats.queue.running, stats.queue.pending
    if not (tp.decode_tokens or tp.prefill_tokens or running or waiting):
        return None
    decode_ready = sum(1 for r in running if r.phase == "decode")
    groups = [
        "throughput",
        f"{tp.interval_s:.1f}s",
        f"decode {tp.decode_tok_s:.1f} tok/s ({count(tp.decode_tokens)} tok)",
    ]
    if tp.prefill_tokens:
        groups.append(f"prefill {tp.prefill_tok_s:.1f} tok/s ({count(tp.prefill_tokens)} tok)")
    groups += [f"running {len(running)} (decode-ready {decode_ready})",
               f"waiting {len(waiting)}", f"batch {tp.batch:.2f}"]
    kv = stats.kv
    if kv.total:
        groups.append(f"kv {100.0 * kv.used / kv.total:.0f}% ({count(kv.used)}/{count(kv.total)}"
                      f" pages, lent {count(kv.lent)}"
                      + (f", cached {count(kv.cached)}" if kv.cached else "") + ")")
    c = stats.counters
    if c.prefix_cache_queries:
        # prompt tokens of finished requests since start, as /metrics' prefix_cache_* counters
        groups.append(f"prefix hits {100.0 * c.prefix_cache_hits / c.prefix_cache_queries:.0f}%"
                      f" ({count(c.prefix_cache_hits)}/{count(c.prefix_cache_queries)} tok)")
    x = stats.experts
    if x is not None:
        lookups = x.hits + x.misses
        line = f"experts hit {100.0 * x.hits / max(lookups, 1):.1f}%"
        if x.slots:  # a device slot cache: offloaded experts (`ninfer_engine.experts`)
            line += (f" ({count(x.resident)}/{count(x.slots)} slots, lent {count(x.lent_pages)}"
                     f" pages), cpu {100.0 * x.cpu_share:.1f}%, copied "
                     f"{x.bytes_copied / 2**20:.0f} MiB")
        groups.append(line)
    if stats.spec is not None and stats.spec.drafted:
        groups.append(f"spec {100.0 * stats.spec.acceptance:.1f}%")
    return " | ".join(groups)


async def log_throughput(snapshot: Callable[[], EngineStats], interval_s: float) -> None:
    """Log a `throughput` line every `interval_s` seconds until cancelled, each over the time
    since the previous one."""
    before = snapshot()
    while True:
        await asyncio.sleep(interval_s)
        stats = snapshot()
        line = throughput_line(stats, before)
        before = stats
        if line is not None:
            log.info(line)
