"""bench/ttft_burst_table.py: a run's server side comes from its own span of the request log."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from ttft_burst_table import markdown, ratios, server_side  # noqa: E402


def _done(at_ms: int, ttft: float, queue: float) -> dict:
    return {"event": "request_done", "timestamp_unix_ms": at_ms,
            "timings_seconds": {"prepare": 0.001, "ttft": ttft, "first_output": ttft + 0.002},
            "engine_timing": {"queue_wait_seconds": queue}}


def _burst(label: str, concurrency: int, span: list[int], ttft: float) -> dict:
    return {"label": label, "concurrency": concurrency, "requests": 2, "ok": 2,
            "ttft_median_s": ttft, "ttft_p99_s": ttft, "decode_tok_s_median": 100.0,
            "aggregate_tok_s": 100.0, "cached_prompt_tokens": 0, "span_unix_ms": span}


def test_each_run_takes_the_request_log_lines_of_its_own_span(tmp_path):
    lines = [{"event": "server_start", "timestamp_unix_ms": 0},
             _done(50, 9.0, 0.0),  # the warm-up probe, before the run's span
             _done(1_010, 0.010, 0.001), _done(1_020, 0.012, 0.001),
             _done(2_010, 0.020, 0.004), _done(2_020, 0.030, 0.006)]
    (tmp_path / "requests.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    bursts = [_burst("burst1-1", 1, [1_000, 1_100], 0.012),
              _burst("burst8-1", 8, [2_000, 2_100], 0.031),
              _burst("burst8-1-p4096", 8, [2_000, 2_100], 0.031)]  # its server kept no log
    server_side(bursts, tmp_path)
    assert bursts[0]["server"] == {"requests": 2, "prepare_median_ms": 1.0,
                                   "queue_median_ms": 1.0, "ttft_median_ms": 11.0,
                                   "first_output_median_ms": 13.0}
    assert bursts[1]["server"]["ttft_median_ms"] == 25.0
    assert bursts[1]["server"]["queue_median_ms"] == 5.0
    assert "server" not in bursts[2]
    text = markdown({"meta": dict(title="t", machine="m", date="d", tree="x", command="c"),
                     "bursts": bursts, "ratios": ratios({b["label"]: b for b in bursts})})
    assert "| burst8-1 | 2 | 1.0 | 5.0 | 25.0 | 27.0 |" in text
