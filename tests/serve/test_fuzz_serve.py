"""Seeded fuzzing of the real `ninfer-serve --no-tui` (tests/serve/fuzz_bodies.py): on the
default model (the llama family, the CPU's compiled step) and on a tiny synthetic hybrid with
the real Qwen tokenizer and a random MTP head served with `--spec mtp`. Every answer is the
protocol's own (no 5xx, no in-band error in a stream: a malformed request is a 4xx in its
protocol's shape, tests/http check which), and the engine is ready afterwards with no KV page
held. Slow (300 requests each, ~80 s for both on the 2-core box):
`pytest -m slow tests/serve/test_fuzz_serve.py`."""
from __future__ import annotations

import json
import random

import pytest
from fuzz_bodies import bodies
from server_process import MODEL_ID, NEEDS_MODEL

from ninfer_engine.artifact.synth import write_synthetic

REQUESTS = 300
FAILED = (b"event: error", b'"type": "error"', b"internal_error", b"api_error")


def _fuzz(server, model: str, seed: int) -> None:
    bad = []
    for path, body in bodies(random.Random(seed), model, REQUESTS):
        status, _, raw = server.request("POST", path, body, timeout=180)
        ok = status < 500 and (status >= 400 or not any(m in raw for m in FAILED))
        if not ok:
            bad.append((path, json.dumps(body)[:300], status, raw[-300:]))
    assert not bad, bad[:5]
    status, state = server.get("/engine/state")
    assert status == 200 and state["state"] == "ready", state
    assert state["kv"]["used"] == 0 and not state["kv"]["requests"], state["kv"]


@pytest.mark.slow
@NEEDS_MODEL[0]
@NEEDS_MODEL[1]
def test_the_default_model_answers_every_fuzzed_request_in_its_protocol(launch):
    server = launch("--model-id", MODEL_ID, "--max-concurrency", "2").wait_ready()
    _fuzz(server, MODEL_ID, seed=1)


@pytest.mark.slow
def test_a_qwen_hybrid_with_mtp_answers_every_fuzzed_request_in_its_protocol(launch,
                                                                              tmp_path):
    model = write_synthetic("tiny-moe", tmp_path / "tiny.ninfer", mtp=True)
    server = launch("--model-id", MODEL_ID, "--max-concurrency", "2", "--spec", "mtp",
                    "--draft-tokens", "3", model=model).wait_ready()
    _fuzz(server, MODEL_ID, seed=2)
