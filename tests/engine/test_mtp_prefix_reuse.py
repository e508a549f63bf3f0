"""`--spec mtp` with prefix reuse: the MTP layer's K/V of each pair (the pool's layer after the
target's) and the target's hidden (a drafter row) live with the KV pages (`step.mtp_drafter`),
so a restored prefix brings the MTP context along.

Greedy output with MTP and reuse equals MTP without reuse and plain decoding for the same prompt
twice, a shared system prompt and a conversation's second turn, also when the pages went
through the host tier; a restore holds exactly the K/V of pairs 0..m-2 the first request
computed, and h_{m-1} as it saw it; those K/V are a fresh build's (to the rounding of their
projection), and the restored request's first drafts are those of the run without reuse;
nothing leaks."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.step.mtp_drafter import SPILL
from tests.tolerance import TRANSCENDENTAL, bound
from . import test_dflash_prefix_reuse
from .test_dflash_prefix_reuse import (TOKENS, _no_leaks, _prompts, _serve, _tokens,
                                       serve_through_the_host_tier)
from .test_mtp_speculation import MtpArtifact
from .test_speculation import _engine as engine_with

SETTINGS = dict(max_concurrency=2, prefill_chunk=16, draft_tokens=3)


class _Recorder:
    """What the engine's MTP drafter saw and computed, per request: each position's committed
    hidden (the last observed), each pair's K/V as stored, each restore, each proposal, the
    most hiddens it held pending."""

    def __init__(self, drafter) -> None:
        self.hidden, self.kv, self.restored, self.proposed = {}, {}, [], {}
        self.pending: dict[str, int] = {}
        observe, store, restore, propose = (drafter.observe, drafter._store, drafter._restore,
                                            drafter.propose_rows)

        def recording_observe(seq, position, hidden):
            seen = self.hidden.setdefault(seq.id, {})
            seen.update({position + i: h.clone() for i, h in enumerate(hidden)})
            observe(seq, position, hidden)
            held = len(drafter._rows[id(seq)].pending)
            self.pending[seq.id] = max(self.pending.get(seq.id, 0), held)

        def recording_store(seq, row, n):
            kv = self.kv.setdefault(seq.id, {})
            k, v = seq.cache.read(drafter.layer, row.done)  # the pool's MTP layer
            for j in range(row.done - n, row.done):
                kv[j] = (k[j].clone(), v[j].clone())
            store(seq, row, n)

        def recording_restore(seq, position, hidden):
            row = restore(seq, position, hidden)  # (as built: the request goes on with it)
            k, v = seq.cache.read(drafter.layer, row.done)
            self.restored.append((position, k.transpose(0, 1).clone(), v.transpose(0, 1).clone(),
                                  row.pending[0].clone()))
            return row

        def recording_propose(seqs, ks):
            out = propose(seqs, ks)
            for seq, drafts in zip(seqs, out):
                if drafts:
                    self.proposed.setdefault(seq.id, []).append((seq.cached, drafts))
            return out

        drafter.observe, drafter._store = recording_observe, recording_store
        drafter._restore, drafter.propose_rows = recording_restore, recording_propose


def _check_restored(recorder: _Recorder, first: str, tokens: list[int], reused: int,
                    head) -> None:
    """The one restore of `reused` positions holds exactly the K/V of pairs 0..reused-2 that
    request `first` computed and its h_{reused-1}; and those K/V are a fresh build's: the head
    over (h_j, x_{j+1}), j < reused-1, in one call."""
    assert len(recorder.restored) == 1
    position, k, v, last = recorder.restored[0]
    kv, hidden = recorder.kv[first], recorder.hidden[first]
    assert position == reused and k.shape[1] == v.shape[1] == reused - 1
    assert torch.equal(k, torch.stack([kv[j][0] for j in range(reused - 1)], 1))
    assert torch.equal(v, torch.stack([kv[j][1] for j in range(reused - 1)], 1))
    assert torch.equal(last, hidden[reused - 1])
    n, dev = reused - 1, k.device
    fresh = head.new_cache()
    head(torch.tensor(tokens[1: reused], device=dev),
         torch.stack([hidden[j] for j in range(n)]), [fresh], [n], torch.arange(n, device=dev))
    H, D = head.target.config["hidden_size"], head.block.mixer.d
    # k: the hidden norm's length-H sum of squares, fc's length-2H dot, the layer's input norm
    # (H), the projection's length-H dot, k_norm's length-D sum; three rsqrts, each norm's
    # scale and weight, RoPE's two products and sum; v: a prefix of that chain
    depth = 5 * H + D + 3 * TRANSCENDENTAL + 9
    for got, ref in ((k, fresh.k[:, :n]), (v, fresh.v[:, :n])):
        assert (got - ref).abs().max() <= bound(head.target.dtype, depth) * ref.abs().max()


@pytest.mark.parametrize("case", ["same prompt", "shared system prompt", "second turn"])
def test_greedy_output_with_reuse_is_that_without_and_the_restored_kv_a_fresh_one(case):
    artifact, prompts = MtpArtifact("qwen3_5"), _prompts(case, seed=37)
    plain = engine_with(artifact, None, no_prefix_reuse=True, **SETTINGS)
    alone = engine_with(artifact, "mtp", no_prefix_reuse=True, **SETTINGS)
    reuse = engine_with(artifact, "mtp", **SETTINGS)
    without, recorder = _Recorder(alone.speculator.drafter), _Recorder(reuse.speculator.drafter)
    pages, slots = reuse.memory.allocator.free, reuse.memory.free_state_slots
    try:
        want, plain_mtp, got = (_serve(plain, prompts), _serve(alone, prompts),
                                _serve(reuse, prompts))
        for engine in (plain, alone, reuse):
            engine.stop()
        _no_leaks(reuse, pages, slots)
    finally:
        for engine in (plain, alone, reuse):
            engine.stop()
    assert [t for t, _ in got] == [t for t, _ in plain_mtp] == [t for t, _ in want]
    assert [c for _, c in plain_mtp] == [0, 0]
    reused = got[1][1]
    expected = {"same prompt": 69,  # all but the prompt's last token: its logits are needed
                "shared system prompt": 64,  # the chunk snapshot inside the shared 80
                "second turn": 50 + TOKENS - 1}[case]  # the answer, but its unread last token
    assert got[0][1] == 0 and reused == expected
    counters = reuse.speculator.counters
    assert counters.rounds > 0 and counters.accepted < counters.drafted
    second = prompts[1](got) if callable(prompts[1]) else prompts[1]
    _check_restored(recorder, "r0", list(second), reused, reuse.speculator.drafter.head)
    # the restored request drafts as it does when it computed its whole prompt itself
    assert recorder.proposed["r1"] == without.proposed["r1"]


def test_pages_back_from_the_host_tier_bring_the_mtp_rows():
    """The host tier carries the MTP rows with the pages (`kv.host_tier`)."""
    want, got, stats, tiered, recorder = serve_through_the_host_tier(
        MtpArtifact("qwen3_5"), "mtp", _Recorder, SETTINGS)
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [c for _, c in got] == [0, 0, 0, 129] and stats.host_restored_pages >= 2
    prompt = list(_tokens(130, 41) + _tokens(8, 44))  # the restoring request's
    _check_restored(recorder, "r0", prompt, 129, tiered.speculator.drafter.head)


def test_a_request_that_never_drafts_still_leaves_its_mtp_rows_for_the_next(monkeypatch):
    """The first request asks for log-probabilities, so it never drafts; it is observed all the
    same, its pairs run every `SPILL` positions and the rest at its end (`forget`), and its
    second turn restores them."""
    tokens = 2 * SPILL  # an answer long enough to spill
    monkeypatch.setattr(test_dflash_prefix_reuse, "TOKENS", tokens)
    artifact, prompts = MtpArtifact("qwen3_5_moe"), _prompts("second turn", seed=53)
    plain = engine_with(artifact, None, no_prefix_reuse=True, **SETTINGS)
    reuse = engine_with(artifact, "mtp", **SETTINGS)
    recorder = _Recorder(reuse.speculator.drafter)
    try:
        want, got = _serve(plain, prompts), _serve(reuse, prompts, logprobs=(0,))
    finally:
        plain.stop()
        reuse.stop()
    reused = 50 + tokens - 1
    assert [t for t, _ in got] == [t for t, _ in want] and got[1][1] == reused
    assert "r0" not in recorder.proposed and reuse.speculator.counters.rounds > 0
    # a spill leaves the one hidden whose pair waits for the next token
    assert recorder.pending["r0"] == SPILL + 1
    _check_restored(recorder, "r0", list(prompts[1](got)), reused,
                    reuse.speculator.drafter.head)
