"""The `vision` component as the engine serves it (`--vision`, `--vision-device`).

`VisionTower.load(artifact, tokenizer, ...)` builds the encoder on its device and the
preprocessor and placeholder tokens of the artifact. The HTTP side uses its `planner`
(`MediaPlanner`: the preprocessor, and `prepare`, the placeholder expansion within the
`--max-vision-tokens` budget; no weights, so an engine process sends it to the HTTP process)
while it builds a request; the runner calls
`step_inputs` for a step's rows: their [3, T] positions and, for prompt chunks over media pads,
the encoder rows that replace those pads. A request's media are encoded together the first time
a chunk needs any of them (`encode_chunk`, before the step's forward, so a failure there is the
request's alone), kept until its prompt is in, and cached by digest and grid.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..stats import VisionStats
from .cache import MediaCache
from .encoder import VisionEncoder
from .preprocess import MediaError, Preprocessor
from .prompt import MediaItem, MediaPrompt, VisionTokens, expand_prompt, merged_tokens

IMAGE_JSON, VIDEO_JSON = "preprocessor_config.json", "video_preprocessor_config.json"


def load_vision(config: Any, artifact: Any, model: Any, tokenizer: Any,
                dtype: torch.dtype) -> "VisionTower | None":
    """The tower under `--vision` (`EngineConfig`) on `cuda:{--vision-device}`, the CPU
    without CUDA; None without `--vision`."""
    if not config.vision:
        return None
    if not hasattr(model, "forward_rows"):
        raise ValueError("--vision needs a Qwen3.5-family model")
    device = torch.device(f"cuda:{config.vision_device}" if torch.cuda.is_available() else "cpu")
    return VisionTower.load(artifact, tokenizer.backend.token_to_id, device, dtype,
                            config.max_vision_tokens, config.media_cache_mib << 20)


class MediaBudgetExceeded(MediaError):
    """More media tokens than `--max-vision-tokens` allows one request."""


@dataclass(frozen=True)
class MediaPlanner:
    """What building a request needs of `--vision`: how media are preprocessed and how many
    prompt tokens they take (`ServingEngine.vision` of either engine)."""

    preprocessor: Preprocessor
    tokens: VisionTokens
    merge: int  # the encoder's spatial merge: an item of grid (t, h, w) takes t·h·w / merge²
    max_tokens: int  # --max-vision-tokens

    def prepare(self, ids: list[int], items: list[MediaItem],
                encode: Callable[[str], list[int]]) -> tuple[tuple[int, ...], MediaPrompt]:
        """The expanded prompt and its media; `MediaBudgetExceeded` over `--max-vision-tokens`."""
        merged = sum(merged_tokens(item.pixels.grid, self.merge) for item in items)
        if merged > self.max_tokens:
            raise MediaBudgetExceeded(
                f"the request's media take {merged} tokens; --max-vision-tokens allows "
                f"{self.max_tokens}")
        return expand_prompt(ids, items, self.tokens, self.merge, encode)


class VisionTower:
    def __init__(self, encoder: VisionEncoder, preprocessor: Preprocessor,
                 tokens: VisionTokens, max_tokens: int, cache_bytes: int) -> None:
        self.encoder = encoder
        self.planner = MediaPlanner(preprocessor, tokens, encoder.merge, max_tokens)
        self.cache = MediaCache(cache_bytes)
        self.encoded_items = 0  # media the encoder ran on (cache misses)
        self.encode_s = 0.0  # ... and its time
        self.media_tokens = 0  # prompt pads filled with encoder rows

    @classmethod
    def load(cls, artifact: Any, token_to_id: Callable[[str], int | None],
             device: torch.device, dtype: torch.dtype, max_tokens: int,
             cache_bytes: int) -> "VisionTower":
        if "vision" not in artifact.components:
            raise ValueError("--vision needs the artifact's vision component; this artifact "
                             "has none")
        config = artifact.config("vision")
        if config["out_hidden_size"] != artifact.config("text")["hidden_size"]:
            raise ValueError("the vision component's output width is not the text width")
        encoder = VisionEncoder(config, lambda name, shape:
                                artifact.parameter(name, shape).to(device, dtype))

        def resource(role):
            return artifact.resource(role, "vision") if artifact.has_resource(
                role, "vision") else None
        pre = Preprocessor.from_resources(resource(IMAGE_JSON), resource(VIDEO_JSON))
        if (pre.patch, pre.temporal, pre.merge) != (
                config["patch_size"], config["temporal_patch_size"],
                config["spatial_merge_size"]):
            raise ValueError("the vision preprocessor's patch geometry differs from the tower's")
        return cls(encoder, pre, VisionTokens.from_tokenizer(token_to_id), max_tokens,
                   cache_bytes)

    @property
    def preprocessor(self) -> Preprocessor:
        return self.planner.preprocessor

    def stats(self) -> VisionStats:
        c = self.cache
        return VisionStats(self.encoded_items, self.encode_s, self.media_tokens, c.hits,
                           c.misses, c.bytes, c.capacity)

    def encode_chunk(self, seq: Any, tokens: int) -> None:
        """Encoder rows at hand for the media pads of `seq`'s next `tokens` prompt tokens."""
        media = seq.request.media
        if media is not None:
            for span, _, _ in media.spans_in(seq.cached, tokens):
                self._rows(seq, span.item)

    def step_inputs(self, work: list[tuple[Any, list[int], bool]], device: torch.device
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """[3, T] positions of a step's rows (sequence, tokens, verify?) computed from each
        sequence's `cached`, and (token rows, encoder rows) for the media pads among them."""
        positions, media_rows = step_media(work, device, self._rows)
        if media_rows is not None:
            self.media_tokens += media_rows[0].shape[0]
        return positions, media_rows

    def _rows(self, seq: Any, item: int) -> torch.Tensor:
        """Encoder rows of media item `item` of `seq`: the cache's, else all of the request's
        items not yet at hand are encoded in one call."""
        if item not in seq.media_rows:
            began = time.perf_counter()
            items = seq.request.media.items
            todo = []
            for i, it in enumerate(items):
                if i in seq.media_rows:
                    continue
                cached = self.cache.get(it.key)
                if cached is None:
                    todo.append(i)
                else:
                    seq.media_rows[i] = cached.to(self.encoder.device)
            if todo:
                self._encode(seq, [items[i] for i in todo], todo)
            seq.vision_s += time.perf_counter() - began
        return seq.media_rows[item]

    def _encode(self, seq: Any, items: list[MediaItem], indices: list[int]) -> None:
        began = time.perf_counter()
        grids = [item.pixels.grid for item in items]
        patches = torch.cat([torch.from_numpy(self.preprocessor.normalize(item.pixels.patches))
                             for item in items])
        out = self.encoder.encode(patches, grids)
        if out.device.type == "cuda":
            torch.cuda.synchronize(out.device)  # the time is the encoder's, not a launch's
        for i, item, rows in zip(indices, items, out.split(
                [self.encoder.merged_tokens(g) for g in grids])):
            seq.media_rows[i] = rows
            self.cache.put(item.key, rows)
        self.encoded_items += len(items)
        self.encode_s += time.perf_counter() - began


def step_media(work: list[tuple[Any, list[int], bool]], device: torch.device,
               rows_of: Callable[[Any, int], torch.Tensor]
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """`VisionTower.step_inputs` with the encoder rows of (sequence, media item) from `rows_of`
    (a tensor-parallel follower's are the rows rank 0 sent: `parallel.shadows`)."""
    positions, rows, embeds, at = [], [], [], 0
    for seq, ids, _ in work:
        start, n = seq.cached, len(ids)
        media = seq.request.media
        if media is None:
            positions.append(torch.arange(start, start + n).expand(3, -1))
        else:
            positions.append(media.positions_for(start, n))
            for span, lo, hi in media.spans_in(start, n):
                first = span.row + lo - span.start
                rows.append(torch.arange(at + lo - start, at + hi - start))
                embeds.append(rows_of(seq, span.item)[first: first + hi - lo])
        at += n
    media_rows = None
    if rows:
        media_rows = (torch.cat(rows).to(device), torch.cat(embeds).to(device))
    return torch.cat(positions, 1).to(device), media_rows
