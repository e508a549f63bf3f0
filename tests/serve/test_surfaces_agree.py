"""One scripted load against the real `ninfer-serve` of the default model (issue 24): the
figures in the stderr log lines, the JSONL request log, `/metrics` and `/engine/state` must
agree with each other and with what the clients received.

Agreement is checked per request (by the `x-request-id` / `request-id` header: tokens, cached
tokens, queue wait and TTFT within the rounding each surface prints) and in total (finished
requests, refusals by code, prompt / output / cached tokens, TTFT and e2e sums, the latency
percentiles, the throughput lines' token sums against the engine's step counters).
"""
from __future__ import annotations

import asyncio
import json
import math
import re
from collections import Counter
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from server_process import MODEL_ID, NEEDS_MODEL

pytestmark = NEEDS_MODEL

INTERVAL_MS = 400
TIMEOUT = aiohttp.ClientTimeout(total=120)
# the stderr line prints milliseconds with no decimals, the request log seconds to 1 µs
MS_ROUNDING = 0.5 + 1e-3
LOG_ROUNDING_S = 0.5e-6


def chat(content: str, max_tokens: int, **extra: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {
        "model": MODEL_ID, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": content}], **extra}


# over one 64-token KV page; the follow-up turn (built from the reply) reuses its prefix
NOTES = "Notes: apples are red, bananas are yellow, grapes are purple, limes are green. " * 4
FIRST = chat(NOTES + "Name a fruit.", 4)
SCRIPT = [  # after FIRST and its follow-up
    ("/v1/completions", {"model": MODEL_ID, "prompt": "The sea is", "max_tokens": 3,
                         "temperature": 0}),
    ("/v1/messages", {"model": MODEL_ID, "max_tokens": 3, "temperature": 0,
                      "messages": [{"role": "user", "content": "Say hello."}]}),
]
TOGETHER = [chat("What is 2+2?", 3), chat("List three colors.", 3)]  # one waits (concurrency 1)
REFUSED = [chat("Hi", 3, model="no-such-model"),
           ("/v1/completions", {"model": MODEL_ID, "prompt": "Hi", "temperature": "hot"})]


async def send(session: aiohttp.ClientSession, url: str, path: str,
               body: dict[str, Any]) -> dict[str, Any]:
    """Status, request id and usage (prompt, output, cached tokens) of one request."""
    async with session.post(url + path, json=body) as response:
        rid = response.headers.get("x-request-id") or response.headers.get("request-id")
        got: dict[str, Any] = {"status": response.status, "id": rid, "path": path}
        if body.get("stream"):
            usage = None
            async for raw in response.content:
                line = raw.decode().strip()
                if line.startswith("data: {"):
                    usage = json.loads(line[6:]).get("usage") or usage
        else:
            reply = await response.json()
            usage = reply.get("usage")
            got["error"] = reply.get("error")
            got["reply"] = reply.get("choices", [{}])[0].get("message", {}).get("content")
    if usage is not None and "input_tokens" in usage:  # Anthropic: input excludes cache reads
        cached = usage.get("cache_read_input_tokens") or 0
        got["tokens"] = (usage["input_tokens"] + cached, usage["output_tokens"], cached)
    elif usage is not None:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        got["tokens"] = (usage["prompt_tokens"], usage["completion_tokens"], cached)
    return got


async def get_json(session: aiohttp.ClientSession, url: str, path: str) -> Any:
    async with session.get(url + path) as response:
        return await response.json()


async def scenario(url: str) -> tuple[list[dict], dict, str]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        first = await send(session, url, *FIRST)
        path, body = FIRST
        turns = [*body["messages"], {"role": "assistant", "content": first["reply"]},
                 {"role": "user", "content": "Another one?"}]
        follow_up = {**body, "messages": turns, "max_tokens": 5, "stream": True,
                     "stream_options": {"include_usage": True}}
        results = [first, await send(session, url, path, follow_up)]
        results += [await send(session, url, path, body) for path, body in SCRIPT]
        results += await asyncio.gather(*(send(session, url, p, b) for p, b in TOGETHER))
        results += [await send(session, url, path, body) for path, body in REFUSED]
        for _ in range(200):
            state = await get_json(session, url, "/engine/state")
            if not state["queue"]["pending"] and not state["queue"]["running"]:
                break
            await asyncio.sleep(0.05)
        async with session.get(url + "/metrics") as response:
            metrics = await response.text()
        return results, state, metrics


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((f"ninfer:{name}", tuple(sorted(labels.items()))), 0.0)


def number(text: str) -> int:
    return int(text.replace(",", ""))


def stderr_requests(log: str) -> dict[str, dict[str, float]]:
    """The `req#N done` figures of each request, keyed by the id its `started` line names."""
    ids = dict(re.findall(r"req#(\d+) started \|.*\| id (\S+)$", log, re.M))
    found = {}
    for n, line in re.findall(r"req#(\d+) done \| (.*)$", log, re.M):
        figures = {"prompt": number(re.search(r"\| prompt ([\d,]+)", line)[1]),
                   "output": number(re.search(r"\| output ([\d,]+)", line)[1]),
                   "queue_ms": float(re.search(r"\| queue (\d+) ms", line)[1]),
                   "ttft_ms": float(re.search(r"\| TTFT (\d+) ms", line)[1])}
        cache = re.search(r"\| cache ([\d,]+) ", line)
        figures["cached"] = number(cache[1]) if cache else 0
        found[ids[n]] = figures
    return found


def stderr_throughput(log: str) -> tuple[int, int]:
    decode = prefill = 0
    for line in re.findall(r"  throughput \| (.*)$", log, re.M):
        decode += number(re.search(r"decode [\d.]+ tok/s \(([\d,]+) tok\)", line)[1])
        got = re.search(r"prefill [\d.]+ tok/s \(([\d,]+) tok\)", line)
        prefill += number(got[1]) if got else 0
    return decode, prefill


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(len(ordered) * q)) - 1]


