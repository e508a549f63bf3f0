"""`POST /v1/completions` through the official `openai` SDK and raw HTTP (issue 21)."""
from __future__ import annotations

import json
import math

import openai
import pytest

from fake_engine import FakeEngine
from ninfer_engine.types import TokenLogprob


class LogprobEngine(FakeEngine):
    """Fills the request's logprob sink as the real sampler does: before each token's event."""

    def submit(self, request):
        events = super().submit(request)

        async def with_logprobs():
            sink = request.prompt_logprob_sink
            if sink is not None:  # the engine's prompt entries: the first token has none
                sink.append(TokenLogprob(request.prompt_ids[0], None))
                sink.extend(TokenLogprob(t, -0.125, ((ord("z"), -0.1), (t, -0.125)), 2)
                            for t in request.prompt_ids[1:])
            async for event in events:
                for token in event.token_ids:
                    if request.logprob_sink is not None:
                        top = tuple((ord("a") + k, -0.5 * (k + 1))
                                    for k in range(request.logprobs or 0))
                        request.logprob_sink.append(TokenLogprob(token, -0.25 * token, top))
                yield event
        return with_logprobs()


def sdk(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def test_create_with_the_sdk(live):
    done = sdk(live).completions.create(model="fake-model", prompt="Say hi", max_tokens=5,
                                        temperature=0, stop=["\n"], seed=3)
    assert done.object == "text_completion" and done.id.startswith("cmpl-")
    assert done.choices[0].text == "Hello, world!"
    assert done.choices[0].finish_reason == "stop"
    assert done.usage.prompt_tokens == len("Say hi") and done.usage.completion_tokens == 4
    [request] = live.engine.submitted
    assert request.prompt_ids == tuple(ord(c) for c in "Say hi")  # no chat template
    assert request.max_tokens == 5 and request.stop == ("\n",) and request.sampling.seed == 3


def test_stream_with_the_sdk_and_usage(live):
    chunks = list(sdk(live).completions.create(
        model="fake-model", prompt="Say hi", stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == "Hello, world!"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert live.engine.submitted[0].max_tokens == 16  # OpenAI's default for this endpoint


def test_token_id_prompt_echo_and_n(live):
    reply = live.request("POST", "/v1/completions", {
        "model": "fake-model", "prompt": [[72, 105]], "echo": True, "n": 2, "max_tokens": 4})
    body = reply.json()
    assert [c["text"] for c in body["choices"]] == ["HiHello, world!"] * 2
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10}
    assert [r.prompt_ids for r in live.engine.submitted] == [(72, 105)] * 2


def test_vllm_bench_serve_request_shape(live):
    # what vLLM's `bench serve` (openai-completions backend) posts
    body = {"model": "fake-model", "prompt": "x" * 20, "temperature": 0.0, "max_tokens": 8,
            "logprobs": None, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True, "repetition_penalty": 1.0}
    reply = live.request("POST", "/v1/completions", body)
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/event-stream")
    lines = [line for line in reply.body.decode().split("\n\n") if line]
    assert lines[-1] == "data: [DONE]"
    usage = json.loads(lines[-2][len("data: "):])["usage"]
    assert usage["completion_tokens"] == 4
    assert live.engine.submitted[0].ignore_eos is True


def test_logprobs_in_the_legacy_shape(serve):
    live = serve(engine=LogprobEngine())
    done = sdk(live).completions.create(model="fake-model", prompt="hi", logprobs=2)
    logprobs = done.choices[0].logprobs
    assert logprobs.token_logprobs == [-0.25, -0.5, -0.75, -1.0]  # token ids 1..4
    assert logprobs.top_logprobs[0] == {"a": -0.5, "b": -1.0}
    assert logprobs.text_offset == [0, 1, 2, 3]  # each id decodes to one character
    streamed = list(sdk(live).completions.create(model="fake-model", prompt="hi", logprobs=0,
                                                 stream=True))
    values = [v for c in streamed for v in (c.choices[0].logprobs.token_logprobs or [])]
    assert values == [-0.25, -0.5, -0.75, -1.0]
    assert all(math.isfinite(v) for v in values)


def test_echo_with_logprobs_leads_with_the_prompt_entries(serve):
    live = serve(engine=LogprobEngine())
    done = sdk(live).completions.create(model="fake-model", prompt="hi", echo=True, logprobs=1,
                                        max_tokens=0)  # lm-eval-harness' loglikelihood shape
    [request] = live.engine.submitted
    assert request.prompt_logprobs == 1 and request.max_tokens == 0
    choice = done.choices[0]
    assert choice.text == "hiHello, world!"  # the fake writes its pieces as token ids 1..4
    logprobs = choice.logprobs
    assert logprobs.tokens[:2] == ["h", "i"] and logprobs.text_offset == [0, 1, 2, 3, 4, 5]
    assert logprobs.token_logprobs == [None, -0.125, -0.25, -0.5, -0.75, -1.0]
    assert logprobs.top_logprobs[:2] == [None, {"z": -0.1}]
    streamed = list(sdk(live).completions.create(model="fake-model", prompt="hi", echo=True,
                                                 logprobs=1, stream=True))
    first = streamed[0].choices[0]
    assert first.text.startswith("hi") and first.logprobs.token_logprobs[:2] == [None, -0.125]
    text = "".join(c.choices[0].text for c in streamed)
    values = [v for c in streamed for v in c.choices[0].logprobs.token_logprobs]
    assert (text, values) == (choice.text, logprobs.token_logprobs)


def test_vllm_prompt_logprobs_per_choice(serve):
    live = serve(engine=LogprobEngine())
    done = sdk(live).completions.create(model="fake-model", prompt="hi", n=2,
                                        extra_body={"prompt_logprobs": 1})
    for choice in done.choices:
        assert choice.logprobs is None and choice.text == "Hello, world!"  # no echo
        assert choice.model_extra["prompt_logprobs"] == [None, {
            str(ord("z")): {"logprob": -0.1, "rank": 1, "decoded_token": "z"},
            str(ord("i")): {"logprob": -0.125, "rank": 2, "decoded_token": "i"}}]
    assert [r.prompt_logprobs for r in live.engine.submitted] == [1, 1]
    sinks = [r.prompt_logprob_sink for r in live.engine.submitted]
    assert sinks[0] is not sinks[1]  # each choice's own


def test_chat_logprobs_per_choice_and_per_chunk(serve):
    live = serve(engine=LogprobEngine())
    client = sdk(live)
    done = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], logprobs=True,
        top_logprobs=1)
    content = done.choices[0].logprobs.content
    assert [c.logprob for c in content] == [-0.25, -0.5, -0.75, -1.0]
    assert content[0].top_logprobs[0].token == "a" and content[0].bytes == [1]
    chunks = list(client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], logprobs=True,
        stream=True))
    streamed = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert streamed == [-0.25, -0.5, -0.75, -1.0]


