"""The real `ninfer-serve --no-tui` with its engine in a process of its own
(`NINFER_ENGINE_PROCESS=1`, the default on CUDA): the official SDK streams through it and gets
the same answer as without streaming, SIGTERM stops both processes, and a fault in the engine
process ends the running stream in-band with 503 and the server with exit status 2 (contract
§10), as an engine failure in one process does."""
from __future__ import annotations

import json
import signal
import time

import openai
import psutil
from server_process import MODEL_ID, NEEDS_MODEL, chat_body, server_env
from sse_client import stream_through_failure

pytestmark = NEEDS_MODEL

FAULT_STEP = 12  # the prompt's step, then a few decode steps of the stream
EXIT_BOUND_S = 15.0  # the engine process's stop and the watchdog, on a busy machine


def _engine_processes(server) -> list[psutil.Process]:
    """The server's spawned children (not multiprocessing's resource tracker)."""
    return [p for p in psutil.Process(server.proc.pid).children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            and any("spawn_main" in part for part in p.cmdline())]


def test_the_sdk_streams_through_the_engine_process(launch):
    server = launch("--model-id", MODEL_ID, env=server_env(NINFER_ENGINE_PROCESS="1")).wait_ready()
    engines = _engine_processes(server)
    assert len(engines) == 1, "not one engine process under the server"
    assert f"engine process {engines[0].pid}" in server.log()  # the startup line names it
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                           timeout=120)
    messages = [{"role": "user", "content": "Name three colours."}]
    whole = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=24,
                                           temperature=0)
    chunks = list(client.chat.completions.create(
        model=MODEL_ID, messages=messages, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content == streamed and streamed
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # what the engine process compiles again (a grammar) or sends back (log-probabilities)
    schema = {"type": "object", "required": ["colour"], "additionalProperties": False,
              "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}}}
    shaped = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Pick a colour, as JSON."}],
        max_tokens=40, temperature=0, logprobs=True, top_logprobs=2,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "pick", "schema": schema, "strict": True}})
    assert json.loads(shaped.choices[0].message.content)["colour"] in ("red", "blue")
    entries = shaped.choices[0].logprobs.content
    # one entry a content token, as the engine in the HTTP process gives (the stop token has none)
    assert "".join(e.token for e in entries) == shaped.choices[0].message.content
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
    children = _engine_processes(server)
    server.signal(signal.SIGTERM)
    assert server.wait(timeout=EXIT_BOUND_S) == 0, server.log()
    gone, alive = psutil.wait_procs(children, timeout=EXIT_BOUND_S)
    assert not alive, "the engine process outlived the server"


def test_a_fault_in_the_engine_process_fails_the_stream_and_exits_2(launch):
    env = server_env(NINFER_ENGINE_PROCESS="1", NINFER_FAULT=f"step:{FAULT_STEP}")
    server = launch("--model-id", MODEL_ID, env=env).wait_ready()

    stream, health, failed_at = stream_through_failure(
        server.url, chat_body("Count to fifty.", 200), EXIT_BOUND_S)
    exit_code = server.wait(timeout=EXIT_BOUND_S)
    log = server.log()
    assert stream.status == 200 and stream.text, "the stream started"
    assert stream.finish is None and not stream.done, f"it must not end normally: {stream}"
    assert stream.error["code"] == "service_unavailable"
    assert "503" in health and health[-1] == "down"
    assert exit_code == 2, log
    assert time.monotonic() - failed_at < EXIT_BOUND_S
    assert f"injected engine fault at step {FAULT_STEP}" in log

