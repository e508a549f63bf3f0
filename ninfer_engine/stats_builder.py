"""`StatsBuilder`: the engine's per-step counts turned into immutable `EngineStats` snapshots."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from typing import Any

import psutil
import torch

from .config import EngineConfig
from .kv import SequenceMemory
from .scheduler import Scheduler, Sequence
from .stats import (Counters, DeviceMemory, EngineStats, HostMemory, QueueStats, RequestView,
                    Throughput)


class StatsBuilder:
    """Accumulates per-step counts and builds the immutable `EngineStats` snapshots."""

    THROUGHPUT_INTERVAL_S = 1.0
    HOST_REFRESH_S = 1.0

    def __init__(self, model_id: str, config: EngineConfig, model: Any,
                 memory: SequenceMemory) -> None:
        self.model_id = model_id
        self.config = config
        self.memory = memory
        self.started_at = time.time()
        self.weight_bytes = model.weight_bytes()
        self.device = str(model.device)
        self.counters = Counters()
        self.throughput = Throughput()
        self.recent: deque[RequestView] = deque(maxlen=8)
        self._interval = [time.monotonic(), 0, 0, 0, 0]  # start, decode, prefill, batch sum, steps
        self._host = (0.0, HostMemory(), (0, 0))  # refreshed at, host, device (total, free)
        self._process = psutil.Process()

    def record_step(self, decode_tokens: int, prefill_tokens: int, now: float) -> None:
        i = self._interval
        i[1] += decode_tokens
        i[2] += prefill_tokens
        i[3] += decode_tokens + (1 if prefill_tokens else 0)
        i[4] += 1

    def record_finished(self, seq: Sequence) -> None:
        c, reason = self.counters, seq.finish_reason
        self.counters = Counters(
            requests_done=c.requests_done + (reason in ("stop", "length")),
            requests_failed=c.requests_failed + (reason == "error"),
            requests_cancelled=c.requests_cancelled + (reason == "cancelled"),
            prompt_tokens=c.prompt_tokens + max(min(seq.cached, len(seq.prompt)) - seq.reused, 0),
            generation_tokens=c.generation_tokens + len(seq.output),
        )
        phase = {"stop": "done", "length": "done"}.get(reason or "", reason or "done")
        self.recent.append(self._view(seq, time.monotonic(), phase))

    def _roll_interval(self, now: float) -> None:
        start, decode, prefill, batch, steps = self._interval
        elapsed = now - start
        if elapsed < self.THROUGHPUT_INTERVAL_S:
            return
        self.throughput = Throughput(
            decode_tok_s=decode / elapsed, prefill_tok_s=prefill / elapsed,
            batch=batch / steps if steps else 0.0, interval_s=elapsed,
            decode_tokens=decode, prefill_tokens=prefill,
        )
        self._interval = [now, 0, 0, 0, 0]

    def _memory(self, now: float) -> tuple[HostMemory, tuple[int, int]]:
        """Host memory and the serving device's (total, free): the GPU's own, else the host's."""
        if now - self._host[0] >= self.HOST_REFRESH_S:
            vm = psutil.virtual_memory()
            rss = self._process.memory_info().rss
            host = HostMemory(total=vm.total, used=vm.total - vm.available, process_rss=rss)
            device = (host.total, host.total - host.used)
            if self.device.startswith("cuda"):
                free, total = torch.cuda.mem_get_info(self.device)
                device = (total, free)
            self._host = (now, host, device)
        return self._host[1], self._host[2]

    @staticmethod
    def _view(seq: Sequence, now: float, phase: str | None = None) -> RequestView:
        decode_s = (seq.last_token - seq.first_token) if seq.first_token and seq.last_token else 0
        ttft = seq.first_token - seq.admitted if seq.first_token and seq.admitted else None
        return RequestView(
            id=seq.id, phase=phase or seq.phase, prompt_tokens=len(seq.prompt),
            output_tokens=len(seq.output),
            tok_s=(len(seq.output) - 1) / decode_s if decode_s > 0 else 0.0,
            ttft_s=ttft, waited_s=(seq.admitted or now) - seq.arrived,
        )

    def build(self, state: str, failure: str | None, scheduler: Scheduler) -> EngineStats:
        now = time.monotonic()
        self._roll_interval(now)
        running = list(scheduler.running)
        counters = replace(self.counters, prefix_cache_queries=self.memory.queries,
                           prefix_cache_hits=self.memory.hits)
        host, (total, free) = self._memory(now)
        return EngineStats(
            at=time.time(), state=state, model_id=self.model_id, profile=self.config.profile,
            started_at=self.started_at, failure=failure,
            devices=(DeviceMemory(name=self.device, total=total, weights=self.weight_bytes,
                                  kv_pool=self.memory.storage.nbytes, free=free),),
            host=host,
            kv=self.memory.stats(running),
            state_slots=self.memory.slot_stats(),
            queue=QueueStats(
                pending=tuple(self._view(s, now) for s in scheduler.queued()),
                running=tuple(self._view(s, now) for s in running),
                recent=tuple(self.recent),
            ),
            throughput=self.throughput, counters=counters,
        )
