"""Media bytes → items: decompression bombs and bad bytes refused, video without PyAV named."""
import sys

import pytest

from ninfer_engine.vision import decode
from ninfer_engine.vision.decode import MediaUnsupported, image_item, video_item
from ninfer_engine.vision.preprocess import MediaError, Preprocessor
from tests.vision.media_samples import mp4, png


def test_images_over_the_pixel_limit_are_refused(monkeypatch):
    monkeypatch.setattr(decode, "MAX_PIXELS", 20 * 20)
    with pytest.raises(MediaError, match="too large to decode"):
        image_item(png(21, 21, 0), Preprocessor(patch=4))
    assert image_item(png(20, 20, 0), Preprocessor(patch=4)).kind == "image"


def test_bad_image_bytes_are_refused():
    with pytest.raises(MediaError, match="cannot be decoded"):
        image_item(b"\x89PNG not really", Preprocessor())


def test_bad_video_bytes_are_refused():
    pytest.importorskip("av", reason="video decoding needs PyAV")
    with pytest.raises(MediaError, match="cannot be decoded"):
        video_item(b"not a video", Preprocessor())


def test_video_without_pyav_names_the_package(monkeypatch):
    clip = mp4()
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` raises ImportError
    with pytest.raises(MediaUnsupported, match="PyAV"):
        video_item(clip, Preprocessor())


def test_same_bytes_same_digest():
    a, b = image_item(png(24, 24, 1), Preprocessor()), image_item(png(24, 24, 1), Preprocessor())
    assert a.key == b.key and a.key != image_item(png(24, 24, 2), Preprocessor()).key
