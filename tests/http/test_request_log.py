"""`--request-log-jsonl` (§9): one JSON object per event, one terminal event per request."""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fake_engine import FAKE_CONFIG, FakeEngine, Script
from ninfer_engine.cli.capabilities import Machine, check_features
from ninfer_engine.cli.flags import parse_args
from ninfer_engine.stats import EngineStats
from ninfer_engine.types import EngineError, Timings
from ninfer_http.request_log import RequestLog, redact_argv, speculative
from sample_stats import busy_stats
from test_disconnect import open_chat, read_until

KEY = "sk-request-log-SECRET"
PROMPT = "PROMPT-TEXT-never-logged"
PIECES = ("OUTPUT-ONE", "OUTPUT-TWO")
TERMINAL = ("request_done", "request_error", "request_rejected")


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for(path: Path, predicate, timeout_s: float = 5.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = events(path)
        if predicate(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def test_events_in_order_one_terminal_each_and_nothing_secret(serve, tmp_path):
    path = tmp_path / "requests.jsonl"
    engine = FakeEngine(Script(pieces=PIECES, stop_sequence="STOP-TEXT", cached_tokens=2))
    live = serve(engine, api_key=KEY, request_log_jsonl=path)
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "fake-model", "messages": [{"role": "user", "content": PROMPT}]}

    def chat(**fields):
        return live.request("POST", "/v1/chat/completions", {**body, **fields},
                            {**auth, "X-Ninfer-Client": "tests/log"})

    assert chat().status == 200
    assert chat(stream=True).status == 200
    assert chat(model="other").status == 404
    engine.script = Script(reject=EngineError("busy", "server_overloaded", 429))
    assert chat().status == 429
    engine.script = Script(pieces=PIECES, fail=EngineError("device lost", "internal_error"))
    assert chat(stream=True).status == 200  # the failure is in-band
    engine.script = Script(pieces=PIECES)
    anthropic = {"model": "any", "max_tokens": 16,
                 "messages": [{"role": "user", "content": PROMPT}]}
    assert live.request("POST", "/v1/messages", anthropic, auth).status == 200

    log = events(path)
    start, *rest = log
    assert start["event"] == "server_start"
    assert start["artifact_type"] == "ninfer_serve_request_log"
    assert start["schema_version"] == 1
    assert start["config"]["api_key"] == "<redacted>"
    assert start["config"]["request_log_jsonl"] == str(path)
    assert start["argv"] is None  # this app was not given the CLI's argv
    instance = start["server_instance_id"]
    for event in log:
        assert event["server_instance_id"] == instance
        assert isinstance(event["timestamp_unix_ms"], int)
    assert [e["timestamp_unix_ms"] for e in log] == sorted(e["timestamp_unix_ms"] for e in log)

    by_id: dict[int, list[str]] = {}
    for event in rest:
        if event["id"] is not None:
            by_id.setdefault(event["id"], []).append(event["event"])
    assert len(by_id) == 5  # every prepared request; the 404 never got an id
    for kinds in by_id.values():
        assert kinds[0] == "request_start" and len(kinds) == 2 and kinds[1] in TERMINAL
    ids = sorted(by_id)
    assert [by_id[i][1] for i in ids] == ["request_done", "request_done", "request_rejected",
                                          "request_error", "request_done"]

    first_start = next(e for e in rest if e["event"] == "request_start")
    assert first_start["protocol"] == "openai-chat" and first_start["client"] == "tests/log"
    assert first_start["stream"] is False and first_start["message_count"] == 1
    assert first_start["request_id"].startswith("req_")
    done = next(e for e in rest if e["event"] == "request_done")
    assert done["result"]["finish_reason"] == "stop"
    assert done["result"]["stop_sequence_matched"] is True
    assert done["result"]["completion_tokens"] == 2
    assert done["result"]["prefix_cache_hit_tokens"] == 2
    seconds = done["timings_seconds"]
    assert 0 <= seconds["prepare"] <= seconds["total"]
    # TTFT is the engine's figure from arrival (queue wait + prefill), as everywhere else
    timings = Script().timings
    assert seconds["ttft"] == round(timings.queue_s + timings.prefill_s, 6)
    # the scripted engine's times are made up; this process's receipt of the first token is not
    assert seconds["prepare"] <= seconds["first_output"] <= seconds["total"]
    unprepared = next(e for e in rest if e["event"] == "request_rejected" and e["id"] is None)
    assert unprepared["status"] == 404 and unprepared["code"] == "model_not_found"
    assert unprepared["param"] == "model" and unprepared["type"] == "invalid_request_error"
    refused = next(e for e in rest if e["event"] == "request_rejected" and e["id"] is not None)
    assert (refused["status"], refused["type"], refused["code"]) == (
        429, "rate_limit_error", "server_overloaded")
    failed = next(e for e in rest if e["event"] == "request_error")
    assert (failed["status"], failed["code"], failed["outcome"]) == (500, "internal_error",
                                                                     "failed")
    last_start = next(e for e in rest if e["id"] == ids[-1])
    assert last_start["protocol"] == "anthropic"

    text = path.read_text()
    for secret in (KEY, PROMPT, "STOP-TEXT", *PIECES):
        assert secret not in text


def test_disconnect_is_a_request_error(serve, tmp_path):
    path = tmp_path / "requests.jsonl"
    live = serve(FakeEngine(Script(pieces=("first",), hang=True)), request_log_jsonl=path)
    sock = open_chat(live, stream=True)
    read_until(sock, b'"content": "first"')
    sock.close()
    log = wait_for(path, lambda found: found[-1]["event"] == "request_error")
    assert [e["event"] for e in log] == ["server_start", "request_start", "request_error"]
    assert log[-1]["outcome"] == "cancelled" and log[-1]["phase"] == "decode"
    assert (log[-1]["status"], log[-1]["code"]) == (499, "client_disconnected")


def test_throughput_events_carry_engine_stats(serve, tmp_path):
    path = tmp_path / "requests.jsonl"
    engine = FakeEngine()
    calls = iter(range(1_000_000))

    def busy_second() -> EngineStats:
        """Each snapshot one second after the last, with one second's worth of work in it."""
        n, stats = next(calls), busy_stats()
        return replace(stats, at=stats.started_at + n,
                       counters=replace(stats.counters, decode_tokens=41 * n,
                                        prefill_tokens=2048 * n, steps=2 * n, batch_rows=3 * n))

    engine.snapshot = busy_second
    serve(engine, request_log_jsonl=path, log_stats_interval_ms=20)
    log = wait_for(path, lambda found: len(found) >= 3)
    assert log[0]["event"] == "server_start"
    assert log[0]["memory"]["devices"][0]["name"] == "cuda:0"
    assert log[0]["gpu_environment"]["devices"] == ["cuda:0", "cuda:1"]
    tp = log[1]
    assert tp["event"] == "throughput"
    # other observers take snapshots too: an event spans a whole number of the fake's seconds
    seconds = tp["interval_s"]
    assert seconds >= 1 and (tp["decode_tokens"], tp["prefill_tokens"]) == (41 * seconds,
                                                                          2048 * seconds)
    assert (tp["decode_tok_s"], tp["prefill_tok_s"], tp["batch_avg"]) == (41.0, 2048.0, 1.5)
    assert tp["scheduler"] == {"running": 2, "prefilling": 1, "decode_ready": 1, "waiting": 1}
    assert tp["cache"] == {"prefix_cache_queries": 20000, "prefix_cache_hits": 12000}
    assert tp["kv"]["lent"] == 50 and tp["experts"]["cpu_share"] == 0.18
    assert tp["spec"]["acceptance"] == 0.68


def test_idle_intervals_are_skipped(serve, tmp_path):
    path = tmp_path / "requests.jsonl"
    serve(request_log_jsonl=path, log_stats_interval_ms=10)
    time.sleep(0.2)
    assert [e["event"] for e in events(path)] == ["server_start"]


def test_appends_across_restarts(serve, tmp_path):
    path = tmp_path / "requests.jsonl"
    first = serve(request_log_jsonl=path)
    second = serve(request_log_jsonl=path)
    assert first.chat().status == 200 and second.chat().status == 200
    starts = [e for e in events(path) if e["event"] == "server_start"]
    assert len(starts) == 2 and starts[0]["server_instance_id"] != starts[1]["server_instance_id"]


def test_the_flag_passes_the_feature_check(tmp_path):
    parsed = parse_args(["m.ninfer", "--request-log-jsonl", str(tmp_path / "requests.jsonl")])
    check_features(parsed.config, parsed.explicit, Machine(cuda_devices=0))


def test_unwritable_log_fails_startup(serve, tmp_path):
    with pytest.raises(OSError, match=f"cannot open --request-log-jsonl {tmp_path}: "):
        serve(request_log_jsonl=tmp_path)  # a directory


def test_server_start_argv_is_redacted(tmp_path):
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path)
    argv = ["model.ninfer", "--api-key", KEY, "--port", "9000", f"--api-key={KEY}"]
    log.server_start(FAKE_CONFIG, argv, busy_stats())
    log.close()
    [start] = events(path)
    assert start["argv"] == ["model.ninfer", "--api-key", "<redacted>", "--port", "9000",
                             "--api-key=<redacted>"]
    assert KEY not in path.read_text()
    assert redact_argv(["--no-tui", f"x{KEY}"], KEY) == ["--no-tui", "<redacted>"]


def test_speculative_record_counts_rounds_positions_and_detail():
    t = Timings(draft_n=9, draft_accepted=5, draft_rounds=(3, 0, 2), draft_fallback=4)
    record = speculative(t, "ngram", 3)
    assert record == {"backend": "ngram", "draft_window": 3, "rounds": 3, "drafted_tokens": 9,
                      "accepted_tokens": 5, "acceptance": round(5 / 9, 6),
                      "tokens_per_round": round(1 + 5 / 3, 6), "fallback_steps": 4,
                      "accepted_per_position": [2, 2, 1]}
    detail = speculative(replace(t, prompt_ngram_overlap=0.25), "ngram", 3)
    assert detail["round_accepted"] == [3, 0, 2] and detail["prompt_ngram_overlap"] == 0.25
    idle = speculative(Timings(draft_fallback=2), "mtp", 3)
    assert (idle["rounds"], idle["acceptance"], idle["tokens_per_round"]) == (0, None, None)
