"""`--spec dflash` on the CPU engine: a random DFlash drafter (`ninfer synth --dflash small`'s
draws) over the tiny hybrid models, greedy output exactly that of plain decoding at k = 1, 3, 7
with two requests at once, every acceptance length exercised, and each proposal equal to that of
a drafter whose context is built afresh from one plain forward's tap features of the committed
tokens (so the context never keeps a rejected column's features); sampled runs reproduce with
their seed; `--spec dflash2` (a random DFlash2 drafter) greedy as plain decoding too; a missing
or mismatched component fails naming what is missing."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.engine import EngineLoadError
from ninfer_engine.models.dflash import DFlashContext
from ninfer_engine.step.dflash_drafter import SPILL
from ninfer_engine.step.spec_policy import SpecPolicy
from ninfer_engine.types import SamplingParams

from .dflash_helpers import DFlashArtifact
from .helpers import FakeArtifact, tiny_llama
from .steered import Steered
from .test_speculation import _engine as engine_with, _prompts, _run

TOKENS = 24


def _three_prompts():
    """Three prompts for two concurrent rows: the third starts when one of the first ends."""
    return [*_prompts(120), tuple(range(40, 61))]


class _Steered(Steered):
    """`Steered` that also keeps the most features the DFlash drafter held pending after an
    observation."""

    def __init__(self, drafter, want: dict[str, list[int]], vocab: int) -> None:
        super().__init__(drafter, want, vocab)
        self.pending = 0

    def observe(self, seq, position, features):
        super().observe(seq, position, features)
        row = self.drafter._rows.get(id(seq))
        self.pending = max(self.pending, len(row.pending))


def _plain(artifact, prompts, tokens=TOKENS):
    engine = engine_with(artifact, None, max_concurrency=2, prefill_chunk=16)
    try:
        return _run(engine, prompts, tokens)
    finally:
        engine.stop()


@pytest.mark.parametrize("backend", ["dflash", "dflash2"])
def test_greedy_output_is_the_same_with_and_without_the_drafters_own_drafts(backend):
    artifact = DFlashArtifact("qwen3_5", dflash2=backend == "dflash2")
    prompts = _three_prompts()
    engine = engine_with(artifact, backend, max_concurrency=2, prefill_chunk=16,
                         draft_tokens=7)
    try:
        drafted = _run(engine, prompts, TOKENS)
    finally:
        engine.stop()
    assert drafted == _plain(artifact, prompts)
    c, spec = engine.speculator.counters, engine.snapshot().spec
    assert c.rounds > 0 and c.drafted >= c.rounds and len(c.per_position) == 7
    assert spec.backend == backend and spec.window == 7


@pytest.mark.parametrize("k", [1, 3, 7])
def test_greedy_output_is_the_same_at_every_acceptance_length(k):
    """Steered drafts (`_Steered`): 0..k of each round's drafts taken."""
    artifact, prompts = DFlashArtifact("qwen3_5"), _three_prompts()
    plain = _plain(artifact, prompts)
    engine = engine_with(artifact, "dflash", max_concurrency=2, prefill_chunk=16,
                         draft_tokens=k)
    _Steered.install(engine, plain)
    try:
        assert _run(engine, prompts, TOKENS) == plain
    finally:
        engine.stop()
    c = engine.speculator.counters
    assert c.per_position[k - 1] > 0 and c.accepted < c.drafted  # all k taken, and fewer


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_dflash_context_after_partial_acceptance_is_the_committed_one(family):
    artifact, prompts = DFlashArtifact(family), _three_prompts()
    plain = _plain(artifact, prompts)
    want = {f"r{i}": tokens for i, tokens in enumerate(plain)}
    engine = engine_with(artifact, "dflash", max_concurrency=2, prefill_chunk=16,
                         draft_tokens=5)
    drafter = engine.speculator.drafter
    steered = engine.speculator.drafter = _Steered(drafter, want, engine.model.vocab_size)
    try:
        assert _run(engine, prompts, TOKENS) == plain
    finally:
        engine.stop()
    c = engine.speculator.counters
    assert 0 < c.accepted < c.drafted and all(c.per_position)  # k drafts taken, and fewer
    # a few steps' columns at most: the rest joined the context
    assert steered.pending <= SPILL + 1 + 5
    _check_fresh(engine, drafter, prompts, plain, steered.proposed)


def _check_fresh(engine, drafter, prompts, plain, proposed):
    """Each proposal against a context built at once from one plain forward's tap features of
    positions 0..L-1, then the block [x_L, MASK×k]."""
    model, dflash = engine.model, drafter.model
    for rid, last, drafts in proposed:
        i = int(rid[1:])
        tokens = [*prompts[i], *plain[i]]
        ids = torch.tensor(tokens[:last], device=model.device)
        _, features = model.forward_rows(ids, [model.new_state()], [last], keep_hidden=True)
        ctx = DFlashContext(dflash, 0)
        dflash.extend(ctx, features)
        h = dflash.propose([tokens[last]], [ctx], [len(drafts)])[0]
        logits = dflash.logits(h)[:, : drafter.vocab]
        logits[:, dflash.config.mask_token] = float("-inf")
        assert logits.argmax(-1).tolist() == drafts, (rid, last)


