"""The hybrid family's short-prompt step (`qwen3_5_prompt_step.PromptStep` through
`DecodeGraphs.prefill`) against the eager forward over the same paged pool layout: a chunk
padded to the step's rows leaves the logits, K/V and GDN state of the chunk alone computed.

On the CPU the step runs the Triton kernels through the interpreter (tests/conftest.py),
eagerly; on CUDA (`NINFER_TEST_DEVICE=cuda`) it is replayed from captured graphs.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.models.qwen3_5_engine_step import EngineHybridDecoder, EngineHybridPrompt
from ninfer_engine.step.decode_graphs import PROMPT_ROWS, DecodeGraphs, prompt_rows

from .helpers import copy_pool, recorded_writes
from .test_hybrid_graphs import _check_writes, _forward, _model, _prefilled, _rel, _storage, _tols


def _graphs(model, storage, states, capture, max_q=1, keep_hidden=False):
    decoder = EngineHybridDecoder(model, storage, states, 2, 512, max_q, keep_hidden)
    prompt = EngineHybridPrompt(decoder.core.w, storage, states, 2, 512, PROMPT_ROWS[-1],
                                keep_hidden)
    return DecodeGraphs(decoder, capture=capture, prompt=prompt)


@pytest.mark.parametrize("moe,kv_dtype", [(False, "bf16"), (True, "bf16"), (False, "int8")])
@torch.inference_mode()
def test_a_padded_prompt_chunk_matches_the_eager_forward(moe, kv_dtype, device):
    model = _model(moe, device)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (70, 5)]
    ours_storage, ref_storage = _storage(model, kv_dtype), _storage(model, kv_dtype)
    # ours in slots 1 and 2 of a pool of 3 (the step addresses its slot by index)
    ours_states, ref_states = model.state_pool(3), model.state_pool(2)
    ours_states.acquire()
    ours = [_prefilled(model, ours_storage, ours_states, p) for p in prompts]
    ref = [_prefilled(model, ref_storage, ref_states, p) for p in prompts]
    graphs = _graphs(model, ours_storage, ours_states, device.type == "cuda")
    # steps of chunks: 2 tokens (16 rows: 14 of padding), 16 (none), 20 (32 rows), then two
    # chunks in one step (3 and 14 tokens, both padded to 16 rows), each step over the K/V and
    # states the ones before left (the 70-token prompt's first chunk crosses a page)
    steps = [[(0, 2)], [(1, 16)], [(0, 20)], [(0, 3), (1, 14)]]
    kv_tol, tol, state_tol = _tols(model, 70 + 2 + 20 + 3 + 1)
    for step in steps:
        seqs = [ours[i] for i, _ in step]
        tokens = [torch.randint(0, 512, (n,), generator=gen).tolist() for _, n in step]
        rows = prompt_rows(max(n for _, n in step), PROMPT_ROWS[-1])
        for seq in seqs:
            assert seq.cache.reserve(seq.cached + rows)
            assert graphs.prefills(seq, rows)
        got = graphs.prefill(seqs, tokens)
        assert got.shape[0] == len(step)
        copy_pool(ours_storage, ref_storage)
        for b, ((i, n), ids) in enumerate(zip(step, tokens)):
            with recorded_writes(ref_storage) as written:
                want = _forward(model, ref[i], ids)
            _check_writes(written, ours_storage, ref_storage, kv_tol)
            assert _rel(got[b], want) < tol, (step, i)
            assert ours[i].cached == ref[i].cached
            ours[i].output.append(int(want.argmax()))
            ref[i].output.append(ours[i].output[-1])
    # a decode step after: it reads the chunks' K/V (not the padding's: its own position's
    # write replaced it) and continues the state the prompt step left
    for seq in ours:
        assert seq.cache.reserve(seq.cached + 1)
    got = graphs.forward(ours)
    copy_pool(ours_storage, ref_storage)
    want = [_forward(model, seq, [seq.output[-1]]) for seq in ref]
    assert max(_rel(got[row], w) for row, w in enumerate(want)) < tol
    for a, b in zip(ours, ref):
        for sa, sb in zip(a.state.layers, b.state.layers):
            assert _rel(sa.ssm, sb.ssm) < state_tol and _rel(sa.conv, sb.conv) < state_tol
    assert not any(t.any() for t in ours_states.slot(0).tensors())


def test_the_prompt_step_takes_short_chunks_its_lease_covers(device):
    model = _model(False, device)
    storage, states = _storage(model, "bf16"), model.state_pool(1)
    graphs = _graphs(model, storage, states, capture=False)
    seq = SimpleNamespace(cache=storage.new_cache(), cached=10, state=states.acquire(),
                          output=[], rope_delta=0)
    assert seq.cache.reserve(10 + 64) and seq.cache.capacity == 128  # two 64-token pages
    assert [prompt_rows(n, 64) for n in (1, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]
    assert graphs.prefills(seq, 33) and graphs.prefills(seq, 64)
    assert not graphs.prefills(seq, 65) and not graphs.prefills(seq, 0)
    seq.cached = 65  # 65 + 64 > the lease: the padding would write past it
    assert not graphs.prefills(seq, 33) and graphs.prefills(seq, 32)


@torch.inference_mode()
def test_the_runner_sends_short_chunks_through_the_prompt_step(device):
    """`HybridRunner` with a prompt step: a step of a decode row, a 5- and a 9-token chunk
    (one replay of the prompt step: both 16 rows, two chunks), a 20-token chunk (another: 32
    rows) and a 70-token chunk (past its rows: the eager forward) returns the sampled rows'
    logits in the batch's order, as the eager runner does; a chunk that is not sampled still
    advances its sequence."""
    from ninfer_engine.step.family_runners import HybridRunner
    from ninfer_engine.step.scheduler import Batch, Chunk

    model = _model(True, device)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (9, 40, 3, 6, 11)]
    more = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (7, 70, 9, 20)]
    _, tol, _ = _tols(model, 40 + 70 + 1)
    sides = []
    for graph in (True, False):
        storage, states = _storage(model, "bf16"), model.state_pool(5)
        seqs = [_prefilled(model, storage, states, p) for p in prompts]
        for seq, extra in zip(seqs[1:], more):  # their prompts go on (the request's view)
            seq.prompt = [0] * seq.cached + extra
            seq.request = SimpleNamespace(media=None, prompt_logprobs=None)
            assert seq.cache.reserve(seq.cached + 64 + len(extra))
        assert seqs[0].cache.reserve(seqs[0].cached + 1)
        graphs = _graphs(model, storage, states, device.type == "cuda")
        replays = []
        prefill = graphs.prefill
        graphs.prefill = lambda seqs_, ids: replays.append(len(ids)) or prefill(seqs_, ids)
        runner = HybridRunner(model, graphs if graph else None)
        chunks = [Chunk(seqs[1], 5), Chunk(seqs[2], 70), Chunk(seqs[3], 9), Chunk(seqs[4], 20)]
        logits = runner.forward(Batch([seqs[0]], chunks, list(seqs)))
        assert logits.shape[0] == 5
        assert sorted(replays) == ([1, 2] if graph else [])
        # a chunk nobody samples (its prompt goes on): no rows, its sequence advanced
        assert runner.forward(Batch([], [Chunk(seqs[1], 2)], [])).shape[0] == 0
        sides.append((logits, [s.cached for s in seqs]))
    (got, cached), (want, cached_ref) = sides
    assert cached == cached_ref == [10, 47, 73, 15, 31]
    for row in range(5):
        assert _rel(got[row], want[row]) < tol, row


def test_only_a_model_whose_layers_never_sync_gets_the_prompt_step(device):
    """The MoE dispatch holds a CUDA graph only on CUDA (grouped kernels, no host counts);
    the CPU and a rank's share of the experts keep the eager forward."""
    from ninfer_engine.models.qwen3_5_prompt_step import prompt_capturable

    model = _model(True, device)
    assert prompt_capturable(model) == (device.type == "cuda")
    moe = model.blocks[0].ffn
    moe.local = (0, moe.n_experts // 2)
    assert not moe.capturable() and not prompt_capturable(model)
    assert prompt_capturable(_model(False, device))  # no MoE: nothing syncs


def _spec_sides(model, device):
    """A verify step (decode rows with 2 and 0 drafts) beside a 5- and a 4-token chunk the
    prompt step takes in one replay, then a decode step, through the graph runner (decode,
    verify and prompt graphs, hiddens kept) and the eager runner: (logits of both steps,
    `cached`, the hidden sink's records (row, position, hiddens)) for each."""
    from ninfer_engine.step.family_runners import HybridRunner
    from ninfer_engine.step.scheduler import Batch, Chunk

    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (7, 62, 40, 30)]
    extra = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 4)]
    drafts = torch.randint(0, 512, (2,), generator=gen).tolist()
    sides = []
    for graph in (True, False):
        storage, states = _storage(model, "bf16"), model.state_pool(4)
        seqs = [_prefilled(model, storage, states, p) for p in prompts]
        for seq, ids in zip(seqs[2:], extra):
            seq.prompt = [0] * seq.cached + ids
            seq.request = SimpleNamespace(media=None, prompt_logprobs=None)
        for seq in seqs:
            assert seq.cache.reserve(seq.cached + 64 + 8)
        seen = []
        graphs = _graphs(model, storage, states, device.type == "cuda", max_q=3,
                         keep_hidden=True)
        runner = HybridRunner(model, graphs if graph else None,
                              lambda seq, at, h: seen.append((seqs.index(seq), at, h.clone())))
        prefill = graphs.prefill  # noted: the chunk did take the prompt step
        graphs.prefill = lambda seqs, ids: seen.append("prompt step") or prefill(seqs, ids)
        batch = Batch(seqs[:2], [Chunk(seqs[2], 5), Chunk(seqs[3], 4)], list(seqs),
                      [drafts, []])
        first = runner.forward(batch)
        runner.keep(batch, [2, 1])
        for seq, token in zip(seqs[:2], (5, 6)):
            seq.output.append(token)
        second = runner.forward(Batch(seqs[:2], [], seqs[:2]))
        sides.append(((first, second), [s.cached for s in seqs], seen))
    return sides