def test_log_request_log_metrics_and_engine_state_agree(launch, tmp_path):
    request_log = tmp_path / "requests.jsonl"
    server = launch("--max-concurrency", "1", "--log-stats-interval-ms", str(INTERVAL_MS),
                    "--request-log-jsonl", str(request_log)).wait_ready()
    results, state, metrics_text = asyncio.run(asyncio.wait_for(scenario(server.url), 240))
    served = [r for r in results if r["status"] == 200]
    refused = [r for r in results if r["status"] != 200]
    assert len(served) == 2 + len(SCRIPT) + len(TOGETHER) and len(refused) == len(REFUSED), results
    assert all(r["id"] and "tokens" in r for r in served), served

    counters = state["counters"]
    # the throughput lines cover every step once the interval after the last token is written
    for _ in range(50):
        events = [json.loads(line) for line in request_log.read_text().splitlines()]
        log = server.log()
        jsonl_tp = [e for e in events if e["event"] == "throughput"]
        if (sum(e["decode_tokens"] for e in jsonl_tp) >= counters["decode_tokens"]
                and stderr_throughput(log)[0] >= counters["decode_tokens"]):
            break
        asyncio.run(asyncio.sleep(INTERVAL_MS / 1000))
    metrics = samples(metrics_text)
    lines = stderr_requests(log)
    request_ids = {e["id"]: e["request_id"] for e in events if e["event"] == "request_start"}
    done = {request_ids[e["id"]]: e for e in events if e["event"] == "request_done"}

    # per request: the client, the stderr line and the request log
    assert set(lines) == set(done) == {r["id"] for r in served}
    for r in served:
        line, event = lines[r["id"]], done[r["id"]]
        result, seconds = event["result"], event["timings_seconds"]
        logged = (result["prompt_tokens"], result["completion_tokens"],
                  result["prefix_cache_hit_tokens"])
        assert r["tokens"] == logged == (line["prompt"], line["output"], line["cached"]), r
        # a hit names its reuse path (the llama family: an earlier prompt's or answer's pages)
        hit = result["prefix_cache_hit_tokens"] > 0
        assert result["prefix_reuse_path"] in (
            ("shared_stable_prefix", "private_endpoint") if hit else ("root",)), result
        assert abs(line["ttft_ms"] - seconds["ttft"] * 1000) <= MS_ROUNDING, (line, seconds)
        queue_s = event["engine_timing"]["queue_wait_seconds"]
        assert abs(line["queue_ms"] - queue_s * 1000) <= MS_ROUNDING, (line, event)
        assert seconds["ttft"] >= queue_s  # TTFT counts from arrival, the queue wait included
    assert max(e["engine_timing"]["queue_wait_seconds"] for e in done.values()) > min(
        e["timings_seconds"]["prefill"] for e in done.values()) / 2, "one request waited"

    # totals: requests
    n = len(served)
    finishes = Counter(e["result"]["finish_reason"] for e in done.values())
    totals = dict(state["latency"]["totals"])
    for reason, count in finishes.items():
        assert value(metrics, "request_success_total", finish_reason=reason) == count
        assert totals[reason] == count
    assert sum(finishes.values()) == n == counters["requests_done"]
    assert value(metrics, "time_to_first_token_seconds_count") == n
    assert state["latency"]["ttft"]["n"] == n
    # totals: refusals by code (stderr has no line for a request refused before preparation)
    rejected = Counter(e["code"] for e in events if e["event"] == "request_rejected")
    assert sum(rejected.values()) == len(REFUSED)
    assert {e["protocol"] for e in events if e["event"] == "request_rejected"} == {
        "openai-chat", "openai-completions"}
    for code, count in rejected.items():
        assert value(metrics, "requests_rejected_total", code=code) == count
        assert totals[code] == count

    # totals: tokens
    usage = [r["tokens"] for r in served]
    assert value(metrics, "prompt_tokens_total") == sum(u[0] for u in usage)
    assert value(metrics, "generation_tokens_total") == sum(u[1] for u in usage)
    assert value(metrics, "prefix_cache_hits_total") == sum(u[2] for u in usage)
    assert counters["generation_tokens"] == sum(u[1] for u in usage)
    computed = sum(e["result"]["computed_prefill_tokens"] for e in done.values())
    assert counters["prefill_tokens"] == computed
    # the engine's token totals are /metrics' (same names, same units: tokens)
    for name in ("prompt_tokens", "generation_tokens", "prefix_cache_queries",
                 "prefix_cache_hits"):
        assert counters[name] == value(metrics, f"{name}_total"), name
    assert counters["prompt_tokens"] == sum(u[0] for u in usage)
    assert sum(u[0] for u in usage) - sum(u[2] for u in usage) == computed
    assert any(u[2] for u in usage), "the repeated prefix was served from the cache"
    # the throughput lines (stderr and request log) add up to the engine's step counters
    assert stderr_throughput(log) == (counters["decode_tokens"], counters["prefill_tokens"])
    assert (sum(e["decode_tokens"] for e in jsonl_tp),
            sum(e["prefill_tokens"] for e in jsonl_tp)) == (counters["decode_tokens"],
                                                            counters["prefill_tokens"])

    # latency: /metrics sums and the ledger's percentiles are the request log's figures
    ttfts = [e["timings_seconds"]["ttft"] for e in done.values()]
    assert abs(value(metrics, "time_to_first_token_seconds_sum") - sum(ttfts)) <= (
        n * LOG_ROUNDING_S)
    e2e = [e["engine_timing"]["queue_wait_seconds"] + e["timings_seconds"]["prefill"]
           + e["timings_seconds"]["decode"] for e in done.values()]
    assert abs(value(metrics, "e2e_request_latency_seconds_sum") - sum(e2e)) <= 3 * n * (
        LOG_ROUNDING_S)
    for q, key in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99")):
        want = nearest_rank(ttfts, float(q))
        assert abs(state["latency"]["ttft"][key] - want) <= LOG_ROUNDING_S, (key, state)
        assert abs(value(metrics, "request_latency_window_seconds", kind="ttft", quantile=q)
                   - want) <= LOG_ROUNDING_S
    assert "Traceback" not in log
