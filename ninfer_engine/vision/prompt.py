"""Media in the prompt: placeholder expansion and multimodal rotary positions (model-math.md §6).

The chat template leaves one `<|vision_start|><|image_pad|><|vision_end|>` per image and one
`<|vision_start|><|video_pad|><|vision_end|>` per video. `expand_prompt` gives each image
`t·h·w / merge²` pads and replaces each video's pad with, per frame pair, its timestamp text
(`<1.5 seconds>`) then `<|vision_start|>`, the pair's pads, `<|vision_end|>`, inside the
template's own start and end (transformers' `Qwen3VLProcessor` since 5.10 replaces the pad
token alone; vLLM follows it; earlier releases replaced the whole triple), and
returns the `MediaPrompt` the engine carries: the spans of pads (each filled by its item's
encoder rows), the [3, T] positions (T, H, W) and the rope delta decode continues from.

Positions: text advances all three axes together; a span starting at position s over a merged
h'×w' grid takes (s, s + row, s + col), and text resumes at s + max(h', w'). Each video frame
pair is its own span (t = 1). `rope_delta = max position + 1 − prompt length`; a token at
index j ≥ prompt length has position j + rope_delta on every axis.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import torch

from .preprocess import MediaError, Pixels


def merged_tokens(grid: tuple[int, int, int], merge: int) -> int:
    """Encoder output rows (prompt placeholder tokens) of one (t, h, w) patch grid."""
    t, h, w = grid
    return t * h * w // merge ** 2


@dataclass(frozen=True)
class VisionTokens:
    start: int
    end: int
    image: int
    video: int

    @classmethod
    def from_tokenizer(cls, token_to_id: Callable[[str], int | None]) -> "VisionTokens":
        names = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
        ids = [token_to_id(n) for n in names]
        missing = [n for n, i in zip(names, ids) if i is None]
        if missing:
            raise ValueError(f"the tokenizer has no {', '.join(missing)} token")
        return cls(*ids)


@dataclass(frozen=True)
class MediaItem:
    """One decoded image or video; `digest` names its source bytes (prefix keys, the cache)."""

    kind: str  # "image" | "video"
    pixels: Pixels
    digest: str

    @property
    def key(self) -> str:
        """Digest and grid: equal keys give equal encoder rows."""
        return f"{self.digest}:{'x'.join(map(str, self.pixels.grid))}"


@dataclass(frozen=True)
class Span:
    """`tokens` pads at prompt index `start`, filled by rows `row ..` of item `item`'s output."""

    item: int
    start: int
    tokens: int
    row: int


@dataclass(frozen=True, eq=False)
class MediaPrompt:
    items: tuple[MediaItem, ...]
    spans: tuple[Span, ...]
    positions: torch.Tensor  # [3, prompt length], long
    rope_delta: int

    @property
    def media_tokens(self) -> int:
        return sum(span.tokens for span in self.spans)

    def positions_for(self, start: int, n: int) -> torch.Tensor:
        """[3, n] positions of tokens start .. start+n-1 (past the prompt: text after it)."""
        inside = self.positions[:, start: start + n]
        after = torch.arange(start + inside.shape[1], start + n) + self.rope_delta
        return torch.cat([inside, after.expand(3, -1)], 1)

    def spans_in(self, start: int, n: int) -> list[tuple[Span, int, int]]:
        """(span, first, last + 1) prompt indices of each span's pads within [start, start+n)."""
        out = []
        for span in self.spans:
            lo, hi = max(span.start, start), min(span.start + span.tokens, start + n)
            if lo < hi:
                out.append((span, lo, hi))
        return out

    def prefix_key(self, prompt: tuple[int, ...]) -> tuple[int, ...]:
        """The prompt with each span's pads replaced by an id derived from its item's digest and
        grid (negative: never a vocabulary id), so the prefix tree tells images apart."""
        key = list(prompt)
        for span in self.spans:
            digest = hashlib.sha256(self.items[span.item].key.encode()).digest()
            key[span.start: span.start + span.tokens] = \
                [-1 - int.from_bytes(digest[:6], "little")] * span.tokens
        return tuple(key)


def expand_prompt(ids: list[int], items: list[MediaItem], tokens: VisionTokens, merge: int,
                  encode: Callable[[str], list[int]]) -> tuple[tuple[int, ...], MediaPrompt]:
    """The prompt with every placeholder expanded for `items` (in prompt order) and its
    `MediaPrompt`; `encode` tokenizes a video's timestamp text. Raises `MediaError` when the
    placeholders and the items disagree."""
    kinds = [i for i in ids if i in (tokens.image, tokens.video)]
    wanted = ["image" if i == tokens.image else "video" for i in kinds]
    if wanted != [item.kind for item in items]:
        raise MediaError(f"the prompt has placeholders for {_count(wanted)} but the request "
                         f"carries {_count([item.kind for item in items])}")
    out: list[int] = []
    spans: list[Span] = []
    grids: list[tuple[int, int, int]] = []  # the merged grid of each span
    media = iter(enumerate(items))
    for token in ids:
        if token == tokens.image:
            index, item = next(media)
            t, h, w = item.pixels.grid
            grids.append((t, h // merge, w // merge))
            spans.append(Span(index, len(out), merged_tokens(item.pixels.grid, merge), 0))
            out += [tokens.image] * spans[-1].tokens
        elif token == tokens.video:
            index, item = next(media)
            _, h, w = item.pixels.grid
            per_pair = h * w // merge ** 2
            for pair, seconds in enumerate(item.pixels.timestamps):
                out += [*encode(f"<{seconds:.1f} seconds>"), tokens.start]
                grids.append((1, h // merge, w // merge))
                spans.append(Span(index, len(out), per_pair, pair * per_pair))
                out += [tokens.video] * per_pair + [tokens.end]
        else:
            out.append(token)
    positions, delta = _positions(len(out), spans, grids)
    return tuple(out), MediaPrompt(tuple(items), tuple(spans), positions, delta)


def _positions(length: int, spans: list[Span], grids) -> tuple[torch.Tensor, int]:
    pos = torch.empty(3, length, dtype=torch.long)
    at, next_pos = 0, 0
    for span, (t, h, w) in zip(spans, grids):
        text = span.start - at
        pos[:, at: span.start] = torch.arange(next_pos, next_pos + text)
        s = next_pos + text
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w),
                                          indexing="ij")).reshape(3, -1)
        grid[0] = 0  # an image or one frame pair: the time axis stays at s
        pos[:, span.start: span.start + span.tokens] = grid + s
        at, next_pos = span.start + span.tokens, s + max(h, w)
    pos[:, at:] = torch.arange(next_pos, next_pos + length - at)
    delta = int(pos.max()) + 1 - length if length else 0
    return pos, delta


def _count(kinds: list[str]) -> str:
    images, videos = kinds.count("image"), kinds.count("video")
    return f"{images} image(s) and {videos} video(s)"
