"""Grammar masks prefetched during the forward (`constrained.prefetch`, issue 21): a tiny random
llama with the default model's real tokenizer (skipped when install.sh has not prepared it),
driven step by step on this thread so every run batches the same rows in the same order."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.constrained import (compile_constraint, json_schema_grammar, mask, prefetch,
                                       tool_call_grammar)
from ninfer_engine.constrained.grammar import ToolSpec
from ninfer_engine.engine import Engine
from ninfer_engine.types import GenerationRequest, SamplingParams

from .mask_helpers import (MODEL, SCHEMA, check_masks, drive, prompt, record_masks,
                           tokenizer_artifact, tokens)

pytestmark = pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} is missing")


@pytest.fixture(scope="module")
def artifact():
    return tokenizer_artifact()


@pytest.fixture(autouse=True)
def counters(monkeypatch):
    monkeypatch.setattr(prefetch, "ENABLED", True)
    prefetch.COUNTERS.reset()
    return prefetch.COUNTERS


def engine_for(artifact, **config) -> Engine:
    settings = dict(artifact=Path("t.ninfer"), max_context=512, prefill_chunk=16,
                    max_concurrency=8)
    return Engine(EngineConfig(**{**settings, **config}), artifact)


def grammars() -> list[str]:
    return [json_schema_grammar(SCHEMA),
            tool_call_grammar([ToolSpec("f", SCHEMA, strict=True)], parallel=False)]


def requests(engine: Engine, constraints: dict[str, object]) -> list[GenerationRequest]:
    """Greedy and seeded sampled rows under the two grammars, and two plain rows."""
    out = []
    for i in range(6):
        sampling = (SamplingParams(temperature=0.0) if i % 2 == 0
                    else SamplingParams(temperature=1.0, top_k=40, seed=i))
        rid = f"r{i}"
        constraint = None
        if i < 4:
            constraint = compile_constraint(engine.tokenizer, grammars()[i // 2])
            constraints[rid] = (constraint, grammars()[i // 2])
        out.append(GenerationRequest(rid, prompt(engine, f"item {i} as JSON"), sampling,
                                     max_tokens=60, constraint=constraint))
    return out


def test_prefetched_masks_equal_synchronous_masks_over_whole_generations(artifact, monkeypatch,
                                                                          counters):
    applied = record_masks(monkeypatch)
    engine = engine_for(artifact)
    constraints: dict = {}
    events = drive(engine, requests(engine, constraints))
    engine.stop()
    for rid, (constraint, grammar) in constraints.items():
        out = tokens(events[rid])
        assert events[rid][-1].finish == "stop", rid  # the grammar ended it, at its EOS
        check_masks(applied, constraint, grammar, out,
                    lambda g: compile_constraint(engine.tokenizer, g))
    text = engine.tokenizer.decode(tokens(events["r0"])[:-1])
    assert set(json.loads(text)) == {"n", "c", "xs"}
    # every token was prefetched: each request's first during its prompt's forward
    total = sum(len(tokens(events[rid])) for rid in constraints)
    assert (counters.prefetched_rows, counters.sync_rows) == (total, 0)


def test_outputs_are_the_same_with_and_without_prefetch(artifact, monkeypatch, counters):
    """Greedy and seeded sampled rows: the same tokens whether masks were prefetched or not."""
    outputs = []
    for enabled in (False, True):
        monkeypatch.setattr(prefetch, "ENABLED", enabled)
        counters.reset()
        engine = engine_for(artifact)
        events = drive(engine, requests(engine, {}))
        engine.stop()
        outputs.append({rid: tokens(e) for rid, e in events.items()})
        assert (counters.prefetched_rows > 0) == enabled
    assert outputs[0] == outputs[1]


def test_a_fill_writes_every_word_of_its_rows(artifact):
    """Fills go into unzeroed buffers (`new_buffer(zeroed=False)`): llguidance must write every
    word of a row, the bits past the vocabulary too. The default model's tokenizer with its
    vocabulary padded by 13 tokens (as Qwen3.5's 248,077 leave 13 bits of the last word in
    use); rows at the start and inside the document."""
    import llguidance

    engine = engine_for(artifact)
    tokenizer = engine.tokenizer
    engine.stop()
    vocab = tokenizer.vocab_size + 13
    view = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab,
                                  eos_token=list(tokenizer.eos_token_ids))
    grammar = json_schema_grammar(SCHEMA)
    rows = [llguidance.LLMatcher(view, grammar, log_level=0) for _ in range(3)]
    for token in tokenizer.encode('{"n": 5, "c": "red", "xs": [true')[:6]:
        assert rows[1].consume_token(token)
    pairs = [(m, i) for i, m in enumerate(rows)]
    zeroed = mask.new_buffer(3, vocab)
    mask.fill(pairs, zeroed)
    junk = torch.full_like(zeroed, -1)
    mask.fill(pairs, junk)
    assert torch.equal(junk, zeroed) and zeroed.any() and not (zeroed[:, -1] >> 13).any()


def test_a_mask_prefetched_before_the_constraint_advanced_is_filled_again(artifact, counters):
    engine = engine_for(artifact)
    constraint = compile_constraint(engine.tokenizer, grammars()[0])
    before = mask.bitmasks([compile_constraint(engine.tokenizer, grammars()[0])])[0]
    prefetch.start([constraint])
    fill = constraint.prefetched[0]
    brace = engine.tokenizer.encode("{")[-1]
    constraint.advance(brace)  # while the fill may still run: waits for it, then advances
    got = prefetch.bitmasks([constraint])[0]
    fresh = compile_constraint(engine.tokenizer, grammars()[0])
    fresh.advance(brace)
    assert torch.equal(got, mask.bitmasks([fresh])[0])
    assert torch.equal(fill.buffer[0], before) and not torch.equal(got, before)
    assert (counters.prefetched_rows, counters.sync_rows) == (0, 1)
    # a current one is taken as it was filled, once
    prefetch.start([constraint])
    assert torch.equal(prefetch.bitmasks([constraint])[0], got)
    assert (counters.prefetched_rows, counters.sync_rows) == (1, 1)
    assert constraint.prefetched is None
    prefetch.bitmasks([constraint])
    assert counters.sync_rows == 2


def test_a_request_that_leaves_its_grammar_fails_alone(artifact, counters):
    """A token the grammar refuses (as a forced one could be) reaches one row's matcher after
    its third token: that request ends with an error; the others, constrained or not, produce
    what they produce without it (greedy, same batch until then)."""
    runs = []
    for sabotage in (False, True):
        engine = engine_for(artifact)
        constraints: dict = {}
        batch = requests(engine, constraints)
        if sabotage:
            victim = constraints["r2"][0]
            real_advance, calls = victim.advance, []
            refused = engine.tokenizer.encode("Hello")[-1]  # no free text in this grammar

            def advance(token, real_advance=real_advance, calls=calls, refused=refused):
                calls.append(token)
                real_advance(refused if len(calls) == 3 else token)
            victim.advance = advance
        runs.append(drive(engine, batch))
        engine.stop()
    plain, broken = runs
    assert broken["r2"][-1].finish == "error"
    assert "left its grammar" in broken["r2"][-1].error.message
    assert len(tokens(broken["r2"])) == 3
    for rid in ("r0", "r1", "r3", "r4", "r5"):
        assert broken[rid][-1].finish == plain[rid][-1].finish != "error"
        assert tokens(broken[rid]) == tokens(plain[rid]), rid


def test_a_fill_that_cannot_start_leaves_the_masks_to_sampling(artifact, monkeypatch, counters):
    engine = engine_for(artifact)
    constraint = compile_constraint(engine.tokenizer, grammars()[0])

    def refuse(*args, **kwargs):
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(prefetch, "_worker", lambda: type("Gone", (), {"submit": refuse})())
    prefetch.start([constraint])
    assert constraint.prefetched is None and constraint.inflight is None
    fresh = compile_constraint(engine.tokenizer, grammars()[0])
    assert torch.equal(prefetch.bitmasks([constraint])[0], mask.bitmasks([fresh])[0])
    assert (counters.fills, counters.sync_rows) == (0, 1)


def test_a_failed_background_fill_is_filled_at_sampling(artifact, monkeypatch, counters):
    engine = engine_for(artifact)
    constraint = compile_constraint(engine.tokenizer, grammars()[0])

    def broken(pairs, buffer):
        raise RuntimeError("the fill broke")

    monkeypatch.setattr(prefetch, "_run", broken)
    prefetch.start([constraint])
    fresh = compile_constraint(engine.tokenizer, grammars()[0])
    assert torch.equal(prefetch.bitmasks([constraint])[0], mask.bitmasks([fresh])[0])
    assert (counters.fills, counters.prefetched_rows, counters.sync_rows) == (1, 0, 1)
