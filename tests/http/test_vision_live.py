"""Media through the live server's three APIs, with the official `openai` and `anthropic` SDKs,
against the real engine on a tiny converted multimodal Qwen3.5 and Qwen3.5-MoE (`--vision`; the
CPU, or CUDA's exact fp32 path where there is a GPU): the same greedy tokens as transformers;
every media error row; remote media refused at internal addresses unless
`--media-allow-private` (SSRF).

The expected prompt is built here independently of the server: the ChatML template around the
parts joined by newlines, each media part as Qwen's `<|vision_start|><|image_pad|><|vision_end|>`.
"""
from __future__ import annotations

import asyncio
import base64
import json
import sys
import threading

import anthropic
import openai
import pytest
from aiohttp import web

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.tokenizer import IncrementalDetokenizer
from ninfer_engine.vision import decode
from ninfer_engine.vision.decode import image_item, video_item
from ninfer_http import media as media_module
from ninfer_http.media import DECODERS, FETCHER
from ninfer_http.media_budget import BUDGET
from tests.vision.media_samples import mp4, png
from tests.vision.test_engine_vs_hf import _hf_greedy
from tests.vision.tiny_vl import hf_vl_model, write_vl_artifact

STEPS = 8
IMAGES = [png(40, 56, 1), png(72, 24, 2)]
BIG = png(200, 200, 4)  # 64 media tokens at the tiny pixel budget
IMAGE, VIDEO = "<|vision_start|><|image_pad|><|vision_end|>", \
    "<|vision_start|><|video_pad|><|vision_end|>"


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _served(family, tmp_path_factory):
    """(started engine on the converted tiny model of `family`, the HF model)."""
    model = hf_vl_model(family)
    path = write_vl_artifact(model, tmp_path_factory.mktemp(family))
    engine = Engine(EngineConfig(artifact=path, vision=True, max_context=256,
                                 max_vision_tokens=512, prefill_chunk=32, cuda_dtype="fp32"))
    engine.start()
    yield engine, model
    engine.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from _served("qwen3_5", tmp_path_factory)


@pytest.fixture(scope="module")
def served_moe(tmp_path_factory):
    yield from _served("qwen3_5_moe", tmp_path_factory)


# the greedy-token tests run on both families; the error rows on the dense one
FAMILIES = pytest.mark.parametrize("family", ["served", "served_moe"])


def _expected(engine, model, content: str, media: list[tuple[str, bytes]]) -> tuple[int, str]:
    """(prompt tokens, answer text) of HF's greedy tokens for one user message."""
    pre = engine.vision.preprocessor
    items = [(image_item if kind == "image" else video_item)(data, pre) for kind, data in media]
    text = f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
    ids, prompt = engine.media_planner.prepare(engine.tokenizer.encode(text), items,
                                               engine.tokenizer.encode)
    tokens = _hf_greedy(model, ids, prompt, pre)[:STEPS]
    eos = [i for i, t in enumerate(tokens) if t in engine.tokenizer.eos_token_ids]
    tokens = tokens[: eos[0]] if eos else tokens
    detok = IncrementalDetokenizer(engine.tokenizer, ids)
    return len(ids), detok.add(tokens) + detok.finish()


def _clients(url):
    return (openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=30),
            anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=30))


@FAMILIES
def test_two_images_through_chat_responses_and_messages(family, serve, request):
    engine, model = request.getfixturevalue(family)
    live = serve(engine=engine)
    prompt_tokens, answer = _expected(engine, model, f"Compare\n{IMAGE}\n{IMAGE}",
                                      [("image", d) for d in IMAGES])
    oa, an = _clients(live.url)
    chat = oa.chat.completions.create(
        model=engine.model_id, temperature=0, max_tokens=STEPS, messages=[{"role": "user",
        "content": [{"type": "text", "text": "Compare"}] + [
            {"type": "image_url", "image_url": {"url": _data_url(d)}} for d in IMAGES]}])
    assert chat.choices[0].message.content == answer
    assert chat.usage.prompt_tokens == prompt_tokens
    resp = oa.responses.create(
        model=engine.model_id, temperature=0, max_output_tokens=STEPS, input=[{"role": "user",
        "content": [{"type": "input_text", "text": "Compare"}] + [
            {"type": "input_image", "image_url": _data_url(d)} for d in IMAGES]}])
    assert resp.output_text == answer and resp.usage.input_tokens == prompt_tokens
    blocks = [{"type": "text", "text": "Compare"}] + [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(d).decode()}} for d in IMAGES]
    message = an.messages.create(model="any", max_tokens=STEPS, extra_body={"temperature": 0},
                                 messages=[{"role": "user", "content": blocks}])
    assert "".join(b.text for b in message.content if b.type == "text") == answer
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) \
        == prompt_tokens
    counted = an.messages.count_tokens(model="any", messages=[{"role": "user",
                                                               "content": blocks}])
    assert counted.input_tokens == prompt_tokens


