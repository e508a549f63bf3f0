"""Grammar-aware drafting (`step.grammar_drafts`, issues 19 and 21): constrained rows draft, their
drafts cut to what the grammar accepts, their verify rows masked at every position. A tiny random
llama with the default model's real tokenizer (skipped when install.sh has not prepared it),
stepped on this thread so every run batches the same rows in the same order."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.constrained import (compile_constraint, json_schema_grammar, mask,
                                       tool_call_grammar)
from ninfer_engine.constrained.grammar import CLOSE, OPEN, ToolSpec
from ninfer_engine.engine import Engine
from ninfer_engine.step import grammar_drafts
from ninfer_engine.step.sampling import Sampler
from ninfer_engine.step.spec_policy import AlwaysSpeculate
from ninfer_engine.step.acceptance import accept_sampled
from ninfer_engine.types import GenerationRequest, SamplingParams

from .mask_helpers import MODEL, SCHEMA, drive, prompt, tokenizer_artifact, tokens

pytestmark = pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} is missing")
K = 3
VALUE = '{"n": 7, "c": "red", "xs": [true, false]}'


@pytest.fixture(scope="module")
def artifact():
    return tokenizer_artifact()


@pytest.fixture(scope="module")
def tokenizer(artifact):
    return engine_for(artifact, None).tokenizer


def engine_for(artifact, spec: str | None) -> Engine:
    engine = Engine(EngineConfig(artifact=Path("t.ninfer"), max_context=512, prefill_chunk=16,
                                 max_concurrency=8, spec=spec,
                                 draft_tokens=K if spec else None), artifact)
    if spec:
        engine.speculator.policy = AlwaysSpeculate()  # by the rules, not by step timings
    return engine


def grammars() -> dict[str, str]:
    return {"schema": json_schema_grammar(SCHEMA),
            "tool": tool_call_grammar([ToolSpec("f", SCHEMA, strict=True)], parallel=False)}


def batch(engine: Engine, sampling=SamplingParams(temperature=0.0)) -> list[GenerationRequest]:
    """A json_schema row and a forced-tool row whose prompts repeat what they must write (prompt
    lookup has something to propose), and a plain row beside them."""
    call = OPEN + json.dumps({"name": "f", "arguments": json.loads(VALUE)}) + CLOSE
    texts = {"schema": " ".join([VALUE] * 4), "tool": " ".join([call] * 3)}
    out = [GenerationRequest(name, prompt(engine, texts[name]), sampling, 80,
                             constraint=compile_constraint(engine.tokenizer, grammar))
           for name, grammar in grammars().items()]
    out.append(GenerationRequest("plain", prompt(engine, texts["schema"]), sampling, 30,
                                 ignore_eos=True))
    return out


def run(artifact, spec, install=None, sampling=SamplingParams(temperature=0.0)):
    engine = engine_for(artifact, spec)
    if install is not None:
        install(engine)
    try:
        events = drive(engine, batch(engine, sampling))
    finally:
        engine.stop()
    return engine, events


def accepted_by_grammar(engine: Engine, name: str, out: list[int]) -> bool:
    """The output before its EOS is complete under the grammar, and the EOS ends it."""
    replay = compile_constraint(engine.tokenizer, grammars()[name])
    assert out[-1] in engine.tokenizer.eos_token_ids
    return (replay.matcher.consume_tokens(out[:-1]) and replay.matcher.is_accepting()
            and replay.matcher.consume_token(out[-1]) and replay.matcher.is_stopped())


class GrammarSteered:
    """Drafts from the plain run's tokens: the first j true (j cycling through 0..K), then one
    wrong token: one the grammar allows there (always after no true draft, at a position with
    a choice, so acceptance 0 occurs; else in turns), or one it refuses. Records per round
    how many drafts the grammar should leave (j, plus the wrong one where allowed)."""

    def __init__(self, engine: Engine, plain: dict[str, list[int]]) -> None:
        self.engine, self.plain = engine, plain
        # per round: (drafts proposed, drafts the grammar leaves, drafts greedy takes)
        self.expected: dict[str, list[tuple[int, int, int]]] = {name: [] for name in plain}
        self._turns = {name: 0 for name in plain}

    def propose_rows(self, seqs, ks):
        return [self._propose(seq, k) if seq.id in self.plain and k else [] for seq, k in
                zip(seqs, ks)]

    def _propose(self, seq, k):
        want, done = self.plain[seq.id], len(seq.output)
        truth = want[done: len(want) - 1][:k]  # never the EOS itself
        turn = self._turns[seq.id]
        j = min(turn % (K + 1), len(truth))
        if j == k or done + j >= len(want) - 1:
            self._turns[seq.id] += 1
            self.expected[seq.id].append((j, j, j))
            return truth[:j]
        replay = compile_constraint(self.engine.tokenizer, grammars()[seq.id])
        for token in want[: done + j]:
            replay.advance(token)
        allowed = mask.allowed(mask.bitmasks([replay]), replay.vocab, torch.device("cpu"))[0]
        allowed[want[done + j]] = False  # wrong: never the true token
        others = allowed.nonzero()[:, 0].tolist()
        if j == 0 and not others:
            return []  # a forced token: acceptance 0 waits for a position with a choice
        self._turns[seq.id] += 1
        take_allowed = (j == 0 or (turn // (K + 1)) % 2 == 0) and others
        wrong = others[0] if take_allowed else int((~allowed).nonzero()[0, 0])
        self.expected[seq.id].append((j + 1, j + bool(take_allowed), j))
        return [*truth[:j], wrong]


def test_greedy_constrained_outputs_are_plain_decodings_with_ngram_and_steered_drafts(artifact):
    plain_engine, plain = run(artifact, None)
    want = {name: tokens(plain[name]) for name in grammars()}
    steered = []
    ngram_engine, ngram = run(artifact, "ngram")
    _, forced = run(artifact, "ngram", lambda engine: (
        steered.append(GrammarSteered(engine, want)),
        setattr(engine.speculator, "drafter", steered[0])))
    for name in [*grammars(), "plain"]:
        assert tokens(ngram[name]) == tokens(forced[name]) == tokens(plain[name]), name
    for name in grammars():
        assert plain[name][-1].finish == "stop"
        assert accepted_by_grammar(plain_engine, name, want[name])
        # prompt lookup drafted for the constrained rows, and some drafts were taken
        t = ngram[name][-1].timings
        assert t.draft_n > 0 and t.draft_accepted > 0, name
        # the steered rows: every acceptance length, and exactly the drafts the grammar allows
        t = forced[name][-1].timings
        expected = steered[0].expected[name]
        assert set(t.draft_rounds) == set(range(K + 1)), (name, t.draft_rounds)
        assert t.draft_n == sum(kept for _, kept, _ in expected)
        assert t.draft_accepted == sum(taken for _, _, taken in expected)
        assert t.draft_n < sum(proposed for proposed, _, _ in expected)  # some were cut
    # the engine's counters include the constrained rows' rounds
    c = ngram_engine.speculator.counters
    assert c.drafted == sum(ngram[name][-1].timings.draft_n for name in ngram)


def test_a_sampled_constrained_row_reproduces_from_its_seed(artifact):
    sampling = SamplingParams(temperature=1.0, top_k=40, seed=11)
    runs = [run(artifact, "ngram", sampling=sampling) for _ in range(2)]
    (engine, first), (_, second) = runs
    for name in grammars():
        assert tokens(first[name]) == tokens(second[name])
        assert first[name][-1].finish == "stop"
        assert accepted_by_grammar(engine, name, tokens(first[name]))
    assert sum(first[name][-1].timings.draft_n for name in grammars()) > 0


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)[len(tokenizer.encode("")):]


def constraint_at(tokenizer, text: str, start_after=()):
    """The schema's constraint after `text` (whose tokens it must allow)."""
    constraint = compile_constraint(tokenizer, grammars()["schema"], start_after)
    for token in encode(tokenizer, text):
        constraint.advance(token)
    return constraint


