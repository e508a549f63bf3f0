"""Sampler precedence: model preset (by thinking mode) -> process flags -> request fields."""
from __future__ import annotations

import json
from pathlib import Path

from ninfer_engine.config import EngineConfig
from ninfer_engine.step.sampling_presets import qwen_preset, sampling_defaults
from ninfer_engine.types import SamplingParams
from ninfer_http.prompt import ChatRequest, prepare

DENSE_27B = {"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 5120}
MOE_35B = {"architectures": ["Qwen3_5MoeForCausalLM"], "hidden_size": 2048, "num_experts": 256}


class Artifact:
    def __init__(self, text_config: dict, generation_config: dict | None = None) -> None:
        self.text_config, self.generation_config = text_config, generation_config

    def config(self, component: str) -> dict:
        return self.text_config

    def has_resource(self, role: str) -> bool:
        return self.generation_config is not None

    def resource(self, role: str) -> bytes:
        return json.dumps(self.generation_config).encode()


def test_qwen_presets_follow_the_contract_table():
    assert qwen_preset(DENSE_27B, thinking=True) == dict(
        temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, presence_penalty=0.0)
    assert qwen_preset(DENSE_27B, thinking=False) == dict(
        temperature=0.7, top_p=0.80, top_k=20, min_p=0.0, presence_penalty=1.5)
    assert qwen_preset(MOE_35B, thinking=True)["presence_penalty"] == 1.5
    assert qwen_preset(MOE_35B, thinking=False)["presence_penalty"] == 1.5
    assert qwen_preset({"architectures": ["LlamaForCausalLM"]}, thinking=True) is None


def test_other_models_use_generation_config_then_neutral():
    config = EngineConfig(artifact=Path("m"))
    llama = {"architectures": ["LlamaForCausalLM"]}
    assert sampling_defaults(Artifact(llama, {"temperature": 0.3, "top_k": 5}), config,
                             False) == SamplingParams(temperature=0.3, top_k=5)
    assert sampling_defaults(Artifact(llama), config, True) == SamplingParams()


def test_process_flags_override_the_preset():
    config = EngineConfig(artifact=Path("m"), top_k=5, presence_penalty=0.5, greedy=True)
    got = sampling_defaults(Artifact(DENSE_27B), config, thinking=True)
    assert (got.temperature, got.top_p, got.top_k, got.presence_penalty) == (0.0, 0.95, 5, 0.5)


class ThinkingEngine:
    """Just what `prepare` reads; its template opens `<think>` like Qwen3.5's."""

    max_context = 64
    default_max_tokens = 8
    sampling_defaults = SamplingParams(temperature=0.7)
    thinking_sampling_defaults = SamplingParams(temperature=1.0, top_p=0.95)

    class tokenizer:
        @staticmethod
        def encode(text: str) -> list[int]:
            return [ord(c) % 100 for c in text]

    class chat_template:
        @staticmethod
        def render(messages, tools=None, add_generation_prompt=True, **kwargs) -> str:
            opened = kwargs.get("enable_thinking") is not False
            return "<user>hi\n<assistant>" + ("<think>\n" if opened else "")


def test_the_request_picks_the_preset_of_its_thinking_mode():
    thinking = prepare(ThinkingEngine(), ChatRequest(protocol="openai-chat", messages=[{"role": "user", "content": "hi"}]),
                       "r1")
    assert thinking.generation.sampling == SamplingParams(temperature=1.0, top_p=0.95)
    plain = prepare(ThinkingEngine(), ChatRequest(protocol="openai-chat", messages=[{"role": "user", "content": "hi"}],
                                                  template_kwargs={"enable_thinking": False}),
                    "r2")
    assert plain.generation.sampling == SamplingParams(temperature=0.7)
    chosen = prepare(ThinkingEngine(), ChatRequest(protocol="openai-chat", messages=[{"role": "user", "content": "hi"}],
                                                   sampling={"temperature": 0.2}), "r3")
    sampling = chosen.generation.sampling
    assert sampling.temperature == 0.2 and sampling.top_p == 0.95