def test_images_through_an_engine_process(served, serve):
    """`--vision` with the engine in a process of its own (the default on CUDA): this process
    decodes the images and plans their prompt tokens (`MediaPlanner`, sent up by the engine
    process), the engine process encodes them; transformers' answer, as in-process."""
    from tests.engine.test_engine_process import spawn

    engine, model = served
    prompt_tokens, answer = _expected(engine, model, f"Compare\n{IMAGE}\n{IMAGE}",
                                      [("image", d) for d in IMAGES])
    child = spawn(engine.config)
    try:
        assert child.media_planner == engine.media_planner
        oa, _ = _clients(serve(engine=child).url)
        chat = oa.chat.completions.create(
            model=child.model_id, temperature=0, max_tokens=STEPS, messages=[{
                "role": "user", "content": [{"type": "text", "text": "Compare"}] + [
                    {"type": "image_url", "image_url": {"url": _data_url(d)}} for d in IMAGES]}])
        assert chat.choices[0].message.content == answer
        assert chat.usage.prompt_tokens == prompt_tokens
        assert child.snapshot().vision.encoded >= len(IMAGES)
    finally:
        child.stop()


@FAMILIES
def test_a_short_video_through_chat_and_responses(family, serve, request):
    engine, model = request.getfixturevalue(family)
    live = serve(engine=engine)
    clip = mp4()
    prompt_tokens, answer = _expected(engine, model, f"What happens?\n{VIDEO}",
                                      [("video", clip)])
    oa, _ = _clients(live.url)
    chat = oa.chat.completions.create(
        model=engine.model_id, temperature=0, max_tokens=STEPS, messages=[{"role": "user",
        "content": [{"type": "text", "text": "What happens?"},
                    {"type": "video_url", "video_url": {"url": _data_url(clip, "video/mp4")}}]}])
    assert chat.choices[0].message.content == answer
    assert chat.usage.prompt_tokens == prompt_tokens
    resp = oa.responses.create(
        model=engine.model_id, temperature=0, max_output_tokens=STEPS, input=[{"role": "user",
        "content": [{"type": "input_text", "text": "What happens?"},
                    {"type": "input_video", "video_url": _data_url(clip, "video/mp4")}]}])
    assert resp.output_text == answer and resp.usage.input_tokens == prompt_tokens


def _chat_with(live, engine, *urls: str):
    parts = [{"type": "text", "text": "Look"}] + [
        {"type": "image_url", "image_url": {"url": u}} for u in urls]
    return live.chat(model=engine.model_id, max_tokens=2, temperature=0,
                     messages=[{"role": "user", "content": parts}])


@pytest.mark.parametrize("urls, status, code", [
    (["data:image/png;base64,%%%"], 400, "invalid_media"),  # malformed base64
    (["data:image/png;base64,AAAA"], 400, "invalid_media"),  # not an image
    (["data:image/png;base64,AAAA" + ","], 400, "invalid_media"),
    ([_data_url(BIG)] * 9, 400, "media_budget_exceeded"),  # 576 > --max-vision-tokens 512
    ([_data_url(BIG)] * 4, 400, "context_length_exceeded"),  # 256 media tokens + text > 256
])
def test_media_error_rows(served, serve, urls, status, code):
    engine, _ = served
    reply = _chat_with(serve(engine=engine), engine, *urls)
    assert reply.status == status and reply.json()["error"]["code"] == code


