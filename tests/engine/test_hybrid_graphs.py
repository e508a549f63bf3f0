"""The engine's hybrid static decode step (`qwen3_5_engine_step.EngineHybridDecoder`) against the
eager per-sequence forward (`HybridRunner`'s path) over the same paged pool layout.

On the CPU the step runs the Triton kernels through the interpreter (tests/conftest.py), eagerly;
on CUDA (`NINFER_TEST_DEVICE=cuda`) it is replayed from captured graphs.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.step.decode_graphs import DecodeGraphs
from ninfer_engine.step.families import build_decode_graphs
from ninfer_engine.models.qwen3_5_engine_step import EngineHybridDecoder
from ninfer_engine.kv import KvStorage, LayerKv, PagePool, codecs_for
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model
from tests import tolerance
from tests.benchmark.tiny import tiny_config, tiny_source

from .helpers import copy_pool, recorded_writes, stored_rows

PAGE = 64
BF16 = torch.bfloat16
# bf16 both ways (tests.tolerance), each side's stores: the GDN layer's norm, projections, q and
# k after their L2 norm (a prompt's chunk walk reads them in bf16, `kernels.gdn_prompt`), gated
# norm, output projection, residual, norm, gate/up, SiLU, product, down and residual (13), then
# the attention layer's norm, QKV, q and k norms and RoPE (5) up to its K/V write, the dot
# operands K, V and P, the output, its gate and product, the output projection, the residual,
# the norm and the MLP's 4 stores, the residual (15), the router's and the experts' weights (2),
# the final norm and the head (2); `cast_roundings()` each (2 where the interpreter truncates).
# The worst case is loose (~0.3 on a GPU where the H200 measured 2-17 %, ~0.75 interpreted),
# but another sequence's logits are
# ~140 % away, so a mixed-up row, page, position or state still fails; the K/V rows each step
# stores are checked far tighter (`_check_writes`).
KV_STORES, LOGIT_STORES = 18, 37


def _tols(model, context):
    """(K/V write, logits, GDN state) bounds; the fp32 parts over the model's whole chain."""
    from tests.models.qwen35_tiny import hybrid_depth

    depth = hybrid_depth(model.config, context)
    cast = tolerance.cast_roundings()
    kv = tolerance.bound(BF16, depth, roundings=KV_STORES * cast)
    logits = tolerance.bound(BF16, depth, roundings=LOGIT_STORES * cast)
    # the state: fp32, fed bf16 inputs (norm, projections: 2 stores) once per decode step
    state = tolerance.bound(BF16, depth, roundings=2 * cast * 5)
    return kv, logits, state


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _check_writes(written, ours_storage, ref_storage, tol):
    """Each K/V row the reference would have stored (recorded, not stored: it attends over
    the rows `ours` stored) is what `ours` stored, up to half a code step (a quantizing codec
    can put inputs equal up to rounding one step apart) and the K/V chain's rounding."""
    assert written
    for index, is_k, slots, x in written:
        codec = ref_storage.k_codec if is_k else ref_storage.v_codec
        stored, x = stored_rows(ours_storage, index, is_k, slots), x.double().cpu()
        limit = (tolerance.code_step(codec.name) / 2 + tol) * x.abs().amax(-1, keepdim=True)
        assert ((stored.cpu() - x).abs() <= limit).all(), (index, "KV"[not is_k])


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
    state = model.bind_state(views, seq.state.layers, seq.cached)
    logits = model.forward(torch.tensor(ids, device=model.device), state, last_only=True)
    seq.cached += len(ids)
    return logits[0]


def _prefilled(model, storage, states, prompt):
    seq = SimpleNamespace(cache=storage.new_cache(), cached=0, state=states.acquire(), output=[],
                          rope_delta=0)
    seq.output.append(int(_forward(model, seq, prompt).argmax()))
    return seq


