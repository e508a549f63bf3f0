"""`--vision` on an artifact without a vision component stops the load with a clear reason."""
import pytest

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine, EngineLoadError
from tests.vision.tiny_vl import hf_vl_model, write_vl_artifact


def test_vision_needs_the_vision_component(tmp_path):
    path = write_vl_artifact(hf_vl_model("qwen3_5"), tmp_path, "--skip-vision")
    with pytest.raises(EngineLoadError, match="--vision needs the artifact's vision component"):
        Engine(EngineConfig(artifact=path, vision=True, max_context=256))
