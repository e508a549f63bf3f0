"""The llama family's short-prompt step (`models.llama_prompt_step.LlamaPrompt` through
`DecodeGraphs.prefill`) against the model's forward over the same paged pool: chunks padded to
the step's rows leave the logits and K/V of the chunks alone computed.

On the CPU the step runs its kernels eagerly (the paged prefill kernel through the Triton
interpreter, the rest through the kernels' references); on CUDA (`NINFER_TEST_DEVICE=cuda`)
it is replayed from captured graphs.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.models import Segment
from ninfer_engine.models.llama_prompt_step import LlamaPrompt
from ninfer_engine.models.llama_step import StaticDecoder
from ninfer_engine.step.decode_graphs import PROMPT_ROWS, DecodeGraphs, prompt_rows
from ninfer_engine.step.families import prompt_step

from tests import tolerance

from .helpers import copy_pool, error_chains, recorded_writes, stored_rows
from .test_decode_graphs import _eager_step, _model, _prefilled, _storage


def _graphs(model, storage, capture):
    return DecodeGraphs(StaticDecoder(model, storage, 2, 512), capture,
                        LlamaPrompt(model, storage, 2, 512, PROMPT_ROWS[-1]))


def _forward(model, seq, ids):
    """The reference: the model's forward of `ids` after `seq.cached`; the last token's logits."""
    on, n = model.device, len(ids)
    assert seq.cache.reserve(seq.cached + n)
    logits = model.forward(torch.tensor(ids, device=on),
                           torch.arange(seq.cached, seq.cached + n, device=on),
                           [Segment(seq.cache, seq.cached, n)], torch.tensor([n - 1], device=on))
    seq.cached += n
    return logits[0]


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8", "k8v4"])
@torch.inference_mode()
def test_padded_prompt_chunks_match_the_model_forward(kv_dtype, device):
    """Steps of chunks (2 tokens padded to 16 rows, 16, 20 padded to 32, then two chunks of 3
    and 14 in one step), each over the K/V the ones before left: every chunk's last logits
    within the decode step's derived bound of the forward's, its K/V rows the forward's up to
    half a code step plus that bound; then a decode step over them matches again."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = _model("llama", device, dtype)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (70, 5)]
    ours_storage, ref_storage = _storage(model, kv_dtype), _storage(model, kv_dtype)
    ours = [_prefilled(model, ours_storage, p) for p in prompts]
    ref = [_prefilled(model, ref_storage, p) for p in prompts]
    graphs = _graphs(model, ours_storage, device.type == "cuda")
    writes, (depth, roundings) = error_chains(model, 70 + 2 + 20 + 3 + 1)
    write_tol = [tolerance.bound(dtype, d, roundings=r) for d, r in writes]
    logit_tol = tolerance.bound(dtype, depth, roundings=roundings)
    half_step = {c.name: tolerance.code_step(c.name) / 2
                 for c in (ref_storage.k_codec, ref_storage.v_codec)}
    for step in [[(0, 2)], [(1, 16)], [(0, 20)], [(0, 3), (1, 14)]]:
        seqs = [ours[i] for i, _ in step]
        tokens = [torch.randint(0, 128, (n,), generator=gen).tolist() for _, n in step]
        rows = prompt_rows(max(n for _, n in step), PROMPT_ROWS[-1])
        for seq in seqs:
            assert seq.cache.reserve(seq.cached + rows) and graphs.prefills(seq, rows)
        got = graphs.prefill(seqs, tokens)
        assert got.shape == (len(step), model.vocab_size)
        copy_pool(ours_storage, ref_storage)
        for b, ((i, n), ids) in enumerate(zip(step, tokens)):
            with recorded_writes(ref_storage) as written:
                want = _forward(model, ref[i], ids)
            for index, is_k, slots, x in written:  # the chunk's rows, as the forward wrote them
                codec = ref_storage.k_codec if is_k else ref_storage.v_codec
                x = x.double()
                limit = (half_step[codec.name] + write_tol[index]) * x.abs().amax(-1, keepdim=True)
                stored = stored_rows(ours_storage, index, is_k, slots)
                assert ((stored - x).abs() <= limit).all(), (step, index, "KV"[not is_k])
            assert (got[b] - want).abs().max() <= logit_tol * want.abs().max(), (step, i)
            assert ours[i].cached == ref[i].cached
            ours[i].output.append(int(want.argmax()))
            ref[i].output.append(ours[i].output[-1])
    for seq in ours:  # a decode step reads the chunks' K/V (its own write replaced a padding row's)
        assert seq.cache.reserve(seq.cached + 1)
    got = graphs.forward(ours)
    copy_pool(ours_storage, ref_storage)
    want = _eager_step(model, ref)
    assert (got - want).abs().max() <= logit_tol * want.abs().max()


def test_the_llama_family_builds_a_prompt_step_but_not_under_tensor_parallelism():
    model = _model("llama", torch.device("cpu"), torch.float32)
    storage = _storage(model, "bf16")
    memory = SimpleNamespace(storage=storage, running_slots=None)
    decoder = StaticDecoder(model, storage, 3, 512)
    step = prompt_step(model, memory, decoder, 512)
    assert isinstance(step, LlamaPrompt) and (step.max_batch, step.rows) == (3, PROMPT_ROWS[-1])
    model.ranks = SimpleNamespace(parallel=True)
    assert prompt_step(model, memory, decoder, 512) is None


@torch.inference_mode()
def test_the_llama_runner_sends_short_chunks_through_the_prompt_step(device):
    """`Runner` with a prompt step: a decode row, a 5- and a 9-token chunk (one replay: both
    16 rows), and a 70-token chunk (past its rows: the eager forward) give the eager runner's
    logits in the batch's order and advance each sequence by its chunk."""
    from ninfer_engine.step.family_runners import Runner
    from ninfer_engine.step.scheduler import Batch, Chunk

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = _model("llama", device, dtype)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (9, 40, 3, 6)]
    more = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (5, 70, 9)]
    sides = []
    for graph in (True, False):
        storage = _storage(model, "bf16")
        seqs = [_prefilled(model, storage, p) for p in prompts]
        for seq, extra in zip(seqs[1:], more):  # their prompts go on (the request's view)
            seq.prompt = [0] * seq.cached + extra
            seq.request = SimpleNamespace(media=None, prompt_logprobs=None)
            assert seq.cache.reserve(seq.cached + 64 + len(extra))
        assert seqs[0].cache.reserve(seqs[0].cached + 1)
        graphs = _graphs(model, storage, device.type == "cuda")
        replays = []
        prefill = graphs.prefill
        graphs.prefill = lambda seqs_, ids: replays.append(len(ids)) or prefill(seqs_, ids)
        runner = Runner(model, graphs if graph else None)
        chunks = [Chunk(seqs[1], 5), Chunk(seqs[2], 70), Chunk(seqs[3], 9)]
        logits = runner.forward(Batch([seqs[0]], chunks, list(seqs)))
        assert sorted(replays) == ([2] if graph else [])
        sides.append((logits, [s.cached for s in seqs]))
    (got, cached), (want, cached_ref) = sides
    assert got.shape == want.shape == (4, model.vocab_size)
    assert cached == cached_ref == [10, 45, 73, 15]
    _, (depth, roundings) = error_chains(model, 73)
    limit = tolerance.bound(dtype, depth, roundings=roundings)
    assert (got - want).abs().max() <= limit * want.abs().max()
