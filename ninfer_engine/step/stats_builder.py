"""`StatsBuilder`: the engine's per-step counts turned into immutable `EngineStats` snapshots."""
from __future__ import annotations

import multiprocessing
import time
from collections import deque
from dataclasses import replace
from typing import Any

import psutil
import torch

from ..config import EngineConfig
from ..kv import SequenceMemory
from ..stats import (Counters, DeviceMemory, EngineStats, ExpertStats, HostMemory, QueueStats,
                     RequestView, SpecStats, Throughput, VisionStats)
from .scheduler import Scheduler
from .sequence import Sequence

# `--kv-dtype bf16` stores the model's activation dtype (`codecs.kv`): name what is really stored
_STORED = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


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
        self.dtype = _STORED.get(getattr(model, "dtype", None), "")
        self.kv_dtype = config.kv_dtype
        if config.kv_dtype == "bf16":
            self.kv_dtype = _STORED.get(getattr(model, "dtype", None), config.kv_dtype)
        self.experts = model_experts(getattr(model, "config", None), self.device)
        self.tiers = getattr(model, "expert_tiers", None)  # offloaded routed experts
        self.counters = Counters()
        self.throughput = Throughput()
        self.recent: deque[RequestView] = deque(maxlen=8)
        self._interval = [time.monotonic(), 0, 0, 0, 0]  # start, decode, prefill, batch sum, steps
        self._host = (0.0, HostMemory(), (0, 0))  # refreshed at, host, device (total, free)
        # the server's processes: this one, and the HTTP process that spawned an engine
        # process (`engine_process`): RSS and CPU are the server's, whichever runs the engine
        here = psutil.Process()
        self._processes = [here] + ([here.parent()] if multiprocessing.parent_process() else [])

    def record_step(self, decode_tokens: int, prefill_tokens: int, now: float) -> None:
        i = self._interval
        i[1] += decode_tokens
        i[2] += prefill_tokens
        rows = decode_tokens + (1 if prefill_tokens else 0)
        i[3] += rows
        i[4] += 1
        c = self.counters
        self.counters = replace(c, decode_tokens=c.decode_tokens + decode_tokens,
                                prefill_tokens=c.prefill_tokens + prefill_tokens,
                                steps=c.steps + 1, batch_rows=c.batch_rows + rows)

    def record_step_failed(self) -> None:
        self.counters = replace(self.counters, steps_failed=self.counters.steps_failed + 1)

    def record_finished(self, seq: Sequence) -> None:
        c, reason = self.counters, seq.finish_reason
        # token totals over the requests that finished, as /metrics and the request log count
        # them: every prompt token, cached ones included, and of those the ones restored
        prompt, output, reused = ((len(seq.prompt), len(seq.output), seq.reused)
                                  if reason in ("stop", "length") else (0, 0, 0))
        self.counters = replace(
            c,
            requests_done=c.requests_done + (reason in ("stop", "length")),
            requests_failed=c.requests_failed + (reason == "error"),
            requests_cancelled=c.requests_cancelled + (reason == "cancelled"),
            prompt_tokens=c.prompt_tokens + prompt,
            generation_tokens=c.generation_tokens + output,
            prefix_cache_queries=c.prefix_cache_queries + prompt,
            prefix_cache_hits=c.prefix_cache_hits + reused,
        )
        self.recent.append(self._view(seq, time.monotonic(), reason or "error"))

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
            rss = sum(_each(self._processes, lambda p: p.memory_info().rss))
            kv_tier, state_tier = self.memory.host_tier_bytes()
            host = HostMemory(total=vm.total, used=vm.total - vm.available, process_rss=rss,
                              # both since the last refresh (the first reads 0)
                              process_cpu=sum(_each(self._processes,
                                                    lambda p: p.cpu_percent(None))),
                              machine_cpu=psutil.cpu_percent(None), cpus=psutil.cpu_count() or 0,
                              pinned_experts=self.tiers.host.nbytes if self.tiers else 0,
                              pinned_kv_tier=kv_tier, pinned_state_tier=state_tier)
            device = (host.total, vm.available)
            if self.device.startswith("cuda"):
                free, total = torch.cuda.mem_get_info(self.device)
                device = (total, free)
            self._host = (now, host, device)
        return self._host[1], self._host[2]

    def _device(self, host: HostMemory, total: int, free: int) -> DeviceMemory:
        """The serving device; on the CPU its "workspace" is the rest of the engine's RSS."""
        kv = self.memory.storage.nbytes
        slots = self.tiers.device_bytes if self.tiers else 0
        workspace = 0
        if not self.device.startswith("cuda"):  # the RSS holds the slots and the host store
            held = slots + (self.tiers.host.nbytes if self.tiers else 0)
            workspace = max(host.process_rss - self.weight_bytes - kv - held, 0)
        return DeviceMemory(name=self.device, total=total, weights=self.weight_bytes,
                            kv_pool=kv, expert_slots=slots, workspace=workspace, free=free)

    @staticmethod
    def _view(seq: Sequence, now: float, phase: str | None = None) -> RequestView:
        decode_s = (seq.last_token - seq.first_token) if seq.first_token and seq.last_token else 0
        ttft = seq.first_token - seq.arrived if seq.first_token else None  # from arrival
        return RequestView(
            id=seq.id, phase=phase or seq.phase, prompt_tokens=len(seq.prompt),
            output_tokens=len(seq.output),
            tok_s=(len(seq.output) - 1) / decode_s if decode_s > 0 else 0.0,
            ttft_s=ttft, waited_s=(seq.admitted or now) - seq.arrived,
            cached_tokens=seq.reused,
        )

    def build(self, state: str, failure: str | None, scheduler: Scheduler,
              spec: SpecStats | None = None, vision: VisionStats | None = None) -> EngineStats:
        now = time.monotonic()
        self._roll_interval(now)
        running = list(scheduler.running)
        counters = self.counters
        host, (total, free) = self._memory(now)
        return EngineStats(
            at=time.time(), state=state, model_id=self.model_id, profile=self.config.profile,
            started_at=self.started_at, failure=failure,
            devices=(self._device(host, total, free),),
            host=host,
            kv=replace(self.memory.stats(running), dtype=self.kv_dtype),
            experts=self.tiers.stats(self.experts) if self.tiers else self.experts,
            state_slots=self.memory.slot_stats(), prefix=self.memory.prefix_stats(),
            queue=QueueStats(
                pending=tuple(self._view(s, now) for s in scheduler.queued()),
                running=tuple(self._view(s, now) for s in running),
                recent=tuple(self.recent),
            ),
            throughput=self.throughput, counters=counters, max_context=self.config.max_context,
            spec=spec, vision=vision, dtype=self.dtype, engine_pid=self._processes[0].pid,
        )


def model_experts(config: dict | None, device: str) -> ExpertStats | None:
    """What a MoE model's routed experts are, or None for a dense model. Without an expert
    cache every expert is resident where it runs: all of the work is on `device`."""
    if not config or not config.get("num_experts"):
        return None
    layers = config.get("num_hidden_layers", 0) - len(config.get("mlp_only_layers", []))
    return ExpertStats(experts=config["num_experts"], active=config.get("num_experts_per_tok", 0),
                       layers=layers, cpu_share=0.0 if device.startswith("cuda") else 1.0)


def _each(processes: list[psutil.Process], read) -> list:
    """`read(p)` of each process still there (an HTTP process that just ended counts 0)."""
    values = []
    for p in processes:
        try:
            values.append(read(p))
        except psutil.Error:
            pass
    return values
