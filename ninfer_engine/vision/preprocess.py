"""The preprocessor of an artifact's `vision` resources: pixel budget, resize, normalization,
patch rows (model-math.md §6), for images and video frames.

`Preprocessor.from_resources(image_json, video_json)` reads `preprocessor_config.json` and
`video_preprocessor_config.json` (transformers' `Qwen2VLImageProcessor` and
`Qwen3VLVideoProcessor` fields, their class defaults where a field is absent). `image(rgb)` and
`video(frames, fps)` return `Pixels`: the resized 8-bit patch rows `[t·h·w, 3·T·P·P]` in the
encoder's merge-block-major order (a quarter of float32's memory while a request waits) and the
patch grid `(t, h, w)`; `normalize` gives the float32 rows the encoder takes. Images are resized
with Pillow's bicubic filter on the 8-bit image, as transformers' PIL image processor does
(Pillow is imported when media is first resized, so an engine without `--vision` loads without
it); video frames with torch's 8-bit bicubic filter with antialiasing on the CPU, which is what
transformers' `Qwen3VLVideoProcessor` runs through torchvision (and qwen-vl-utils): it differs
from Pillow's by up to 12 levels where one side shrinks and the other grows.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

Grid = tuple[int, int, int]


class MediaError(ValueError):
    """Media the request cannot use (undecodable, too small or too oblong, over a limit)."""


@dataclass(frozen=True)
class Pixels:
    """One image or video ready for the encoder; `timestamps`: a video's seconds per frame
    pair (the prompt shows them between the pairs)."""

    patches: np.ndarray  # uint8
    grid: Grid
    timestamps: tuple[float, ...] = ()


@dataclass(frozen=True)
class Preprocessor:
    patch: int = 16
    temporal: int = 2
    merge: int = 2
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale: float = 1 / 255
    image_pixels: tuple[int, int] = (65536, 16777216)  # (min, max) pixels of a resized image
    video_pixels: tuple[int, int] = (4096, 25165824)  # ... of all of a video's frames
    fps: float = 2.0  # frames sampled per second of video
    min_frames: int = 4
    max_frames: int = 768
    cap_pixels_per_frame: bool = False  # transformers' per-frame cap (qwen-vl-utils' budget)
    max_video_tokens: int = 768  # that cap, in patches of factor² pixels per frame

    @classmethod
    def from_resources(cls, image_json: bytes | None, video_json: bytes | None) -> "Preprocessor":
        image = json.loads(image_json) if image_json else {}
        video = json.loads(video_json) if video_json else {}
        fields = {}
        for ours, theirs in (("patch", "patch_size"), ("temporal", "temporal_patch_size"),
                             ("merge", "merge_size"), ("rescale", "rescale_factor")):
            if theirs in image:
                fields[ours] = image[theirs]
        for ours, theirs in (("mean", "image_mean"), ("std", "image_std")):
            if theirs in image:
                fields[ours] = tuple(image[theirs])
        fields["image_pixels"] = _budget(image, cls.image_pixels)
        fields["video_pixels"] = _budget(video, cls.video_pixels)
        for name in ("fps", "min_frames", "max_frames", "cap_pixels_per_frame",
                     "max_video_tokens"):
            if video.get(name) is not None:
                fields[name] = video[name]
        return cls(**fields)

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this (one merged token's side in pixels)."""
        return self.patch * self.merge

    def image_grid(self, height: int, width: int) -> Grid:
        """The patch grid of an image of this size after the resize."""
        h, w = _fit(height, width, self.factor, *self.image_pixels)
        return 1, h // self.patch, w // self.patch

    def image(self, image: "PILImage") -> Pixels:
        from PIL import Image

        _, gh, gw = self.image_grid(image.height, image.width)
        resized = image.convert("RGB").resize((gw * self.patch, gh * self.patch),
                                              Image.Resampling.BICUBIC)
        frame = np.asarray(resized).transpose(2, 0, 1)
        return Pixels(self._patches(np.repeat(frame[None], self.temporal, 0)), (1, gh, gw))

    def sample_frames(self, total: int, fps: float | None) -> np.ndarray:
        """Indices of the frames to keep from `total` at the source `fps` (24 when unknown)."""
        wanted = int(total / (fps or 24.0) * self.fps)
        n = min(max(wanted, self.min_frames), self.max_frames, total)
        return np.linspace(0, total - 1, n).round().astype(int)

    def frame_size(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """(h, w) every frame of a video is resized to: `frames` sampled at height × width
        (transformers' `Qwen3VLVideoProcessor.resize`)."""
        low, high = self.video_pixels
        if self.cap_pixels_per_frame:
            per_frame = max(min(self.max_video_tokens * self.factor ** 2, high // frames),
                            int(low * 1.05))
            high = per_frame * frames
        # transformers rounds the count half-to-even (5 frames budget as 4) and refuses fewer
        # than one pair; a one-frame video is budgeted here as the pair it is padded to
        pairs = max(round(frames / self.temporal), 1)
        return _fit(height, width, self.factor, low, high, frames, pairs * self.temporal)

    @staticmethod
    def resize(rgb: np.ndarray, size: tuple[int, int]) -> np.ndarray:
        """uint8 [H, W, 3] -> uint8 [h, w, 3]: torch's 8-bit bicubic filter with antialiasing on
        the CPU, the kernel torchvision's `resize` runs for transformers' video processor."""
        import torch

        if rgb.shape[:2] == tuple(size):
            return rgb  # torchvision returns a frame of the target size untouched
        frame = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)[None].contiguous()
        out = torch.nn.functional.interpolate(frame, size=list(size), mode="bicubic",
                                              align_corners=False, antialias=True)
        return np.ascontiguousarray(out[0].permute(1, 2, 0).numpy())

    def video(self, frames: list[np.ndarray], indices: np.ndarray, fps: float | None,
              source: tuple[int, int] | None = None) -> Pixels:
        """Sampled RGB frames (uint8, `indices` into the source at `fps`), at the source size
        (`source`, default the first frame's) or already at its `frame_size`."""
        if not frames:
            raise MediaError("the video has no frames")
        h, w = self.frame_size(len(frames), *(source or frames[0].shape[:2]))
        pad = -len(frames) % self.temporal  # the last frame repeats to fill a pair
        frames = frames + [frames[-1]] * pad
        index = list(indices) + [indices[-1]] * pad
        clip = np.stack([(f if f.shape[:2] == (h, w) else self.resize(f, (h, w)))
                         for f in frames]).transpose(0, 3, 1, 2)
        seconds = [float(i) / (fps or 24.0) for i in index]
        pairs = tuple((seconds[i] + seconds[i + self.temporal - 1]) / 2
                      for i in range(0, len(seconds), self.temporal))
        return Pixels(self._patches(clip), (len(frames) // self.temporal, h // self.patch,
                                            w // self.patch), pairs)

    def normalize(self, patches: np.ndarray) -> np.ndarray:
        """uint8 patch rows -> float32, rescaled then normalized per channel (a row's values
        are channel-major: 3 blocks of T·P·P), in transformers' order of operations."""
        block = patches.shape[1] // 3
        mean = np.repeat(np.asarray(self.mean, np.float32), block)
        std = np.repeat(np.asarray(self.std, np.float32), block)
        return (patches.astype(np.float32) * np.float32(self.rescale) - mean) / std

    def _patches(self, clip: np.ndarray) -> np.ndarray:
        """uint8 [frames, 3, H, W] -> rows [t·h·w, 3·T·P·P]: merge-block-major, (C, T, P, P)."""
        f, c, height, width = clip.shape
        t, p, m = f // self.temporal, self.patch, self.merge
        gh, gw = height // p, width // p
        x = clip.reshape(t, self.temporal, c, gh // m, m, p, gw // m, m, p)
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return np.ascontiguousarray(x.reshape(t * gh * gw, c * self.temporal * p * p))


def _budget(config: dict, default: tuple[int, int]) -> tuple[int, int]:
    size = config.get("size") or {}
    low = config.get("min_pixels", size.get("shortest_edge", default[0]))
    high = config.get("max_pixels", size.get("longest_edge", default[1]))
    return int(low), int(high)


def _fit(height: int, width: int, factor: int, low: int, high: int, frames: int = 1,
         budget_frames: int | None = None) -> tuple[int, int]:
    """transformers' `smart_resize`: sides rounded to multiples of `factor`, area within
    [low, high], aspect ratio kept as closely as possible. A video (`budget_frames` given, the
    video processor's rounded count) checks `budget_frames` × area against the bounds and scales
    by the `frames` it has, as transformers' video `smart_resize` does."""
    video = budget_frames is not None
    budget = budget_frames if video else 1
    if min(height, width) < 1:
        raise MediaError("the image is empty")
    if max(height, width) / min(height, width) > 200:
        raise MediaError(f"the aspect ratio {max(height, width) / min(height, width):.0f}:1 "
                         "is over 200:1")
    if video and (height < factor or width < factor):  # a tiny video scales up first
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if budget * h * w > high:
        beta = math.sqrt(frames * height * width / high)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif budget * h * w < low:
        beta = math.sqrt(low / (frames * height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w
