"""The engine's hybrid static decode step (`hybrid_decode.EngineHybridDecoder`) against the
eager per-sequence forward (`HybridRunner`'s path) over the same paged pool layout.

On the CPU the step runs the Triton kernels through the interpreter (tests/conftest.py), eagerly;
on CUDA (`NINFER_TEST_DEVICE=cuda`) it is replayed from captured graphs.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.decode_graphs import DecodeGraphs, build_decode_graphs
from ninfer_engine.hybrid_decode import EngineHybridDecoder
from ninfer_engine.kv import KvStorage, LayerKv, PagePool, codecs_for
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model
from tests.benchmark.tiny import tiny_config, tiny_source

PAGE = 64
# bf16 kernels vs the bf16 reference: 1.5-6 % relative L2 of the logits on the H200 (72 steps
# over 9 shapes and seeds), one position at 17 % (shared width 32, seed 5); another sequence's
# logits are ~140 % away, so a mixed-up row, page, position or state still fails clearly
TOL = 0.25


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _model(moe, device, shared_width=None):
    config = tiny_config(moe)
    if shared_width:  # not the routed width: the shared expert stays out of the stacks
        config["shared_expert_intermediate_size"] = shared_width
    if moe:
        # every expert routed: the tiny router is near-uniform, so bf16 noise would flip top-k
        # choices between the two paths; with k = E the weights still come from the softmax
        config["num_experts_per_tok"] = config["num_experts"]
    source = tiny_source(config)
    return Qwen35Model(config, FusedParams(config, lambda n, s: source(n, s).to(device)))


def _storage(model, kv_dtype):
    layers, heads, dim = model.kv_layout()
    return KvStorage(PagePool(16, PAGE), layers, heads, dim, codecs_for(kv_dtype, model.dtype),
                     model.dtype, model.device)


def _forward(model, seq, ids):
    """The eager path of `HybridRunner`: one forward continuing the sequence's pool and state."""
    assert seq.cache.reserve(seq.cached + len(ids))
    views = [LayerKv(seq.cache, j, seq.cached) for j in range(len(model.attention_layers))]
    state = model.bind_state(views, seq.state, seq.cached)
    logits = model.forward(torch.tensor(ids, device=model.device), state, last_only=True)
    seq.cached += len(ids)
    return logits[0]


def _prefilled(model, storage, prompt):
    seq = SimpleNamespace(cache=storage.new_cache(), cached=0, state=model.new_recurrent_state(),
                          output=[])
    seq.output.append(int(_forward(model, seq, prompt).argmax()))
    return seq


@pytest.mark.parametrize("moe,kv_dtype,shared_width", [
    (False, "bf16", None), (False, "int8", None), (False, "k8v4", None),
    (True, "bf16", None),  # the shared expert a ninth slot of the routed kernels
    (True, "bf16", 32)])   # the shared expert its own GEMVs
@torch.inference_mode()
def test_static_hybrid_decode_matches_the_eager_forward(moe, kv_dtype, shared_width, device):
    model = _model(moe, device, shared_width)
    if moe:
        assert model.params.shared_in_stack("text/layers/0/moe/") == (shared_width is None)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 63, 70)]
    ours_storage, ref_storage = _storage(model, kv_dtype), _storage(model, kv_dtype)
    ours = [_prefilled(model, ours_storage, p) for p in prompts]
    ref = [_prefilled(model, ref_storage, p) for p in prompts]
    graphs = DecodeGraphs(EngineHybridDecoder(model, ours_storage, 4, 512),
                          capture=device.type == "cuda")
    # the same rows twice (GDN state stays resident in the rows), a smaller batch (rows
    # handed back to the slots, then reloaded), an eager step of the left-out sequence
    # between (it reads its slot), then all rows again; the 63-token one crosses a page
    schedule = [[0, 1, 2], [0, 1, 2], [0, 2], "eager 1", [0, 1, 2]]
    for step, rows in enumerate(schedule):
        if rows == "eager 1":
            graphs.flush()  # as the runner does before every eager step
            for seq in (ours[1], ref[1]):
                seq.output.append(int(_forward(model, seq, [seq.output[-1]]).argmax()))
            assert ours[1].output[-1] == ref[1].output[-1]
            continue
        for i in rows:
            assert ours[i].cache.reserve(ours[i].cached + 1)
        got = graphs.forward([ours[i] for i in rows])
        want = [_forward(model, ref[i], [ref[i].output[-1]]) for i in rows]
        errors = [_rel(got[row], w) for row, w in enumerate(want)]
        assert max(errors) < TOL, (step, errors)
        for i, w in zip(rows, want):  # both continue with the reference's token
            ours[i].output.append(int(w.argmax()))
            ref[i].output.append(ours[i].output[-1])
    assert [s.cached for s in ours] == [s.cached for s in ref]
    # flushed, the slots hold each sequence's GDN state; a sequence that retired without a
    # checkpoint (its slot released: state None) has its row dropped, the others keep theirs
    ours[1].state = None
    graphs.flush()
    for a, b in [(ours[0], ref[0]), (ours[2], ref[2])]:
        for sa, sb in zip(a.state, b.state):
            assert _rel(sa.ssm, sb.ssm) < TOL


def test_the_hybrid_static_path_needs_cuda_and_fused_weights():
    model = _model(False, torch.device("cpu"))
    assert build_decode_graphs(model, _storage(model, "bf16"), "bf16", 2, 512, True) is None