@torch.inference_mode()
def test_prompt_chunks_beside_verify_rows_and_a_hidden_sink(device):
    """Speculation on (`--spec mtp|dflash` keep hiddens; a step may carry drafts): a short
    chunk still takes the prompt step; the step's logits are the verify row's 1 + 2 rows, the
    decode row's and the chunks', and the drafter's sink sees the chunks' five and four
    positions, all as from the eager runner."""
    model = _model(False, device)
    _, tol, _ = _tols(model, 62 + 4)
    (got, cached, seen), (want, cached_ref, seen_ref) = _spec_sides(model, device)
    assert got[0].shape[0] == want[0].shape[0] == 3 + 1 + 1 + 1
    assert cached == cached_ref == [7 + 2 + 1, 62 + 1 + 1, 45, 34]
    for a, b in zip(got, want):
        for row in range(a.shape[0]):
            assert _rel(a[row], b[row]) < tol, row
    assert seen.count("prompt step") == 1 and "prompt step" not in seen_ref
    seen = [s for s in seen if s != "prompt step"]
    where = [(i, at, len(h)) for i, at, h in seen]
    assert where == [(i, at, len(h)) for i, at, h in seen_ref]
    # the chunks' hiddens, from the prompt step's one replay on the graph side
    assert (2, 40, 5) in where and (3, 30, 4) in where
    for (_, _, a), (_, _, b) in zip(seen, seen_ref):
        assert _rel(a, b) < tol
