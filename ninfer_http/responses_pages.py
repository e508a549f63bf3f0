"""Query strings of the stored-Response GET endpoints: key checks and input_items pages (§1, §6).

Unknown query keys are 400 `unknown_parameter`; bad `after`, `limit` or `order` values are 400
`invalid_pagination`. Listed input items show media URLs (`input_image.image_url`,
`input_video.video_url`) only under `include=message.input_image.image_url`; otherwise null.
"""
from __future__ import annotations

from typing import Any, Callable

from aiohttp import web
from multidict import MultiMapping

from .errors import ApiError, invalid_value

_PAGE_QUERY = frozenset({"after", "limit", "order", "include", "include[]"})
# The only include value of input_items: show the media URLs of stored message parts.
_SHOW_MEDIA = "message.input_image.image_url"
_ITEM_INCLUDES = frozenset({"", _SHOW_MEDIA})
_MEDIA_URLS = {"input_image": "image_url", "input_video": "video_url"}
MAX_LIMIT, DEFAULT_LIMIT = 100, 20


def check_query(request: web.Request, allowed: frozenset[str]) -> MultiMapping[str]:
    """The request's query, once every key in it is one of `allowed`."""
    for key in request.query:
        if key not in allowed:
            raise ApiError(400, f"Unknown query parameter: '{key}'.", "unknown_parameter",
                           param=key)
    return request.query


def _invalid(param: str, message: str) -> ApiError:
    return ApiError(400, message, "invalid_pagination", param=param)


def _limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    try:
        limit = int(value)
    except ValueError:
        raise _invalid("limit", f"'limit' must be an integer; got {value!r}.") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise _invalid("limit", f"'limit' must be in [1, {MAX_LIMIT}]; got {limit}.")
    return limit


def _redacted(item: dict[str, Any]) -> dict[str, Any]:
    """The item with its media parts' URLs set to null."""
    content = item.get("content")
    if not isinstance(content, list) or not any(
            isinstance(p, dict) and p.get("type") in _MEDIA_URLS for p in content):
        return item
    parts = [{**p, _MEDIA_URLS[p["type"]]: None}
             if isinstance(p, dict) and p.get("type") in _MEDIA_URLS else p for p in content]
    return {**item, "content": parts}


def input_items_page(request: web.Request,
                     items_of: Callable[[], list[dict[str, Any]]]) -> dict[str, Any]:
    """One page of `items_of()` (called after the query is valid) in the requested order."""
    query = check_query(request, _PAGE_QUERY)
    includes = query.getall("include", []) + query.getall("include[]", [])
    for value in includes:
        if value not in _ITEM_INCLUDES:
            raise invalid_value("include", "'include' may only hold "
                                "'message.input_image.image_url'.")
    limit = _limit(query.get("limit"))
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise _invalid("order", f"'order' must be 'asc' or 'desc'; got {order!r}.")
    items = items_of()
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise _invalid("after", f"'after' is not an item of this response: {after!r}.")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    if _SHOW_MEDIA not in includes:
        page = [_redacted(item) for item in page]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > limit,
    }
