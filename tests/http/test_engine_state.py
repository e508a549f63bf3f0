"""`GET /engine/state` (§12): the latest `EngineStats` snapshot as JSON, figures only."""
from __future__ import annotations

from dataclasses import replace

from fake_engine import FakeEngine
from sample_stats import GIB, busy_stats


def test_busy_snapshot_document(serve):
    engine = FakeEngine()
    engine.snapshot = busy_stats
    doc = serve(engine).request("GET", "/engine/state").json()
    assert doc["state"] == "ready" and doc["failure"] is None and doc["admission"] == "open"
    assert doc["profile"] == "flash-next" and doc["model_id"] == "fake-model"
    assert 119.0 <= doc["uptime_s"] <= 121.0
    [gpu0, gpu1] = doc["memory"]["devices"]
    assert gpu1["name"] == "cuda:1" and gpu1["total"] == 16 * GIB
    assert gpu0["categories"] == {"weights": 9 * GIB, "kv_pool": 3 * GIB,
                                  "expert_slots": 2 * GIB, "workspace": GIB, "free": GIB}
    assert doc["kv"] == {"page_tokens": 64, "dtype": "int8", "total": 400, "used": 100,
                         "free": 300, "lent": 50, "cached": 0,
                         "requests": [{"id": "req_a", "pages": 60}, {"id": "req_b", "pages": 40}]}
    assert doc["prefix_tree"]["pages"] == 120 and doc["prefix_tree"]["hit_tokens"] == 5000
    assert doc["state_slots"] == {"running_total": 4, "running_used": 2, "checkpoint_total": 4,
                                  "checkpoint_used": 3, "checkpoints": 3}
    assert doc["experts"] == {"slots": 384, "resident": 371, "hits": 9000, "misses": 1000,
                              "lent_pages": 50, "cpu_share": 0.18, "routed": 0, "active": 0,
                              "layers": 0, "cached": 371, "bytes_copied": 3 * 2**30,
                              "cpu_layers": 5}
    assert doc["spec"] == {"backend": "mtp", "draft_tokens": 3, "rounds": 1000, "drafted": 3000,
                           "accepted": 2040, "accepted_per_position": [0.84, 0.68, 0.52],
                           "tokens_per_round": 3.04}
    assert doc["queue"] == {
        "pending": [{"id": "req_c", "phase": "queued", "wait_ms": 250}],
        "running": [{"id": "req_a", "phase": "decode", "prompt_tokens": 3000,
                     "output_tokens": 800, "tok_s": 41.5},
                    {"id": "req_b", "phase": "prefill", "prompt_tokens": 2500,
                     "output_tokens": 0, "tok_s": 0.0}]}
    assert doc["throughput"] == {"decode_tok_s": 41.5, "prefill_tok_s": 2048.0}


def test_dense_model_without_speculation(live):
    doc = live.request("GET", "/engine/state").json()
    assert doc["state"] == "ready"
    assert doc["experts"] is None and doc["spec"] is None
    assert doc["queue"] == {"pending": [], "running": []}
    assert doc["uptime_s"] == 0.0  # the fake snapshot has no start time


def test_failed_engine_reports_its_failure(serve):
    engine = FakeEngine()
    engine.snapshot = lambda: replace(busy_stats("failed"), failure="step loop broke")
    reply = serve(engine).request("GET", "/engine/state")
    assert reply.status == 200  # the admin view stays up while generation answers 503
    assert reply.json()["state"] == "failed"
    assert reply.json()["failure"] == "step loop broke"
