"""A request's media: fetched or decoded from `data:` URLs, preprocessed for the vision tower,
and the prepared request with its placeholders expanded (contract §3, §4 "Context").

`prepare_with_media` renders the conversation, loads the media its markers name (remote URLs
through the app's `MediaFetcher`, several at once; Pillow / PyAV decoding and preprocessing on
the `--media-preprocess-threads` pool), holds their decoded bytes in the live media budget
(`media_budget`, `--media-live-mib`) for the rest of the request, and hands both to
`prompt.prepare`; `count_prompt_tokens` is the same count for the token-counting
endpoints. Without `--vision`, any media is 400 `vision_disabled`.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import os
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from ninfer_engine.arrival import current_arrival
from ninfer_engine.client import ServingEngine
from ninfer_engine.vision.decode import MediaUnsupported, image_item, video_item
from ninfer_engine.vision.preprocess import MediaError
from ninfer_engine.vision.prompt import MediaItem

from .context import request_id
from .errors import ApiError
from .media_budget import hold
from .media_fetch import MediaFetcher
from .media_markers import MediaRef, split_media
from .prompt import ChatRequest, PreparedRequest, expand_media, prepare, render_text
from .prompt_encoder import ENCODER

FETCHER = web.AppKey("media_fetcher", MediaFetcher)
DECODERS = web.AppKey("media_decoders", ThreadPoolExecutor)
MAX_DECODERS = 16


def install(app: web.Application, allow_private: bool, threads: int) -> None:
    """The app's media fetcher (`--media-allow-private`) and its decoding threads
    (`--media-preprocess-threads`, 0 = one a CPU up to 16), closed with the app."""
    app[FETCHER] = MediaFetcher(allow_private)
    app[DECODERS] = ThreadPoolExecutor(threads or min(os.cpu_count() or 1, MAX_DECODERS),
                                       thread_name_prefix="ninfer-media")

    async def close(app: web.Application) -> None:
        await app[FETCHER].close()
        app[DECODERS].shutdown(wait=False, cancel_futures=True)
    app.on_cleanup.append(close)


async def prepare_with_media(request: web.Request, engine: ServingEngine,
                             chat: ChatRequest) -> PreparedRequest:
    text, refs = split_media(render_text(engine, chat))
    items = await load_media(request.app, engine, refs)
    await hold(request, sum(item.pixels.patches.nbytes for item in items))
    ids = await request.app[ENCODER].encode(engine.tokenizer, text)
    return prepare(engine, chat, request_id(request), (text, items, ids))


async def count_prompt_tokens(request: web.Request, engine: ServingEngine,
                              chat: ChatRequest) -> int:
    """Prompt tokens with every media item's placeholders (the count endpoints)."""
    text, refs = split_media(render_text(engine, chat))
    items = await load_media(request.app, engine, refs)
    text_ids = await request.app[ENCODER].encode(engine.tokenizer, text)
    return len(expand_media(engine, text_ids, items)[0])


async def load_media(app: web.Application, engine: ServingEngine,
                     refs: list[MediaRef]) -> list[MediaItem]:
    if not refs:
        return []
    # fetching and decoding outlast the engine's arrival window: no prompt step waits for it
    current_arrival().hand_over()
    if engine.media_planner is None:
        raise ApiError(400, "This server has no vision encoder enabled (start it with "
                       "--vision); media inputs are not accepted.", "vision_disabled",
                       param=refs[0].param)
    return list(await asyncio.gather(*(_load(app, engine, ref) for ref in refs)))


async def _load(app: web.Application, engine: ServingEngine, ref: MediaRef) -> MediaItem:
    data = _data_url(ref) if ref.url.startswith("data:") else await app[FETCHER].fetch(ref.url)
    decode = image_item if ref.kind == "image" else video_item
    try:
        return await asyncio.get_running_loop().run_in_executor(
            app[DECODERS], decode, data, engine.media_planner.preprocessor)
    except MediaUnsupported as exc:
        raise ApiError(400, f"{exc}.", "invalid_media", param=ref.param) from None
    except MediaError as exc:
        raise ApiError(400, f"The {ref.kind} is not usable: {exc}.", "invalid_media",
                       param=ref.param) from None


def _data_url(ref: MediaRef) -> bytes:
    header, comma, payload = ref.url[len("data:"):].partition(",")
    if not comma:
        raise ApiError(400, "A data: URL needs a comma before its payload.", "invalid_media",
                       param=ref.param)
    if not header.endswith(";base64"):
        return urllib.parse.unquote_to_bytes(payload)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "The data: URL's base64 payload is malformed.", "invalid_media",
                       param=ref.param) from None
