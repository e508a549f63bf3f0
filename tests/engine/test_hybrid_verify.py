"""Verify rows in the hybrid graph step (`HybridStep` with q_len = 1 + k): a speculative
verify row of the last sampled token and k drafts against k + 1 sequential decode steps of the
same step, and `keep` (rollback) to any accepted prefix against the sequential state there.

Both sides run the same kernels per token; they differ where the projections see B·(1 + k)
rows instead of B, so the bounds are `test_hybrid_graphs`'s bf16 chain bounds.
"""
from __future__ import annotations


import pytest
import torch

from ninfer_engine.step.decode_graphs import DecodeGraphs
from ninfer_engine.models.qwen3_5_engine_step import EngineHybridDecoder
from ninfer_engine.kernels.paged_kv import PAGE

from .test_hybrid_graphs import _model, _prefilled, _rel, _storage, _tols


def _setup(model, kv_dtype, k, capture, keep_hidden=False):
    storage, states = _storage(model, kv_dtype), model.state_pool(3)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (7, 62)]
    seqs = [_prefilled(model, storage, states, p) for p in prompts]
    decoder = EngineHybridDecoder(model, storage, states, 2, 512, max_q=1 + k,
                                  keep_hidden=keep_hidden)
    drafts = [torch.randint(0, 512, (k,), generator=gen).tolist() for _ in seqs]
    for seq in seqs:
        assert seq.cache.reserve(seq.cached + 1 + k)
    return storage, states, seqs, DecodeGraphs(decoder, capture), drafts


@pytest.mark.parametrize("moe,k", [(False, 3), (True, 2), (False, 1)])
@torch.inference_mode()
def test_verify_row_gives_the_sequential_logits_and_keeps_any_prefix(moe, k, device):
    model = _model(moe, device)
    capture = device.type == "cuda"
    storage, states, seqs, graphs, drafts = _setup(model, "bf16", k, capture)
    _, tol, state_tol = _tols(model, 62 + 1 + k)
    start = [(seq.cached, [t.clone() for t in seq.state.tensors()]) for seq in seqs]
    # the sequential path: k + 1 decode steps feeding the drafts, the state after each
    sequential, after = [], []
    for t in range(k + 1):
        sequential.append(graphs.forward(seqs).clone())
        after.append([[x.clone() for x in seq.state.tensors()] for seq in seqs])
        for seq, d in zip(seqs, drafts):
            if t < k:
                seq.output.append(d[t])
    # back to the start (the K/V past it is overwritten by the verify step)
    for seq, (cached, tensors) in zip(seqs, start):
        seq.cached = cached
        seq.output = seq.output[: len(seq.output) - k]
        torch._foreach_copy_(seq.state.tensors(), tensors)
    logits = graphs.verify(seqs, drafts)
    assert logits.shape[:2] == (2, k + 1)
    for t in range(k + 1):
        for b in range(2):
            assert _rel(logits[b, t], sequential[t][b]) < tol, (t, b)
    assert [seq.cached for seq in seqs] == [cached for cached, _ in start]
    # every accepted length j gives the sequential state after j tokens: the trail holds j < k + 1
    saved = [[x.clone() for x in seq.state.tensors()] for seq in seqs]
    for j in range(1, k + 2):
        for seq, tensors in zip(seqs, saved):
            torch._foreach_copy_(seq.state.tensors(), tensors)
            seq.cached = start[seqs.index(seq)][0]
        graphs.keep(seqs, [j, k + 2 - j])
        for b, kept in enumerate([j, k + 2 - j]):
            assert seqs[b].cached == start[b][0] + kept
            for got, want in zip(seqs[b].state.tensors(), after[kept - 1][b]):
                assert _rel(got, want) < state_tol, (j, b)


def test_verify_needs_equal_drafts_within_max_q(device):
    model = _model(False, device)
    _, _, seqs, graphs, drafts = _setup(model, "bf16", 2, False)
    with pytest.raises(AssertionError):
        graphs.verify(seqs, [drafts[0], drafts[1][:1]])
    with pytest.raises(AssertionError):
        graphs.verify(seqs, [d + [1, 2] for d in drafts])
    assert [seq.cached for seq in seqs] == [7, 62]