class Row:
    def __init__(self, constraint, rid="r"):
        self.id, self.sampler = rid, Sampler(SamplingParams(temperature=0.0), constraint)


def sequential_masks(tokenizer, text: str, drafts: list[int]) -> torch.Tensor:
    """The masks plain decoding would apply after each prefix of `drafts` (a fresh replay)."""
    replay = constraint_at(tokenizer, text)
    rows = []
    for token in [*drafts, None]:
        rows.append(mask.bitmasks([replay])[0])
        if token is not None:
            replay.advance(token)
    return torch.stack(rows)


def test_drafts_are_cut_where_the_grammar_refuses_or_stops(tokenizer):
    constraint = constraint_at(tokenizer, '{"n": 7, "c": "re')
    good, eos = encode(tokenizer, 'd", "xs": []}'), tokenizer.eos_token_ids[0]
    row, version = Row(constraint), constraint.version
    # a refused token (a second brace) ends the drafts before it
    [cut] = grammar_drafts.cut([row], [good[:2] + encode(tokenizer, "{") + good[2:]])
    assert cut == good[:2]
    held = constraint.verify
    assert held[:2] == (version, tuple(cut))
    assert torch.equal(held[2], sequential_masks(tokenizer, '{"n": 7, "c": "re', cut))
    assert constraint.version == version and constraint.draftable(good) == len(good)
    # the grammar's EOS stops it: nothing could follow, so the EOS is not drafted
    [cut] = grammar_drafts.cut([row], [good + [eos]])
    assert cut == good
    # a row whose drafts are all refused decodes plainly, with no masks held
    [cut] = grammar_drafts.cut([row], [encode(tokenizer, "{")])
    assert cut == [] and constraint.verify is None


