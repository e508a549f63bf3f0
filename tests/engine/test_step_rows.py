"""One step's rows: decode rows first, then prompt chunks under a token budget (`Scheduler`);
where the static decode path exists, decode rows go through it and the chunks run eagerly after
them in the same step (`Runner`)."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ninfer_engine.models.llama_step import StaticDecoder
from ninfer_engine.step import decode_graphs
from ninfer_engine.step.decode_graphs import DecodeGraphs, context_bucket
from ninfer_engine.kv import ElasticPagePool, KvStorage, PagePool, codecs_for
from ninfer_engine.models import Segment, build_model
from ninfer_engine.step.family_runners import Runner
from ninfer_engine.step.scheduler import Batch, Chunk, Scheduler
from ninfer_engine.step.sequence import Sequence
from ninfer_engine.types import GenerationRequest, SamplingParams

from tests.tolerance import TRANSCENDENTAL, bound
from .helpers import DictWeights, text_config, tiny_llama


def _sequence(name: str, prompt_len: int, max_tokens: int = 4) -> Sequence:
    request = GenerationRequest(name, tuple(range(1, prompt_len + 1)),
                                SamplingParams(temperature=0.0), max_tokens=max_tokens)
    return Sequence(request, lambda event: None, None, None, frozenset())


def _chunks(batch: Batch) -> list[tuple[str, int]]:
    return [(chunk.seq.id, chunk.tokens) for chunk in batch.chunks]


def _run(batch: Batch) -> None:
    """What a step does to the sequences' books: chunks computed, sampled rows get a token."""
    for seq in batch.decode:
        seq.cached += 1
    for chunk in batch.chunks:
        chunk.seq.cached += chunk.tokens
    for seq in batch.sampled:
        seq.output.append(7)


def test_a_step_fills_its_prompt_budget_from_several_prompts_in_admission_order():
    scheduler = Scheduler(4, 10, 60.0, admit=lambda seq: True)
    a, b, c, d = (_sequence("a", 4), _sequence("b", 5), _sequence("c", 9),
                  _sequence("d", 3, max_tokens=0))
    for seq in (a, b, c, d):
        scheduler.add(seq)
    batch, ended = scheduler.schedule(0.0)
    assert not ended and batch.decode == []
    assert _chunks(batch) == [("a", 4), ("b", 5), ("c", 1)]  # c is split at the budget
    assert batch.sampled == [a, b] and batch.prefill_tokens == 10
    _run(batch)
    batch, _ = scheduler.schedule(0.0)
    assert batch.decode == [a, b]  # decode rows first, every step
    assert _chunks(batch) == [("c", 8), ("d", 2)]
    assert batch.sampled == [a, b, c]  # d's prompt is not in yet
    _run(batch)
    batch, _ = scheduler.schedule(0.0)
    assert batch.decode == [a, b, c] and _chunks(batch) == [("d", 1)]
    assert batch.sampled == [a, b, c]  # max_tokens 0: d is prefilled, never sampled


def _model():
    return build_model(text_config(tiny_llama()), DictWeights.from_hf(tiny_llama()), "cpu",
                       torch.float32)


def _rows(model, storage, prompts: list[list[int]], decoding: int):
    """Stand-ins for sequences: the first `decoding` have their prompt in the pool and one
    sampled token, the others wait with an empty cache."""
    rows = []
    for i, prompt in enumerate(prompts):
        cache = storage.new_cache()
        seq = SimpleNamespace(prompt=tuple(prompt), cache=cache, cached=0, output=[],
                              state=None)
        if i < decoding:
            assert cache.reserve(len(prompt))
            logits = model.forward(torch.tensor(prompt), torch.arange(len(prompt)),
                                   [Segment(cache, 0, len(prompt))],
                                   torch.tensor([len(prompt) - 1]))
            seq.cached, seq.output = len(prompt), [int(logits[0].argmax())]
        rows.append(seq)
    return rows


def _storage(model) -> KvStorage:
    layers, heads, dim = model.kv_layout()
    return KvStorage(PagePool(16, 64), layers, heads, dim, codecs_for("bf16", model.dtype),
                     model.dtype, model.device)


def _run_both(model, make_batch, storage_rows) -> dict:
    """The batch through a runner with the static step ("mixed") and without ("eager"), each
    over fresh rows; also the rows the static step was called with."""
    runs = {}
    for name in ("mixed", "eager"):
        storage = _storage(model)
        rows = storage_rows(storage)
        graphs, calls = None, []
        if name == "mixed":
            graphs = DecodeGraphs(StaticDecoder(model, storage, 4, 512), capture=False)
            step = graphs.forward
            graphs.forward = lambda seqs: calls.append(list(seqs)) or step(seqs)
        runs[name] = (Runner(model, graphs).forward(make_batch(*rows)), rows, calls)
    return runs


