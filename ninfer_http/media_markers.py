"""Media parts inside template message text.

A protocol parser turns each image or video part into a marker in the message's text
(`media_marker`), so the media keep their place through the chat template and a stored
Responses conversation alike; after rendering, `split_media` replaces each marker with Qwen's
`<|vision_start|><|image_pad|><|vision_end|>` (or `<|video_pad|>`) and returns the references
in prompt order. Markers are delimited by private-use characters no tokenizer gives meaning to.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_OPEN, _CLOSE = "\ue000", "\ue001"
_MARKER = re.compile(f"{_OPEN}(image|video) (\\S+) ([^{_CLOSE}]*){_CLOSE}")
PLACEHOLDERS = {"image": "<|vision_start|><|image_pad|><|vision_end|>",
                "video": "<|vision_start|><|video_pad|><|vision_end|>"}


@dataclass(frozen=True)
class MediaRef:
    kind: str  # "image" | "video"
    url: str  # http(s):// or data:
    param: str  # the request field it came from, for errors


def media_marker(kind: str, url: str, param: str) -> str:
    return f"{_OPEN}{kind} {param} {url}{_CLOSE}"


def split_media(text: str) -> tuple[str, list[MediaRef]]:
    """The text with each marker replaced by its placeholder, and the markers' references."""
    refs: list[MediaRef] = []

    def placeholder(match: re.Match) -> str:
        refs.append(MediaRef(match.group(1), match.group(3), match.group(2)))
        return PLACEHOLDERS[match.group(1)]
    return _MARKER.sub(placeholder, text), refs