def test_drafts_end_before_the_token_that_starts_a_waiting_grammar(tokenizer):
    start, free = encode(tokenizer, "</think>")[-2:], encode(tokenizer, "hmm")[-1:]
    constraint = constraint_at(tokenizer, "", start_after=start)
    assert constraint.draftable([*free, *start, 90]) == 2  # up to start's last token
    [cut] = grammar_drafts.cut([Row(constraint)], [[*free, *start, 90]])
    assert cut == [*free, start[0]] and constraint.verify is None and not constraint.active


# chi-square critical value at significance 0.001 for 6 degrees of freedom
CHI2_0001_DF6 = 22.458


def test_rejection_sampling_of_a_constrained_row_follows_the_masked_distribution(tokenizer):
    """Position 0 of `{"n": 7, "c": "` allows 7 tokens (the enum's prefixes): the emitted first
    token follows the target's distribution renormalised over them, whatever the draft; the
    token after a taken draft is one the grammar allows after it."""
    constraint = constraint_at(tokenizer, '{"n": 7, "c": "')
    logits = torch.randn(2, constraint.vocab, generator=torch.Generator().manual_seed(3))
    bits = sequential_masks(tokenizer, '{"n": 7, "c": "', [])
    allowed = mask.allowed(bits, constraint.vocab, torch.device("cpu"))[0]
    support = allowed.nonzero()[:, 0]
    assert len(support) == 7
    draft = int(support[2])
    after = mask.allowed(sequential_masks(tokenizer, '{"n": 7, "c": "', [draft])[1:],
                         constraint.vocab, torch.device("cpu"))[0]
    counts, taken = torch.zeros(constraint.vocab, dtype=torch.float64), 0
    params = SamplingParams(temperature=1.0)
    for seed in range(3000):
        sampler = Sampler(dataclasses.replace(params, seed=seed), constraint)
        emitted = accept_sampled([(sampler, [draft], logits)])[0]
        counts[emitted[0]] += 1
        if emitted[0] == draft:
            taken += 1
            assert after[emitted[1]]
    assert counts[~allowed].sum() == 0  # nothing outside the grammar, ever
    probs = logits[0, support].double().softmax(-1)
    expected = probs * counts.sum()
    assert float(((counts[support] - expected) ** 2 / expected).sum()) < CHI2_0001_DF6
    assert taken > 100


def test_a_failed_mask_fill_leaves_the_rows_to_plain_decoding(tokenizer, monkeypatch):
    constraint = constraint_at(tokenizer, '{"n": 7, "c": "re')

    def broken(rows, bits):
        raise RuntimeError("the fill broke")

    monkeypatch.setattr(mask, "fill_drafts", broken)
    assert grammar_drafts.cut([Row(constraint)], [encode(tokenizer, 'd", ')]) == [[]]
    assert constraint.verify is None and not constraint.matcher.is_error()