@torch.inference_mode()
def test_runner_verifies_through_the_graph_step_with_padded_rows(device):
    """`HybridRunner` with graphs: a batch whose rows carry 2 and 0 drafts replays one
    q_len-3 verify graph (the second row padded), returns 3 + 1 logit rows, and `keep` settles
    each row: the same logits and states as the eager runner's verify rows."""
    from ninfer_engine.step.family_runners import HybridRunner
    from ninfer_engine.step.scheduler import Batch

    model = _model(False, device)
    _, tol, state_tol = _tols(model, 62 + 3)
    sides = []
    for graph in (True, False):
        storage, states, seqs, graphs, drafts = _setup(model, "bf16", 2, False)
        runner = HybridRunner(model, graphs if graph else None)
        batch = Batch(seqs, [], list(seqs), [drafts[0], []])
        logits = runner.forward(batch)
        assert logits.shape[0] == 3 + 1
        runner.keep(batch, [2, 1])
        sides.append((logits, [s.cached for s in seqs], [s.state.tensors() for s in seqs]))
    (got, cached, state), (want, cached_ref, state_ref) = sides
    assert cached == cached_ref == [7 + 2, 62 + 1]
    for row in range(4):
        assert _rel(got[row], want[row]) < tol, row
    for a, b in zip(state, state_ref):
        for x, y in zip(a, b):
            assert _rel(x, y) < state_tol


def sink_sides(model) -> tuple[list, list]:
    """What the hidden sink saw, graph runner then eager runner, over the same two steps:
    a verify step (rows with 2 and 0 drafts, keeping 2 and 1) and a decode step; each entry
    (row, position, the hiddens of its tokens)."""
    from ninfer_engine.step.family_runners import HybridRunner
    from ninfer_engine.step.scheduler import Batch

    sides = []
    for graph in (True, False):
        storage, states, seqs, graphs, drafts = _setup(model, "bf16", 2, False, keep_hidden=True)
        seen = []
        runner = HybridRunner(model, graphs if graph else None,
                              lambda seq, at, h: seen.append((seqs.index(seq), at, h.clone())))
        batch = Batch(seqs, [], list(seqs), [drafts[0], []])
        runner.forward(batch)
        runner.keep(batch, [2, 1])
        for seq, token in zip(seqs, (5, 6)):
            seq.output.append(token)
            assert seq.cache.reserve(seq.cached + 1)
        runner.forward(Batch(seqs, [], list(seqs)))
        sides.append(seen)
    return sides[0], sides[1]


@torch.inference_mode()
def test_graph_step_hands_the_drafter_the_eager_forwards_hiddens(device):
    """`--spec mtp` on the graph path: a verify step (rows with 2 and 0 drafts) and then a
    decode step hand the hidden sink the same positions as the eager runner, and hiddens within
    the step's bf16 bound (the final norm's output, which the head reads, so the logits' bound
    holds for it too)."""
    model = _model(False, device)
    _, tol, _ = _tols(model, 62 + 4)
    got, want = sink_sides(model)
    assert [(i, at, len(h)) for i, at, h in got] == [(i, at, len(h)) for i, at, h in want] == [
        (0, 7, 3), (1, 62, 1), (0, 9, 1), (1, 63, 1)]
    for (_, _, a), (_, _, b) in zip(got, want):
        assert _rel(a, b) < tol


@torch.inference_mode()
def test_start_up_capture_includes_the_verify_shape(device):
    """With verify rows (max_q > 1) the start-up capture runs decode and a max_q verify step
    at every batch size, and hands its scratch page back."""
    model = _model(False, device)
    storage, states = _storage(model, "bf16"), model.state_pool(2)
    graphs = DecodeGraphs(EngineHybridDecoder(model, storage, states, 2, 512, max_q=4), False)
    calls, run = [], graphs._run
    graphs._run = lambda seqs, drafts, q_len, feed=None, ahead=0: calls.append(
        (len(seqs), q_len, ahead)) or run(seqs, drafts, q_len, feed, ahead)
    free = storage.allocator.free
    graphs.capture_at_start()
    # one bucket (the max context, 512): decode, then a 4-token verify, at batch 1 and 2
    assert calls == [(1, 1, 511), (1, 4, 508), (2, 1, 511), (2, 4, 508)]
    assert storage.allocator.free == free


