"""Grammar masks and log-probabilities in the batched sampler (issue 21), on the default
model's tokenizer (skipped when install.sh has not prepared it)."""
from __future__ import annotations

import json

import pytest
import torch

from ninfer_engine.constrained import compile_constraint, json_schema_grammar, tool_call_grammar
from ninfer_engine.constrained.grammar import ToolSpec
from ninfer_engine.cli.flags import default_artifact
from ninfer_engine.step.sampling import Sampler, sample_rows
from ninfer_engine.types import SamplingParams

MODEL = default_artifact()
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} is missing")
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["n", "c", "xs"],
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "c": {"enum": ["red", "green"]},
                         "xs": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}}


@pytest.fixture(scope="module")
def tokenizer():
    from ninfer_engine.artifact import open_artifact
    from ninfer_engine.tokenizer import Tokenizer

    with open_artifact(MODEL) as artifact:
        return Tokenizer.from_artifact(artifact)


def generate(tokenizer, samplers, steps=200, seed=0):
    """Random logits (noise a grammar must overrule) until every row sampled its EOS."""
    gen = torch.Generator().manual_seed(seed)
    out = [[] for _ in samplers]
    live = list(range(len(samplers)))
    for _ in range(steps):
        if not live:
            break
        logits = torch.randn((len(live), tokenizer.vocab_size), generator=gen) * 3
        tokens = sample_rows(logits, [samplers[i] for i in live])
        for i, token in zip(list(live), tokens):
            if token in tokenizer.eos_token_ids:
                live.remove(i)
            else:
                out[i].append(token)
    assert not live, "a constrained row never finished"
    return [tokenizer.decode(ids) for ids in out]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masked_rows_of_one_batch_follow_their_own_grammars(tokenizer, temperature):
    grammar = json_schema_grammar(SCHEMA)
    tools = tool_call_grammar([ToolSpec("f", SCHEMA, strict=True)], parallel=False)
    for seed in range(5):
        params = SamplingParams(temperature=temperature, seed=seed)
        rows = [Sampler(params, compile_constraint(tokenizer, grammar)),
                Sampler(params, compile_constraint(tokenizer, tools))]
        texts = generate(tokenizer, rows, seed=seed)
        value = json.loads(texts[0])
        assert set(value) == {"n", "c", "xs"} and value["c"] in ("red", "green")
        assert 0 <= value["n"] <= 99 and len(value["xs"]) <= 2
        body = texts[1].removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
        assert json.loads(body)["name"] == "f"


def test_logprobs_are_log_softmax_of_the_given_logits(tokenizer):
    sink: list = []
    sampler = Sampler(SamplingParams(temperature=0.7, top_k=40, frequency_penalty=1.0, seed=1),
                      compile_constraint(tokenizer, json_schema_grammar(SCHEMA)), 3, sink)
    gen = torch.Generator().manual_seed(0)
    for step in range(12):
        logits = torch.randn((2, tokenizer.vocab_size), generator=gen)
        token = sample_rows(logits[:1], [sampler])[0]
        expected = logits[0].log_softmax(-1)
        entry = sink[step]
        assert entry.token == token
        assert entry.logprob == pytest.approx(expected[token].item(), abs=1e-5)
        values, ids = expected.topk(3)
        assert [t for t, _ in entry.top] == ids.tolist()
        assert [v for _, v in entry.top] == pytest.approx(values.tolist(), abs=1e-5)


def test_a_forced_token_gets_an_entry_without_a_distribution():
    sink: list = []
    sampler = Sampler(SamplingParams(temperature=0.0), logprobs=0, logprob_sink=sink)
    sample_rows(torch.tensor([[0.0, 2.0, 1.0]]), [sampler])
    sampler.record(2)  # the engine forcing a thinking-close token
    assert [(e.token, e.top) for e in sink] == [(1, ()), (2, ())]
    assert sink[0].logprob == pytest.approx(torch.tensor([0.0, 2.0, 1.0]).log_softmax(-1)[1])
    assert sink[1].logprob is None


def test_a_grammar_waits_for_the_end_of_thinking(tokenizer):
    think_end = tuple(tokenizer.encode("</think>"))
    constraint = compile_constraint(tokenizer, json_schema_grammar(SCHEMA), think_end)
    sampler = Sampler(SamplingParams(temperature=0.0), constraint)
    for token in tokenizer.encode("free text"):
        sampler.record(token)
    assert not sampler.constrained
    for token in think_end:
        sampler.record(token)
    assert sampler.constrained
    text = generate(tokenizer, [sampler])[0]
    assert json.loads(text)["c"] in ("red", "green")