def test_the_other_invalid_media_rows(served, serve, monkeypatch):
    """The table's other causes of 400 invalid_media through the server (an image over the
    pixel limit, lowered here; one oblong past 200:1; video without PyAV), and file_id media's
    400 unsupported_parameter."""
    engine, _ = served
    live = serve(engine=engine)
    clip = mp4()  # encoded before PyAV goes away
    monkeypatch.setattr(decode, "MAX_PIXELS", 20 * 20)
    over = _chat_with(live, engine, _data_url(png(21, 21, 0)))
    monkeypatch.undo()
    oblong = _chat_with(live, engine, _data_url(png(2, 500, 0)))
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` raises ImportError
    video = live.chat(model=engine.model_id, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": _data_url(clip, "video/mp4")}}]}])
    for reply, words in ((over, "too large"), (oblong, "aspect ratio"), (video, "PyAV")):
        assert reply.status == 400 and reply.json()["error"]["code"] == "invalid_media"
        assert words in reply.json()["error"]["message"]
    by_id = live.request("POST", "/v1/responses", {"model": engine.model_id, "input": [
        {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]})
    assert by_id.status == 400 and by_id.json()["error"]["code"] == "unsupported_parameter"


def test_the_live_media_budget_refuses_more_than_itself_and_frees_after_each_request(
        served, serve):
    engine, _ = served
    one = image_item(BIG, engine.vision.preprocessor).pixels.patches.nbytes
    live = serve(engine=engine, media_live_mib=3)
    budget = live.server.runner.app[BUDGET]
    assert budget.capacity == 3 * 2**20
    budget.capacity = 2 * one  # the tiny tower's images are KiBs: two of them, three do not fit
    reply = _chat_with(live, engine, *[_data_url(BIG)] * 3)
    assert reply.status == 400 and reply.json()["error"]["code"] == "media_budget_exceeded"
    for _ in range(2):  # the second fits only if the first request gave its bytes back
        assert _chat_with(live, engine, _data_url(BIG), _data_url(BIG)).status == 200
    assert budget.used == 0


def test_anthropic_images_while_vision_is_off_are_refused(live):
    reply = live.request("POST", "/v1/messages", {
        "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]})
    assert reply.status == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert "vision" in reply.json()["error"]["message"]


@pytest.fixture
def media_site():
    """A local aiohttp site on 127.0.0.1: /a.png, /slow (1 s), /missing (404), /loop;
    yields (port, the list of paths it was asked for)."""
    loop = asyncio.new_event_loop()
    asked: list[str] = []

    @web.middleware
    async def record(request, handler):
        asked.append(request.path)
        return await handler(request)

    async def image(_):
        return web.Response(body=IMAGES[0], content_type="image/png")

    async def slow(_):
        await asyncio.sleep(1)
        return web.Response(body=IMAGES[0])

    async def loop_redirect(_):
        raise web.HTTPFound("/loop")

    app = web.Application(middlewares=[record])
    app.router.add_get("/a.png", image)
    app.router.add_get("/slow", slow)
    app.router.add_get("/loop", loop_redirect)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield port, asked
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_internal_addresses_are_refused_by_default(served, serve, media_site, host):
    """A literal loopback address and a name resolving to one: 502, nothing fetched."""
    engine, _ = served
    port, asked = media_site
    reply = _chat_with(serve(engine=engine), engine, f"http://{host}:{port}/a.png")
    assert reply.status == 502 and reply.json()["error"]["code"] == "media_fetch_failed"
    assert "internal address" in reply.json()["error"]["message"] and asked == []


def test_allowed_private_fetch_gives_the_data_url_answer(served, serve, media_site):
    engine, _ = served
    live = serve(engine=engine, media_allow_private=True)
    port, asked = media_site
    fetched = _chat_with(live, engine, f"http://localhost:{port}/a.png")
    assert asked == ["/a.png"]
    inline = _chat_with(live, engine, _data_url(IMAGES[0]))
    assert fetched.status == inline.status == 200
    assert fetched.json()["choices"] == inline.json()["choices"]
    usage, again = fetched.json()["usage"], inline.json()["usage"]
    assert usage["prompt_tokens"] == again["prompt_tokens"]
    # the same bytes by another URL: the same digest, so the prefix tree reuses the prompt
    assert again["prompt_tokens_details"]["cached_tokens"] > 0


def test_fetch_failures_and_timeouts(served, serve, media_site):
    engine, _ = served
    live = serve(engine=engine, media_allow_private=True)
    live.server.runner.app[FETCHER].timeout_s = 0.3
    base = f"http://127.0.0.1:{media_site[0]}"
    missing = _chat_with(live, engine, f"{base}/missing")
    assert missing.status == 502 and "HTTP 404" in missing.json()["error"]["message"]
    looping = _chat_with(live, engine, f"{base}/loop")
    assert looping.status == 502 and "redirects" in looping.json()["error"]["message"]
    slow = _chat_with(live, engine, f"{base}/slow")
    assert slow.status == 504 and slow.json()["error"]["code"] == "media_fetch_timeout"
    live.server.runner.app[FETCHER].max_bytes = len(IMAGES[0]) - 1  # the size cap, lowered
    big = _chat_with(live, engine, f"{base}/a.png")
    assert big.status == 502 and big.json()["error"]["code"] == "media_fetch_failed"
    assert "over" in big.json()["error"]["message"]
    # the Anthropic shape of the same rows
    for path, status, kind in (("/missing", 502, "api_error"), ("/slow", 504, "timeout_error")):
        reply = live.request("POST", "/v1/messages", {
            "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": base + path}}]}]})
        assert reply.status == status and reply.json()["error"]["type"] == kind


def test_responses_keep_media_in_the_conversation_and_redact_listed_urls(served, serve):
    engine, _ = served
    live = serve(engine=engine)
    oa, _ = _clients(live.url)
    url = _data_url(IMAGES[1])
    first = oa.responses.create(model=engine.model_id, temperature=0, max_output_tokens=2,
                                input=[{"role": "user", "content": [
                                    {"type": "input_text", "text": "See"},
                                    {"type": "input_image", "image_url": url}]}])
    encoded = engine.vision.encoded_items
    second = oa.responses.create(model=engine.model_id, temperature=0, max_output_tokens=2,
                                 previous_response_id=first.id, input="And now?")
    # the stored turn still holds its image: the continuation's prompt has its tokens, from
    # the media cache and the prefix tree
    assert second.usage.input_tokens > first.usage.input_tokens + 2
    assert second.usage.input_tokens_details.cached_tokens > 0
    assert engine.vision.encoded_items == encoded
    listed = live.request("GET", f"/v1/responses/{first.id}/input_items").json()
    shown = live.request("GET", f"/v1/responses/{first.id}/input_items"
                         "?include=message.input_image.image_url").json()
    assert listed["data"][0]["content"][1] == {"type": "input_image", "image_url": None,
                                               "detail": "auto"}
    assert shown["data"][0]["content"][1]["image_url"] == url


def test_request_log_times_the_vision_tower(served, serve, tmp_path):
    engine, _ = served
    log = tmp_path / "requests.jsonl"
    live = serve(engine=engine, request_log_jsonl=log)
    assert _chat_with(live, engine, _data_url(png(48, 48, 9))).status == 200  # a new image
    assert live.chat(model=engine.model_id, max_tokens=1).status == 200
    done = [json.loads(line) for line in log.read_text().splitlines()
            if json.loads(line)["event"] == "request_done"]
    vision = [d["timings_seconds"]["vision"] for d in done]
    assert vision[0] > 0 and vision[1] is None
    assert vision[0] <= done[0]["timings_seconds"]["prefill"]
    state = live.request("GET", "/engine/state").json()["vision"]
    assert state["encoded"] >= 1 and state["media_tokens"] >= 1 and state["encoder_s"] > 0
    metrics = live.request("GET", "/metrics").body.decode()
    assert f"vision_encoded_media_total {float(state['encoded'])}" in metrics


def test_media_decode_on_the_preprocess_threads(served, serve, monkeypatch):
    engine, _ = served
    live = serve(engine=engine, media_preprocess_threads=3)
    assert live.server.runner.app[DECODERS]._max_workers == 3
    threads = []
    real = media_module.image_item

    def recording(data, pre):
        threads.append(threading.current_thread().name)
        return real(data, pre)
    monkeypatch.setattr(media_module, "image_item", recording)
    assert _chat_with(live, engine, _data_url(IMAGES[0]), _data_url(IMAGES[1])).status == 200
    assert len(threads) == 2 and all(t.startswith("ninfer-media") for t in threads)


def test_a_request_with_media_leaves_the_count_of_requests_being_prepared(served, serve,
                                                                          monkeypatch):
    """Fetching and decoding media take longer than the engine's arrival window: a request
    gives back its place in the front end's `Preparing` count before loading them, so no
    prompt step waits for it (`arrival.Preparing`, `Scheduler.arrival_wait`)."""
    from ninfer_http.observers import PREPARING

    engine, _ = served
    live = serve(engine=engine)
    counts = []
    load = media_module._load

    async def counting(app, engine, ref):
        counts.append(app[PREPARING].count)
        return await load(app, engine, ref)
    monkeypatch.setattr(media_module, "_load", counting)
    assert _chat_with(live, engine, _data_url(IMAGES[0])).status == 200
    assert counts == [0] and live.server.runner.app[PREPARING].count == 0
