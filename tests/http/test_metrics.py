"""`GET /metrics` (§12): Prometheus text, `ninfer:` names, counters fed by finished requests."""
from __future__ import annotations

import torch
from prometheus_client.parser import text_string_to_metric_families

from fake_engine import FakeEngine, Script
from ninfer_engine.types import EngineError, Timings
from sample_stats import GIB, busy_stats
from tests.tolerance import gamma


def scrape(live, headers=None) -> dict[tuple[str, tuple], float]:
    """Every sample as {(name, sorted labels): value}; asserts the text parses and is prefixed."""
    reply = live.request("GET", "/metrics", headers=headers)
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        assert family.name.startswith("ninfer:"), family.name
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_and_histograms_move_with_requests(serve):
    engine = FakeEngine(Script(cached_tokens=3, timings=Timings(decode_s=0.6, predicted_n=4)))
    live = serve(engine)
    before = scrape(live)
    assert value(before, "ninfer:request_success_total", finish_reason="stop") == 0
    assert live.chat().status == 200
    assert live.chat(stream=True).status == 200
    assert live.chat(model="other").status == 404  # rejected before preparation
    engine.script = Script(reject=EngineError("busy", "server_overloaded", 429))
    assert live.chat().status == 429  # rejected by the engine, after preparation
    engine.script = Script(finish="length")
    assert live.chat(max_tokens=4).status == 200
    prompt = sum(len(r.prompt_ids) for r in engine.submitted if r is not engine.submitted[2])

    after = scrape(live)
    assert value(after, "ninfer:request_success_total", finish_reason="stop") == 2
    assert value(after, "ninfer:request_success_total", finish_reason="length") == 1
    assert value(after, "ninfer:requests_rejected_total", code="model_not_found") == 1
    assert value(after, "ninfer:requests_rejected_total", code="server_overloaded") == 1
    assert value(after, "ninfer:prompt_tokens_total") == prompt
    assert value(after, "ninfer:generation_tokens_total") == 12  # three replies of 4 pieces
    assert value(after, "ninfer:prefix_cache_queries_total") == prompt
    assert value(after, "ninfer:prefix_cache_hits_total") == 6  # two scripts with 3 cached
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert value(after, f"ninfer:{name}_count") == 3
        assert 0 < value(after, f"ninfer:{name}_sum") < 10
    # One mean per request: 0.6 s over 3 gaps twice, then the default script's 0.03 s over 3.
    assert value(after, "ninfer:inter_token_latency_seconds_count") == 3
    assert value(after, "ninfer:inter_token_latency_seconds_bucket", le="0.15") == 1
    # fp64: three divisions, two adds and the literal 0.41 itself, each one rounding (the text
    # exposition prints repr, which reads back exactly)
    itl_sum = value(after, "ninfer:inter_token_latency_seconds_sum")
    assert abs(itl_sum - 0.41) <= gamma(torch.float64, 6) * 0.41


def test_snapshot_gauges_and_engine_totals(serve):
    engine = FakeEngine()
    engine.snapshot = busy_stats
    samples = scrape(serve(engine))
    assert value(samples, "ninfer:num_requests_running") == 2
    assert value(samples, "ninfer:num_requests_waiting") == 1
    assert value(samples, "ninfer:kv_pages_total") == 400
    assert value(samples, "ninfer:kv_pages_used") == 100
    assert value(samples, "ninfer:kv_pages_lent") == 50
    assert value(samples, "ninfer:kv_cache_usage_perc") == 0.25
    assert value(samples, "ninfer:state_slots_total", kind="running") == 4
    assert value(samples, "ninfer:state_slots_used", kind="running") == 2
    assert value(samples, "ninfer:state_slots_used", kind="checkpoint") == 3
    assert value(samples, "ninfer:prefix_checkpoints") == 3
    assert value(samples, "ninfer:prefix_tree_pages") == 120
    assert value(samples, "ninfer:prefix_tree_snapshots") == 3
    assert value(samples, "ninfer:prefix_tree_evicted_pages_total") == 7
    assert value(samples, "ninfer:prefix_host_pages") == 40
    assert value(samples, "ninfer:prefix_host_pages_total") == 128
    assert value(samples, "ninfer:prefix_host_snapshots") == 5
    assert value(samples, "ninfer:prefix_host_restored_pages_total") == 33
    assert value(samples, "ninfer:expert_cache_slots") == 384
    assert value(samples, "ninfer:expert_cache_resident") == 371
    assert value(samples, "ninfer:expert_cache_lent_pages") == 50
    assert value(samples, "ninfer:expert_cpu_share") == 0.18
    assert value(samples, "ninfer:expert_cpu_layers") == 5
    assert value(samples, "ninfer:expert_cache_hits_total") == 9000
    assert value(samples, "ninfer:expert_cache_misses_total") == 1000
    assert value(samples, "ninfer:expert_cache_cached") == 371
    assert value(samples, "ninfer:expert_copied_bytes_total") == 3 * 2**30
    assert value(samples, "ninfer:spec_decode_num_drafts_total") == 1000
    assert value(samples, "ninfer:spec_decode_num_draft_tokens_total") == 3000
    assert value(samples, "ninfer:spec_decode_num_accepted_tokens_total") == 2040
    per_pos = [value(samples, "ninfer:spec_decode_num_accepted_tokens_per_pos_total",
                     position=str(i)) for i in range(3)]
    assert per_pos == [840, 680, 520]
    assert value(samples, "ninfer:device_memory_bytes", device="cuda:1",
                 category="weights") == 9 * GIB
    assert value(samples, "ninfer:device_memory_bytes", device="cuda:0", category="free") == GIB
    states = {s: value(samples, "ninfer:engine_state", state=s)
              for s in ("loading", "ready", "failed", "reloading")}
    assert states == {"loading": 0, "ready": 1, "failed": 0, "reloading": 0}


def test_optional_series_are_absent_without_experts_or_speculation(live):
    names = {name for name, _ in scrape(live)}
    assert "ninfer:kv_cache_usage_perc" in names  # 0 pages: 0, not a division error
    assert not any(n.startswith(("ninfer:expert_", "ninfer:spec_decode_")) for n in names)


def test_observer_endpoints_need_the_key_when_set(serve):
    live = serve(api_key="sk-metrics")
    for path in ("/metrics", "/engine/state", "/openapi.json"):
        reply = live.request("GET", path)
        assert reply.status == 401
        assert reply.json()["error"]["code"] == "invalid_api_key"
        assert live.request("GET", path, headers={"x-api-key": "sk-metrics"}).status == 200
    scrape(live, headers={"Authorization": "Bearer sk-metrics"})
