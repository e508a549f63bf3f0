"""Every API gives a request without an output limit the engine's `default_max_tokens` (the
flag, else the artifact's generation config, else 8192), and a request's own limit wins."""
from __future__ import annotations

import pytest

from fake_engine import FakeEngine

USER = [{"role": "user", "content": "What is the capital of France?"}]

REQUESTS = {
    "chat": ("/v1/chat/completions", {"model": "fake-model", "messages": USER}, "max_tokens"),
    "chat-completion-tokens": ("/v1/chat/completions", {"model": "fake-model", "messages": USER},
                               "max_completion_tokens"),
    "responses": ("/v1/responses", {"model": "fake-model", "input": "What is the capital of France?"},
                  "max_output_tokens"),
    "messages": ("/v1/messages", {"model": "fake-model", "messages": USER}, "max_tokens"),
}


@pytest.mark.parametrize("api", sorted(REQUESTS))
def test_the_engine_default_applies_and_the_request_wins(serve, api):
    engine = FakeEngine()
    engine.default_max_tokens = 96
    live = serve(engine)
    path, body, field = REQUESTS[api]
    assert live.request("POST", path, body).status == 200
    assert engine.submitted[-1].max_tokens == 96
    assert live.request("POST", path, {**body, field: 7}).status == 200
    assert engine.submitted[-1].max_tokens == 7
