"""`GET /engine/state` (contract §12): the latest `EngineStats` snapshot as JSON.

Like llama.cpp's `/slots`, but only figures: request ids, phases and token counts, never prompt
or output text. Needs the API key when one is set (the app's auth middleware).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aiohttp import web

from ninfer_engine.stats import DeviceMemory, EngineStats

from .context import ENGINE
from .metrics import MEMORY_CATEGORIES


def _device(device: DeviceMemory) -> dict[str, Any]:
    categories = {name: getattr(device, name) for name in MEMORY_CATEGORIES}
    return {"name": device.name, "total": device.total, "categories": categories}


def engine_state_document(stats: EngineStats) -> dict[str, Any]:
    """The §12 document for one snapshot."""
    kv, queue, host = stats.kv, stats.queue, stats.host
    experts = stats.experts
    spec = stats.spec
    return {
        "state": stats.state,
        "admission": stats.admission,
        "failure": stats.failure,
        "profile": stats.profile,
        "model_id": stats.model_id,
        "uptime_s": max(stats.at - stats.started_at, 0.0) if stats.started_at else 0.0,
        "memory": {
            "devices": [_device(d) for d in stats.devices],
            "host": {"total": host.total, "used": host.used, "process_rss": host.process_rss,
                     "process_cpu_percent": host.process_cpu,
                     "machine_cpu_percent": host.machine_cpu, "cpus": host.cpus,
                     "pinned_experts": host.pinned_experts,
                     "pinned_kv_tier": host.pinned_kv_tier,
                     "pinned_state_tier": host.pinned_state_tier},
        },
        "kv": {
            "page_tokens": kv.page_tokens, "dtype": kv.dtype, "total": kv.total, "used": kv.used,
            "free": kv.free, "lent": kv.lent, "cached": kv.cached,
            "requests": [{"id": rid, "pages": pages} for rid, pages in kv.per_request],
        },
        "state_slots": asdict(stats.state_slots),
        "prefix_tree": asdict(stats.prefix),
        "experts": None if experts is None else {
            "slots": experts.slots, "resident": experts.resident, "hits": experts.hits,
            "misses": experts.misses, "lent_pages": experts.lent_pages,
            "cpu_share": experts.cpu_share, "routed": experts.experts,
            "active": experts.active, "layers": experts.layers, "cached": experts.cached,
            "bytes_copied": experts.bytes_copied, "cpu_layers": experts.cpu_layers,
        },
        "spec": None if spec is None else {
            "backend": spec.backend, "draft_tokens": spec.window, "rounds": spec.rounds,
            "drafted": spec.drafted, "accepted": spec.accepted,
            "accepted_per_position": list(spec.per_position),
            "tokens_per_round": spec.tokens_per_round,
        },
        "vision": None if stats.vision is None else asdict(stats.vision),
        "queue": {
            "pending": [{"id": r.id, "phase": r.phase, "wait_ms": round(r.waited_s * 1000)}
                        for r in queue.pending],
            "running": [{"id": r.id, "phase": r.phase, "prompt_tokens": r.prompt_tokens,
                         "output_tokens": r.output_tokens, "tok_s": r.tok_s}
                        for r in queue.running],
        },
        "throughput": {"decode_tok_s": stats.throughput.decode_tok_s,
                       "prefill_tok_s": stats.throughput.prefill_tok_s},
        "latency": asdict(stats.latency),
        # the engine's monotonic totals since it started (the throughput lines' sources)
        "counters": asdict(stats.counters),
    }


async def engine_state(request: web.Request) -> web.Response:
    return web.json_response(engine_state_document(request.app[ENGINE].snapshot()))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/engine/state", engine_state)
