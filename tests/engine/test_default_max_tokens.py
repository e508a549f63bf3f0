"""The output limit of a request without `max_tokens`: the request field, else
`--default-max-tokens` when the operator gives it, else the artifact's generation_config.json
`max_new_tokens`, else 8192; and the `convert gguf --generation` preset that records it."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ninfer_engine.config import DEFAULT_MAX_TOKENS, EngineConfig
from ninfer_engine.cli.flags import parse_args
from ninfer_engine.step.sampling_presets import default_max_tokens, sampling_defaults
from ninfer_engine.supervisor import Supervisor
from ninfer_engine.cli.tools import _parser
from ninfer_engine.cli.tools_convert import _sampling
from ninfer_engine.types import SamplingParams
from ninfer_http.prompt import ChatRequest, prepare

LLAMA = {"architectures": ["LlamaForCausalLM"]}


class Artifact:
    """Just the config and the generation_config.json resource (None: no such resource)."""

    def __init__(self, generation_config: dict | None = None) -> None:
        self.generation_config = generation_config

    def config(self, component: str) -> dict:
        return LLAMA

    def has_resource(self, role: str) -> bool:
        return role == "generation_config.json" and self.generation_config is not None

    def resource(self, role: str) -> bytes:
        return json.dumps(self.generation_config).encode()


def _config(*flags: str) -> EngineConfig:
    return parse_args(["m.ninfer", *flags], {}).config


def test_the_flag_is_unset_unless_given():
    assert DEFAULT_MAX_TOKENS == 8192
    assert _config().default_max_tokens is None
    assert _config("--default-max-tokens", "8192").default_max_tokens == 8192
    assert _config("--default-max-tokens", "300").default_max_tokens == 300


def test_flag_then_artifact_then_built_in():
    card = Artifact({"temperature": 0.2, "max_new_tokens": 96})
    assert default_max_tokens(card, _config()) == 96
    # given explicitly, the flag wins, even when it says the built-in value
    assert default_max_tokens(card, _config("--default-max-tokens", "300")) == 300
    assert default_max_tokens(card, _config("--default-max-tokens", "8192")) == 8192
    assert default_max_tokens(Artifact({"temperature": 0.2}), _config()) == DEFAULT_MAX_TOKENS
    assert default_max_tokens(Artifact(), _config()) == DEFAULT_MAX_TOKENS
    assert default_max_tokens(Artifact(), _config("--default-max-tokens", "7")) == 7


@pytest.mark.parametrize("value", [0, -5, True, 1.5, "96", None])
def test_a_bad_max_new_tokens_falls_back_to_the_built_in(value):
    assert default_max_tokens(Artifact({"max_new_tokens": value}), _config()) == 8192


def test_the_preset_takes_the_penalties_from_generation_config():
    card = Artifact({"temperature": 0.2, "top_p": 0.9, "frequency_penalty": 0.5,
                     "presence_penalty": 0.25, "max_new_tokens": 96,
                     "repetition_penalty": 1.3})  # HF's multiplicative one is not ours
    assert sampling_defaults(card, _config(), thinking=False) == SamplingParams(
        temperature=0.2, top_p=0.9, frequency_penalty=0.5, presence_penalty=0.25)
    flags = _config("--frequency-penalty", "0", "--presence-penalty", "1")
    got = sampling_defaults(card, flags, thinking=False)
    assert (got.frequency_penalty, got.presence_penalty) == (0.0, 1.0)


class Engine:
    """What `prepare` reads; one token per character."""

    max_context = 200
    sampling_defaults = thinking_sampling_defaults = SamplingParams(temperature=0.2)

    def __init__(self, default_max_tokens: int) -> None:
        self.default_max_tokens = default_max_tokens

    class tokenizer:
        @staticmethod
        def encode(text: str) -> list[int]:
            return [ord(c) % 100 for c in text]

    class chat_template:
        @staticmethod
        def render(messages, tools=None, add_generation_prompt=True, **kwargs) -> str:
            return "".join(m["content"] for m in messages) + "\n>"


def _limit(engine: Engine, max_tokens: int | None) -> int:
    request = ChatRequest(protocol="openai-chat", max_tokens=max_tokens,
                          messages=[{"role": "user", "content": "What is the capital?"}])
    return prepare(engine, request, "r").generation.max_tokens


def test_the_request_field_wins_and_the_context_clamps():
    engine = Engine(default_max_tokens=96)
    assert _limit(engine, None) == 96
    assert _limit(engine, 5) == 5
    assert _limit(engine, 500) == 200 - len("What is the capital?\n>")
    assert _limit(Engine(default_max_tokens=8192), None) == 200 - len("What is the capital?\n>")


def test_the_engine_resolves_the_limit_from_its_artifact():
    from ninfer_engine.engine import Engine as RealEngine

    from .helpers import FakeArtifact, default_resources, tiny_llama

    model = tiny_llama(seed=1)
    resources = default_resources()
    generation = json.loads(resources["generation_config.json"])
    resources["generation_config.json"] = json.dumps({**generation, "max_new_tokens": 33}).encode()
    config = EngineConfig(artifact=Path("tiny.ninfer"), prefill_chunk=8)
    assert RealEngine(config, FakeArtifact(model, resources=resources)).default_max_tokens == 33
    flagged = EngineConfig(artifact=Path("tiny.ninfer"), prefill_chunk=8, default_max_tokens=12)
    assert RealEngine(flagged, FakeArtifact(model, resources=resources)).default_max_tokens == 12
    assert RealEngine(config, FakeArtifact(model)).default_max_tokens == 8192


def test_the_supervisor_serves_the_engine_s_limit(tmp_path):
    class Stub:
        default_max_tokens = 96

        def start(self) -> None:
            pass

    supervisor = Supervisor([str(tmp_path / "m.ninfer")], engine_factory=lambda config: Stub())
    supervisor.load()
    assert supervisor.config.default_max_tokens is None
    assert supervisor.default_max_tokens == 96


def test_generation_preset_parsing():
    assert _sampling("temperature=0.2,top_p=0.9,frequency_penalty=0.5,max_new_tokens=96") == {
        "temperature": 0.2, "top_p": 0.9, "frequency_penalty": 0.5, "max_new_tokens": 96}
    assert _sampling("top_k=40,min_p=0.05,presence_penalty=-1") == {
        "top_k": 40, "min_p": 0.05, "presence_penalty": -1.0}
    assert _sampling("") == {}
    assert isinstance(_sampling("max_new_tokens=96")["max_new_tokens"], int)


@pytest.mark.parametrize("text, message", [
    ("heat=1", "unknown generation key 'heat'"),
    ("repetition_penalty=1.1", "unknown generation key 'repetition_penalty'"),
    ("max_new_tokens=0", "max_new_tokens: 0 is out of range 1..inf"),
    ("max_new_tokens=9.5", "max_new_tokens: not an integer: '9.5'"),
    ("top_k=-1", "top_k: -1 is out of range 0..inf"),
    ("temperature=hot", "temperature: not a number: 'hot'"),
    ("temperature=nan", "temperature: nan is out of range 0.0..2.0"),
    ("frequency_penalty=2.5", "frequency_penalty: 2.5 is out of range -2.0..2.0"),
])
def test_generation_preset_rejects(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message.replace(".", r"\.")):
        _sampling(text)


def test_convert_gguf_takes_the_preset_as_generation_or_sampling():
    for flag in ("--generation", "--sampling"):
        args = _parser().parse_args(["convert", "gguf", "m.gguf", "-o", "m.ninfer", flag,
                                     "temperature=0.2,max_new_tokens=96"])
        assert args.sampling == {"temperature": 0.2, "max_new_tokens": 96}
    assert _parser().parse_args(["convert", "gguf", "m.gguf", "-o", "m.ninfer"]).sampling == {}