class _Late(SpecPolicy):
    """No drafting for the first `steps` steps, then every step."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.left = steps

    def speculate(self, batch: int) -> bool:
        self.left -= 1
        return self.left < 0


def test_a_row_that_did_not_draft_for_a_while_drafts_from_its_whole_context():
    """Plain decode steps past SPILL positions: the committed features join the context at an
    observation, and the first proposals after them are those of a fresh context."""
    artifact, prompts = DFlashArtifact("qwen3_5"), _three_prompts()[:2]
    plain = _plain(artifact, prompts, 2 * SPILL + 16)
    engine = engine_with(artifact, "dflash", max_concurrency=2, prefill_chunk=16,
                         draft_tokens=3)
    drafter = engine.speculator.drafter
    steered = _Steered.install(engine, plain)
    engine.speculator.policy = _Late(2 * SPILL)
    try:
        assert _run(engine, prompts, 2 * SPILL + 16) == plain
    finally:
        engine.stop()
    assert steered.proposed and steered.pending <= SPILL + 1 + 3
    assert min(last for _, last, _ in steered.proposed) > len(prompts[0]) + SPILL
    _check_fresh(engine, drafter, prompts, plain, steered.proposed)


@pytest.mark.parametrize("backend", ["dflash", "dflash2"])
def test_a_sampled_request_verifies_dflash_drafts_and_its_seed_reproduces_it(backend,
                                                                             monkeypatch):
    """(dflash2: its walk samples the drafts, and each verified round hands the rejection
    test the walk's proposal distributions.)"""
    from ninfer_engine.step import acceptance

    artifact, runs = DFlashArtifact("qwen3_5_moe", dflash2=backend == "dflash2"), []
    proposals, accept_sampled = [], acceptance.accept_sampled

    def spy(rows):
        proposals.extend(row[3] if len(row) > 3 else None for row in rows)
        return accept_sampled(rows)
    monkeypatch.setattr(acceptance, "accept_sampled", spy)
    for _ in range(2):
        engine = engine_with(artifact, backend, max_concurrency=2, draft_tokens=7)
        try:
            runs.append(_run(engine, _three_prompts()[:2], 16,
                             SamplingParams(temperature=0.8, seed=7)))
        finally:
            engine.stop()
        assert engine.speculator.counters.drafted > 0
    assert runs[0] == runs[1] and [len(r) for r in runs[0]] == [16, 16]
    assert proposals and all((p is not None) == (backend == "dflash2") for p in proposals)


def test_spec_dflash_without_a_usable_component_names_what_is_missing():
    with pytest.raises(EngineLoadError, match="--spec dflash needs a dflash component .* "
                                              "has none"):
        engine_with(DFlashArtifact("qwen3_5", with_dflash=False), "dflash")
    with pytest.raises(EngineLoadError, match="--spec dflash needs a Qwen3.5-family model"):
        engine_with(FakeArtifact(tiny_llama(seed=5, vocab_size=259)), "dflash")
    with pytest.raises(EngineLoadError, match="--spec dflash2 needs a dflash2 component .* "
                                              "has none"):
        engine_with(DFlashArtifact("qwen3_5"), "dflash2")


@pytest.mark.parametrize("change, message", [
    (lambda c: c["dflash_config"].update(target_layer_ids=[0, 9]),
     r"taps layers \[0, 9\], beyond 0..2 of the target's 4 layers"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[3]),
     r"taps layers \[3\], beyond 0..2"),  # the last layer's HF hidden state is final-normed
    (lambda c: c.update(hidden_size=32), "is 32 wide, the target 64"),
    (lambda c: c["dflash_config"].update(mask_token_id=500), "masks with token 500"),
    (lambda c: c.update(sliding_window=None), "has sliding layers but no sliding_window"),
    (lambda c: c.update(architectures=["DFlash2DraftModel"]),
     'the dflash component of .* is "DFlash2DraftModel", not DFlashDraftModel'),
    (lambda c: c.update(block_size=4), "--draft-tokens 7 is more than the drafter's block of 4 "
                                       r"holds \(its anchor and at most 3 masks\)"),
])
def test_a_drafter_that_does_not_fit_the_target_fails_in_one_line(change, message):
    artifact = DFlashArtifact("qwen3_5")
    change(artifact.drafter_config)
    with pytest.raises(EngineLoadError, match=message) as failure:
        engine_with(artifact, "dflash", draft_tokens=7)
    assert "\n" not in str(failure.value)