@pytest.mark.parametrize("moe,kv_dtype,shared_width", [
    (False, "bf16", None), (False, "int8", None), (False, "k8v4", None),
    (True, "bf16", None),  # the shared expert a ninth slot of the routed kernels
    # the shared expert its own GEMVs: ~30 s interpreted on the 2-core box, run with -m slow
    pytest.param(True, "bf16", 32, marks=pytest.mark.slow)])
@torch.inference_mode()
def test_static_hybrid_decode_matches_the_eager_forward(moe, kv_dtype, shared_width, device):
    model = _model(moe, device, shared_width)
    if moe:
        assert model.params.shared_in_stack("text/layers/0/moe/") == (shared_width is None)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 63, 70)]
    ours_storage, ref_storage = _storage(model, kv_dtype), _storage(model, kv_dtype)
    # our sequences in the last slots of a pool of 4 (rows address slots by index); the
    # reference's in a pool of its own
    ours_states, ref_states = model.state_pool(4), model.state_pool(3)
    ours_states.acquire()
    ours = [_prefilled(model, ours_storage, ours_states, p) for p in prompts]
    ref = [_prefilled(model, ref_storage, ref_states, p) for p in prompts]
    graphs = DecodeGraphs(EngineHybridDecoder(model, ours_storage, ours_states, 4, 512),
                          capture=device.type == "cuda")
    # the same rows twice, a smaller batch, an eager step of the left-out sequence between
    # (it continues the slot the graph steps wrote), then all rows again in another order
    # (rows 0..2 now hold slots 3, 1, 2); the 63-token one crosses a page
    schedule = [[0, 1, 2], [0, 1, 2], [0, 2], "eager 1", [2, 0, 1]]
    kv_tol, tol, state_tol = _tols(model, max(len(p) for p in prompts) + len(schedule))
    for step, rows in enumerate(schedule):
        if rows == "eager 1":
            mine = _forward(model, ours[1], [ours[1].output[-1]])
            copy_pool(ours_storage, ref_storage)
            with recorded_writes(ref_storage) as written:
                want = _forward(model, ref[1], [ref[1].output[-1]])
            _check_writes(written, ours_storage, ref_storage, kv_tol)
            assert _rel(mine, want) < tol
            # the same token, where the margin exceeds what the two may differ by (|Δ| ≤ ‖Δ‖)
            top2 = want.float().topk(2).values
            if top2[0] - top2[1] > 2 * tol * want.float().norm():
                assert int(mine.argmax()) == int(want.argmax())
            for seq in (ours[1], ref[1]):
                seq.output.append(int(want.argmax()))
            continue
        for i in rows:
            assert ours[i].cache.reserve(ours[i].cached + 1)
        got = graphs.forward([ours[i] for i in rows])
        copy_pool(ours_storage, ref_storage)
        with recorded_writes(ref_storage) as written:
            want = [_forward(model, ref[i], [ref[i].output[-1]]) for i in rows]
        _check_writes(written, ours_storage, ref_storage, kv_tol)
        errors = [_rel(got[row], w) for row, w in enumerate(want)]
        assert max(errors) < tol, (step, errors)
        for i, w in zip(rows, want):  # both continue with the reference's token
            ours[i].output.append(int(w.argmax()))
            ref[i].output.append(ours[i].output[-1])
    assert [s.cached for s in ours] == [s.cached for s in ref]
    # the slots hold each sequence's GDN state, and the slot nobody holds was left alone
    for a, b in zip(ours, ref):
        for sa, sb in zip(a.state.layers, b.state.layers):
            assert _rel(sa.ssm, sb.ssm) < state_tol
    assert not any(t.any() for t in ours_states.slot(0).tensors())


def test_the_hybrid_static_path_needs_cuda_and_fused_weights():
    model = _model(False, torch.device("cpu"))
    memory = SimpleNamespace(storage=_storage(model, "bf16"), running_slots=model.state_pool(2))
    assert build_decode_graphs(model, memory, "bf16", 2, 512, True) is None
