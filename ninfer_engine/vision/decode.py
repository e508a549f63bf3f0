"""Media bytes → `MediaItem`: images by Pillow (decompression bombs refused), video frames by
PyAV (FFmpeg's decoders; the `av` package), each sampled and preprocessed for the tower.

Raises `MediaError` for anything the request cannot use; `MediaUnsupported` when PyAV is not
installed (the server then names the missing package).
"""
from __future__ import annotations

import hashlib
import io
import warnings

from .preprocess import MediaError, Preprocessor
from .prompt import MediaItem

# Pillow warns past this many pixels and refuses past twice as many; both are errors here
MAX_PIXELS = 8192 * 8192
MAX_VIDEO_FRAMES = 100_000  # frames decoded to sample a video (a cap on decoding time)


class MediaUnsupported(MediaError):
    """A media kind this installation cannot decode."""


def image_item(data: bytes, pre: Preprocessor) -> MediaItem:
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS  # decompression bombs: Pillow's own guard, ours size
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise MediaError(f"the image is too large to decode: {exc}") from None
    except Exception as exc:  # Pillow raises many kinds for bad bytes
        raise MediaError(f"the image cannot be decoded: {exc}") from None
    return MediaItem("image", pre.image(image), _digest(data))


def video_item(data: bytes, pre: Preprocessor) -> MediaItem:
    try:
        import av
    except ImportError:
        raise MediaUnsupported("video input needs the PyAV package (pip install av), which "
                               "this server does not have") from None
    try:
        total, fps, source = _count_frames(av, data)
        wanted = pre.sample_frames(total, fps)
        keep = set(wanted.tolist())
        size = pre.frame_size(len(wanted), *source)
        frames = []  # resized as they are decoded: only the small frames are ever kept
        with av.open(io.BytesIO(data)) as container:
            for i, frame in enumerate(container.decode(video=0)):
                if i in keep:
                    frames.append(pre.resize(frame.to_ndarray(format="rgb24"), size))
                if i >= wanted[-1]:
                    break
    except MediaError:
        raise
    except Exception as exc:  # FFmpeg errors for bad bytes
        raise MediaError(f"the video cannot be decoded: {exc}") from None
    # a frame index can repeat when the clip is shorter than the minimum frame count
    frames = [frames[sorted(keep).index(i)] for i in wanted.tolist()]
    return MediaItem("video", pre.video(frames, wanted, fps, source), _digest(data))


def _count_frames(av, data: bytes) -> tuple[int, float | None, tuple[int, int]]:
    """(frames, frames per second, (height, width)) of the first video stream; frames counted
    by decoding when the container does not say."""
    with av.open(io.BytesIO(data)) as container:
        if not container.streams.video:
            raise MediaError("the media has no video stream")
        stream = container.streams.video[0]
        if stream.width * stream.height > MAX_PIXELS:
            raise MediaError(f"video frames of {stream.width}x{stream.height} are too large")
        fps = float(stream.average_rate) if stream.average_rate else None
        source = (stream.height, stream.width)
        total = stream.frames
        if not total:
            total = 0
            for _ in container.decode(video=0):
                total += 1
                if total > MAX_VIDEO_FRAMES:
                    raise MediaError(f"the video has over {MAX_VIDEO_FRAMES} frames")
    if total < 1:
        raise MediaError("the video has no frames")
    if total > MAX_VIDEO_FRAMES:
        raise MediaError(f"the video has over {MAX_VIDEO_FRAMES} frames")
    return total, fps, source


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
