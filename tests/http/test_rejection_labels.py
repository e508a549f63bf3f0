"""Generation requests refused before preparation are labelled by protocol in the request log
and counted in `/metrics`, on every generation route (issue 24: `/v1/completions` was not)."""
from __future__ import annotations

from fake_engine import FAKE_CONFIG, FakeEngine
from ninfer_http.app import create_app
from ninfer_http.completions_request import PROTOCOL as COMPLETIONS_PROTOCOL
from ninfer_http.observers import GENERATION_PATHS
from test_metrics import scrape, value
from test_request_log import events

BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}]},
    "/v1/completions": {"prompt": "Hi", "max_tokens": 4},
    "/v1/responses": {"input": "Hi"},
    "/v1/messages": {"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
}
# POST routes that never generate (token counts, cancel, compaction refused): nothing to label
NOT_GENERATION = {"/v1/messages/count_tokens", "/v1/responses/input_tokens",
                  "/v1/responses/compact", "/v1/responses/{response_id}/cancel",
                  "/v1/responses/{response_id}/compact"}


def test_every_generation_route_has_a_protocol():
    app = create_app(FakeEngine(), FAKE_CONFIG)
    posts = {r.resource.canonical for r in app.router.routes() if r.method == "POST"}
    assert posts - NOT_GENERATION == set(GENERATION_PATHS)
    assert GENERATION_PATHS["/v1/completions"] == COMPLETIONS_PROTOCOL


def test_refusals_before_preparation_are_labelled_on_every_route(serve, tmp_path):
    path = tmp_path / "requests.jsonl"
    live = serve(FakeEngine(), request_log_jsonl=path)
    before = scrape(live)
    replies = {}
    for route, body in BODIES.items():
        reply = live.request("POST", route, {**body, "model": "fake-model", "temperature": "hot"})
        assert 400 <= reply.status < 500, (route, reply.body)
        replies[route] = reply
    after = scrape(live)

    refused = {e["protocol"]: e for e in events(path) if e["event"] == "request_rejected"}
    assert set(refused) == {GENERATION_PATHS[route] for route in BODIES}
    for route, reply in replies.items():
        event = refused[GENERATION_PATHS[route]]
        assert event["id"] is None and event["phase"] == "prepare"
        assert (event["status"], event["type"]) == (reply.status, reply.json()["error"]["type"])
        assert event["code"], event  # Anthropic bodies carry no code; the log and /metrics do
    codes = [e["code"] for e in refused.values()]
    for code in set(codes):
        counted = (value(after, "ninfer:requests_rejected_total", code=code)
                   - value(before, "ninfer:requests_rejected_total", code=code))
        assert counted == codes.count(code), code