@torch.inference_mode()
def test_a_padded_verify_row_past_its_lease_writes_no_other_sequences_page(device):
    """A row padded to the verify graph's `max_q` writes K/V at its padding positions too; where
    its lease ends before them (a row at the end of its lease: the last tokens of its output
    window), the page table's next entry is stale and may be another sequence's page. The
    runner then verifies the step eagerly (rows as long as their drafts): the other sequence's
    stored K/V stay as they were, bit for bit."""
    from ninfer_engine.step.family_runners import HybridRunner
    from ninfer_engine.step.scheduler import Batch

    model = _model(False, device)
    storage, states = _storage(model, "bf16"), model.state_pool(2)
    gen = torch.Generator().manual_seed(3)
    other = _prefilled(model, storage, states, torch.randint(0, 512, (70,), generator=gen).tolist())
    short = _prefilled(model, storage, states, torch.randint(0, 512, (63,), generator=gen).tolist())
    assert other.cache.pages[0] == 0 and short.cache.capacity == short.cached + 1 == 64
    assert other.cache.reserve(other.cached + 4)
    decoder = EngineHybridDecoder(model, storage, states, 2, 512, max_q=4)
    runner = HybridRunner(model, DecodeGraphs(decoder, device.type == "cuda"))
    page = slice(0, PAGE)  # `other`'s first page: what `short`'s stale table entry names
    before = [t[page].clone() for layer in storage.stored() for t in layer]
    batch = Batch([other, short], [], [other, short], [[1, 2, 3], []])
    assert runner.forward(batch).shape[0] == 4 + 1
    runner.keep(batch, [1, 1])
    after = [t[page] for layer in storage.stored() for t in layer]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


@torch.inference_mode()
def test_a_prompts_last_token_joins_the_verify_graph_as_a_row_without_drafts(device):
    """A hybrid prompt's last token runs one step after the rest (`_graph_tails`); beside verify
    rows it is one more row of the verify graph, padded like a row without drafts and settled
    at once: no eager forward in the step, and the same logits (in `batch.sampled`'s order),
    positions and states as the eager runner's step."""
    from types import SimpleNamespace

    from ninfer_engine.step.family_runners import HybridRunner
    from ninfer_engine.step.scheduler import Batch, Chunk

    from .test_hybrid_graphs import _forward

    model = _model(False, device)
    _, tol, state_tol = _tols(model, 62 + 3)
    sides = []
    for graph in (True, False):
        storage, states = _storage(model, "bf16"), model.state_pool(3)
        gen = torch.Generator().manual_seed(11)
        prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (7, 62, 20)]
        a, b = (_prefilled(model, storage, states, p) for p in prompts[:2])
        tail = SimpleNamespace(cache=storage.new_cache(), cached=0, state=states.acquire(),
                               output=[], rope_delta=0, prompt=prompts[2],
                               request=SimpleNamespace(media=None, prompt_logprobs=None))
        _forward(model, tail, prompts[2][:-1])
        for seq in (a, b, tail):
            assert seq.cache.reserve(seq.cached + 3)
        drafts = torch.randint(0, 512, (2,), generator=gen).tolist()
        decoder = EngineHybridDecoder(model, storage, states, 3, 512, max_q=3)
        runner = HybridRunner(model, DecodeGraphs(decoder, False) if graph else None)
        eager = runner._eager
        runner._eager = lambda work, sampled: calls.append(len(work)) or eager(work, sampled)
        calls = []
        batch = Batch([a, b], [Chunk(tail, 1)], [a, b, tail], [drafts, []])
        logits = runner.forward(batch)
        assert logits.shape[0] == 3 + 1 + 1
        runner.keep(batch, [2, 1])
        sides.append((logits, calls, [s.cached for s in (a, b, tail)],
                      [s.state.tensors() for s in (a, b, tail)]))
    (got, calls, cached, state), (want, _, cached_ref, state_ref) = sides
    assert calls == [] and cached == cached_ref == [7 + 2, 62 + 1, 20]
    for row in range(5):
        assert _rel(got[row], want[row]) < tol, row
    for x, y in zip(state, state_ref):
        for p, q in zip(x, y):
            assert _rel(p, q) < state_tol
