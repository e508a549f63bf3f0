"""Small deterministic media files: PNG images and an MPEG-4 clip (PyAV)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image


def png(h: int, w: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def mp4(frames: int = 8, h: int = 24, w: int = 40, fps: int = 4) -> bytes:
    av = pytest.importorskip("av", reason="the sample clip is encoded with PyAV")
    out = io.BytesIO()
    rng = np.random.default_rng(3)
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for i in range(frames):
            rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()