def _assert_same_logits(model, got, want) -> None:
    # two fp32 computations of each row: per layer the norms, q/k/v, scores over ≤ 64 keys and
    # the softmax-weighted sum, o, gate/up and down reductions; then the final norm and the head
    c = model.cfg
    per_layer = 4 * c.hidden_size + c.head_dim + 2 * 64 + c.intermediate_size
    depth = c.num_layers * per_layer + 2 * c.hidden_size + 3 * TRANSCENDENTAL
    assert (got - want).abs().max() <= bound(torch.float32, depth) * want.abs().max()


@torch.inference_mode()
def test_decode_rows_take_the_static_step_and_the_prompt_chunks_run_eagerly_after_them():
    model = _model()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (5, 63, 20, 30)]

    def batch(a, b, c, d):
        for seq, n in ((a, 1), (b, 1), (c, 20), (d, 7)):
            assert seq.cache.reserve(seq.cached + n)
        return Batch([a, b], [Chunk(c, 20), Chunk(d, 7)], sampled=[a, b, c])
    runs = _run_both(model, batch, lambda storage: _rows(model, storage, prompts, decoding=2))
    for _, rows, _ in runs.values():
        assert [s.cached for s in rows] == [6, 64, 20, 7]
    _, (a, b, _, _), calls = runs["mixed"]
    assert calls == [[a, b]]  # only the decode rows, in one static step
    got, want = runs["mixed"][0], runs["eager"][0]
    assert got.shape == want.shape == (3, model.vocab_size)
    _assert_same_logits(model, got, want)


@torch.inference_mode()
def test_a_prompts_last_token_joins_the_decode_rows_in_the_static_step():
    """A one-token chunk that ends its prompt (a hybrid prompt's last token runs one step after
    the rest) is a decode row whose input is that prompt token: it goes through the static step
    with the decode rows, the other chunks eagerly, and the logits keep the batch's order."""
    model = _model()
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (5, 63, 20, 30)]

    def rows(storage):
        a, b, c, t = _rows(model, storage, prompts, decoding=2)
        # t: all of its prompt but the last token computed, no output yet
        assert t.cache.reserve(30)
        model.forward(torch.tensor(prompts[3][:29]), torch.arange(29),
                      [Segment(t.cache, 0, 29)], torch.tensor([28]))
        t.cached = 29
        t.request = c.request = SimpleNamespace(media=None, prompt_logprobs=None)
        return a, b, c, t

    def batch(a, b, c, t):
        for seq, n in ((a, 1), (b, 1), (c, 20)):
            assert seq.cache.reserve(seq.cached + n)
        # t's chunk after c's, while the static step's rows put t right after the decode rows
        return Batch([a, b], [Chunk(c, 20), Chunk(t, 1)], sampled=[a, b, c, t])
    runs = _run_both(model, batch, rows)
    for _, seqs, _ in runs.values():
        assert [s.cached for s in seqs] == [6, 64, 20, 30]
    _, (a, b, _, t), calls = runs["mixed"]
    assert calls == [[a, b, t]]
    got, want = runs["mixed"][0], runs["eager"][0]
    assert got.shape == want.shape == (4, model.vocab_size)
    _assert_same_logits(model, got, want)


@torch.inference_mode()
def test_start_up_capture_runs_every_batch_size_on_scratch_pages_and_gives_them_back(
        monkeypatch):
    """`DecodeGraphs.capture_at_start` (what a CUDA engine does before serving) runs every
    context bucket up to the max context at batch 1..max on scratch sequences at their first
    position; here eagerly, on the CPU."""
    model = _model()
    layers, heads, dim = model.kv_layout()
    pool = PagePool(48, 64)
    storage = KvStorage(pool, layers, heads, dim, codecs_for("bf16", model.dtype), model.dtype,
                        model.device)
    graphs = DecodeGraphs(StaticDecoder(model, storage, 3, 3000), capture=False)
    run, steps = graphs._run, []

    def spy(seqs, drafts, q_len, feed=None, ahead=0):
        assert all(seq.cached == 0 for seq in seqs)
        steps.append((context_bucket(ahead + q_len, 3000), len(seqs)))
        return run(seqs, drafts, q_len, feed, ahead)
    graphs._run = spy
    graphs.capture_at_start()
    assert steps == [(bucket, batch) for bucket in (1024, 2048, 3000) for batch in (1, 2, 3)]
    assert pool.free == pool.total
    # past the first bucket, only the buckets whose logits fit the start-up budget
    logits = (1 + 2 + 3) * model.vocab_size * 4  # fp32 [batch, V] a batch size, kept a graph
    steps.clear()
    monkeypatch.setattr(decode_graphs, "START_LOGITS_BYTES", 2 * logits - 1)
    graphs.capture_at_start()
    assert steps == [(bucket, batch) for bucket in (1024, 2048) for batch in (1, 2, 3)]
    # one scratch page for all rows: an elastic pool at its first grow step does not grow
    elastic = ElasticPagePool(8, 1, 64)  # pages: capacity 8, grow step 1
    storage = KvStorage(elastic, layers, heads, dim, codecs_for("bf16", model.dtype), model.dtype,
                        model.device)
    DecodeGraphs(StaticDecoder(model, storage, 3, 512), capture=False).capture_at_start()
    assert elastic.total == 1 and elastic.free == 1
