"""A step that raises, in the real `ninfer-serve --no-tui` (`NINFER_FAULT=rows:N`): the stream it
carried ends with an in-band 500 error (no `[DONE]`), the server stays healthy, and the same
greedy request gives the same answer after the failure as before it; with the engine in the
HTTP process and in one of its own.
"""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from server_process import NEEDS_MODEL, chat_body, server_env
from sse_client import chat

pytestmark = NEEDS_MODEL

# steps 0-3: the short request before (its prompt, then 3 decode steps); the long stream's
# prompt is step 4, so step 12 is one of its decode steps
FAULT_STEP = 12
LONG = "Write a long story about a dragon who learns to fly, with many chapters."


async def _plain(session: aiohttp.ClientSession, url: str, content: str, max_tokens: int):
    async with session.post(url + "/v1/chat/completions",
                            json=chat_body(content, max_tokens, stream=False)) as response:
        return response.status, await response.json()


# the engine in the HTTP process (the CPU's default) or in a process of its own (CUDA's)
@pytest.mark.parametrize("engine_process", ["0", "1"])
def test_a_failed_step_ends_its_stream_and_the_server_serves_on(launch, engine_process):
    server = launch(env=server_env(NINFER_FAULT=f"rows:{FAULT_STEP}",
                                   NINFER_ENGINE_PROCESS=engine_process)).wait_ready()
    url = server.url

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            before = await _plain(session, url, "Hi", 4)
            failed = await chat(session, url, chat_body(LONG, 64))
            after = await _plain(session, url, "Hi", 4)
            async with session.get(url + "/health") as response:
                health = response.status
            async with session.get(url + "/metrics") as response:
                metrics = await response.text()
        return before, failed, after, health, metrics

    before, failed, after, health, metrics = asyncio.run(asyncio.wait_for(scenario(), 180))
    assert before[0] == 200 and before[1]["usage"]["completion_tokens"] == 4, before
    assert failed.status == 200 and failed.text, "the stream started before its step failed"
    assert failed.finish is None and not failed.done, failed
    assert failed.error["code"] == "internal_error", failed.error
    assert f"injected fault in step {FAULT_STEP}" in failed.error["message"]
    assert after == before[:1] + (after[1],) and (
        after[1]["choices"][0]["message"] == before[1]["choices"][0]["message"]), (before, after)
    assert health == 200
    assert "a step failed: its 1 request(s) end with an error, the engine goes on" in server.log()
    assert 'ninfer:requests_window{outcome="internal_error"} 1.0' in metrics.splitlines()
    assert "ninfer:steps_failed_total 1.0" in metrics.splitlines()