@pytest.mark.parametrize("fields, code, param", [
    ({"prompt": ["a", "b"]}, "unsupported_parameter", "prompt"),
    ({"prompt": ""}, "invalid_value", "prompt"),
    ({"prompt": [1, -2]}, "invalid_value", "prompt"),
    ({"prompt": [72, 0x110000]}, "invalid_value", "prompt"),  # past the vocabulary
    ({"prompt": [[72, 2 ** 64]]}, "invalid_value", "prompt"),  # the fuzz run's 500
    ({"suffix": "end"}, "unsupported_parameter", "suffix"),
    ({"prompt_logprobs": 21}, "invalid_value", "prompt_logprobs"),
    ({"n": 2, "stream": True}, "unsupported_parameter", "n"),
    ({"best_of": 3}, "unsupported_parameter", "best_of"),
    ({"logprobs": 21}, "invalid_value", "logprobs"),
    ({"max_tokens": -1}, "invalid_value", "max_tokens"),
    ({"logit_bias": {"1": 3}}, "unsupported_parameter", "logit_bias"),
    ({"prompt": "x" * 300}, "context_length_exceeded", "prompt"),
])
def test_rejections(live, fields, code, param):
    body = {"model": "fake-model", "prompt": "hi", **fields}
    reply = live.request("POST", "/v1/completions", body)
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert live.engine.submitted == []


def test_unknown_model_is_404(live):
    reply = live.request("POST", "/v1/completions", {"model": "other", "prompt": "hi"})
    assert reply.status == 404 and reply.json()["error"]["code"] == "model_not_found"


def test_chat_prompt_logprobs_as_vllm_returns_them(serve):
    live = serve(engine=LogprobEngine())
    messages = [{"role": "user", "content": "hi"}]
    done = sdk(live).chat.completions.create(model="fake-model", messages=messages,
                                             extra_body={"prompt_logprobs": 0})
    [request] = live.engine.submitted
    entries = done.model_extra["prompt_logprobs"]
    assert len(entries) == len(request.prompt_ids) and entries[0] is None
    assert entries[1] == {str(request.prompt_ids[1]): {
        "logprob": -0.125, "rank": 2, "decoded_token": chr(request.prompt_ids[1])}}
    with pytest.raises(openai.BadRequestError) as raised:
        sdk(live).chat.completions.create(model="fake-model", messages=messages, stream=True,
                                          extra_body={"prompt_logprobs": 1})
    assert raised.value.body["param"] == "prompt_logprobs"
