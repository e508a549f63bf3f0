"""Transport contract (§1-§3): health, models, ids, auth, CORS, 404/405, 413, JSON errors."""
from __future__ import annotations

import re

import pytest

from ninfer_engine.types import EngineState

OPENAI_RID = re.compile(r"^req_[0-9a-f]{32}$")
ANTHROPIC_RID = re.compile(r"^req_[0-9a-f]{16}$")
ERROR_KEYS = {"message", "type", "param", "code"}


def openai_error(reply, status: int, code: str | None) -> dict:
    assert reply.status == status, reply.body
    error = reply.json()["error"]
    assert ERROR_KEYS <= set(error)
    assert error["code"] == code
    return error


def test_health_ok_when_ready(live):
    reply = live.request("GET", "/health")
    assert reply.status == 200
    assert reply.json() == {"status": "ok"}


@pytest.mark.parametrize("state", [EngineState.FAILED, EngineState.LOADING, EngineState.RELOADING])
def test_health_and_generation_unavailable_unless_ready(live, state):
    live.engine.current_state = state
    reply = live.request("GET", "/health")
    assert reply.status == 503
    assert reply.json() == {"status": "unavailable"}
    error = openai_error(live.chat(), 503, "service_unavailable")
    assert error["type"] == "server_error"
    assert live.engine.submitted == []


def test_models_list_and_get(live):
    listing = live.request("GET", "/v1/models").json()
    assert listing["object"] == "list"
    [model] = listing["data"]
    assert model["id"] == "fake-model"
    assert model["object"] == "model"
    assert model["owned_by"] == "ninfer"
    assert model["max_model_len"] == 256
    assert isinstance(model["created"], int)
    assert live.request("GET", "/v1/models/fake-model").json() == model


def test_unknown_model_id_is_404(live):
    error = openai_error(live.request("GET", "/v1/models/other/model"), 404, "model_not_found")
    assert error["param"] == "model"


def test_openai_request_id_on_success_error_and_stream(live):
    for reply in (live.request("GET", "/v1/models"), live.request("GET", "/nope"),
                  live.chat(stream=True)):
        assert OPENAI_RID.match(reply.headers["x-request-id"])
    first = live.request("GET", "/health").headers["x-request-id"]
    assert first != live.request("GET", "/health").headers["x-request-id"]


def test_anthropic_paths_use_request_id_and_anthropic_error_shape(serve):
    live = serve(api_key="sekrit")
    reply = live.request("POST", "/v1/messages", {})
    assert reply.status == 401
    rid = reply.headers["request-id"]
    assert ANTHROPIC_RID.match(rid)
    assert "x-request-id" not in reply.headers
    assert reply.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": reply.json()["error"]["message"]},
        "request_id": rid,
    }


def test_unknown_path_and_wrong_method(live):
    error = openai_error(live.request("GET", "/v1/nothing"), 404, "not_found")
    assert error["type"] == "invalid_request_error"
    reply = live.request("GET", "/v1/chat/completions")
    openai_error(reply, 405, "method_not_allowed")
    assert "POST" in reply.headers["allow"]


def test_wrong_method_under_messages_has_anthropic_shape(live):
    reply = live.request("GET", "/v1/messages/nothing")
    assert reply.status == 404
    assert reply.json()["error"]["type"] == "not_found_error"


def test_auth_required_with_key(serve):
    live = serve(api_key="sekrit")
    error = openai_error(live.request("GET", "/v1/models"), 401, "invalid_api_key")
    assert error["type"] == "invalid_request_error"
    wrong = live.request("GET", "/v1/models", headers={"Authorization": "Bearer nope"})
    openai_error(wrong, 401, "invalid_api_key")
    assert "sekrit" not in wrong.body.decode()


@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer sekrit"},
    {"Authorization": "bearer sekrit"},
    {"Authorization": "  BEARER   sekrit  "},
    {"x-api-key": "sekrit"},
])
def test_auth_accepts_bearer_any_case_and_x_api_key(serve, headers):
    live = serve(api_key="sekrit")
    assert live.request("GET", "/v1/models", headers=headers).status == 200


def test_auth_exempts_health_and_options(serve):
    live = serve(api_key="sekrit")
    assert live.request("GET", "/health").status == 200
    assert live.request("OPTIONS", "/v1/chat/completions").status == 204
    assert live.request("OPTIONS", "/anything/at/all").status == 204


def test_cors_headers_when_enabled(serve):
    live = serve(cors=True)
    for reply in (live.request("OPTIONS", "/v1/chat/completions"),
                  live.request("GET", "/v1/models"), live.request("GET", "/missing")):
        assert reply.headers["access-control-allow-origin"] == "*"
        assert reply.headers["access-control-expose-headers"] == "x-request-id, request-id"
        assert "X-Ninfer-Client" in reply.headers["access-control-allow-headers"]
        assert reply.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"


def test_no_cors_headers_by_default(live):
    reply = live.request("OPTIONS", "/v1/models")
    assert reply.status == 204
    assert "access-control-allow-origin" not in reply.headers


def test_body_over_limit_is_413_before_parsing(serve):
    live = serve(max_request_mib=1)
    reply = live.request("POST", "/v1/chat/completions", b"x" * (1024 * 1024 + 1),
                         headers={"Content-Type": "application/json"})
    error = openai_error(reply, 413, "request_too_large")
    assert error["type"] == "invalid_request_error"
    assert live.engine.submitted == []


def test_chunked_body_over_limit_is_413(serve):
    live = serve(max_request_mib=1)
    conn = live.connection()
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.putheader("Content-Type", "application/json")
    conn.endheaders()
    chunk = b"x" * (256 * 1024)
    try:
        for _ in range(5):
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        conn.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may answer and stop reading before the whole body is sent
    response = conn.getresponse()
    assert response.status == 413
    conn.close()


def test_invalid_json_and_non_object_body(live):
    error = openai_error(live.request("POST", "/v1/chat/completions", b"{nope"), 400,
                         "invalid_json")
    assert error["type"] == "invalid_request_error"
    openai_error(live.request("POST", "/v1/chat/completions", b"[1, 2]"), 400, "invalid_json")
