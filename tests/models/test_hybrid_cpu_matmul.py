"""`--cpu-matmul bf16|int8` on the hybrid family (Qwen3.5 dense and MoE) on the CPU: every
projection and the head get a decode copy that few-row calls multiply by; prefill keeps fp32."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ninfer_engine import engine_load
from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.models import build_model
from ninfer_engine.models.gdn import GatedDeltaNet
from ninfer_engine.models.int8_rows import Int8Rows
from ninfer_engine.models.layers import NARROW_MAX_ROWS
from ninfer_engine.models.swiglu import SwiGLU
from tests.engine.hybrid_helpers import HybridArtifact
from tests.models.engine_run import greedy_events

pytest.importorskip("transformers.models.qwen3_5_moe")

CPU = torch.device("cpu")
FAMILIES = ("qwen3_5", "qwen3_5_moe")
NARROW = {"bf16": torch.bfloat16, "int8": torch.int8}
# median over 12 decode steps (each from the fp32 model's state) of max |Δlogit| / max |logit|,
# measured over seeds 0-4: bf16 0.008-0.013, int8 0.020-0.034 (single steps reach 0.2-0.3:
# these random tiny models amplify small errors where a GDN q/k head is nearly zero before its
# L2 norm, or where two experts nearly tie; rounding the fp32 weights to bf16 does the same)
LOGIT_BOUND = {"bf16": 0.04, "int8": 0.1}
GDN_PROJECTIONS = {"q": "w_q", "k": "w_k", "v": "w_v", "z": "w_z", "a": "w_a", "b": "w_b",
                   "out": "w_out"}
ATTENTION_PROJECTIONS = {"q": "w_q", "gate": "w_gate", "k": "w_k", "v": "w_v", "o": "w_o"}


@pytest.fixture(scope="module")
def artifacts():
    return {family: HybridArtifact(family, seed=1) for family in FAMILIES}


def _model(artifact, kind: str | None = None):
    return build_model(artifact.config("text"), artifact, CPU, torch.float32,
                       NARROW.get(kind))


def _projections(model) -> dict[str, tuple]:
    """name -> (the projection as called, the weight its module keeps), named per module, so
    a projection that skipped the option (or multiplies by another weight) is caught."""
    named = {"head": (model.head_projection, model.head)}
    for i, block in enumerate(model.blocks):
        m = block.mixer
        names = GDN_PROJECTIONS if isinstance(m, GatedDeltaNet) else ATTENTION_PROJECTIONS
        named.update({f"{i}/{p}": (getattr(m, p), getattr(m, w)) for p, w in names.items()})
        ffn = block.ffn
        mlps = ({"mlp": ffn} if isinstance(ffn, SwiGLU) else
                {"shared": ffn.shared, **{f"expert{e}": x for e, x in enumerate(ffn.experts)}})
        for key, mlp in mlps.items():
            for member, proj in zip(("gate", "up", "down"), mlp.projections):
                named[f"{i}/{key}/{member}"] = (proj, getattr(mlp, member))
    return named


def _routed(name: str) -> bool:
    return "/expert" in name


def _narrow_ptr(proj) -> int:
    narrow = proj.narrow
    return (narrow.codes if isinstance(narrow, Int8Rows) else narrow).data_ptr()


def _count_narrow_calls(monkeypatch, kind: str) -> list[tuple[int, int]]:
    """(rows, data_ptr of the narrow weight) of every decode-copy matmul from now on."""
    calls = []
    if kind == "int8":
        kernel = torch._weight_int8pack_mm

        def counted_int8(a, codes, scales):
            calls.append((a.shape[0], codes.data_ptr()))
            return kernel(a, codes, scales)

        monkeypatch.setattr(torch, "_weight_int8pack_mm", counted_int8)
    else:
        linear = F.linear

        def counted_linear(x, w, *args):
            if w.dtype == torch.bfloat16:  # the fp32 model has no other bf16 weight
                calls.append((x.shape[0], w.data_ptr()))
            return linear(x, w, *args)

        monkeypatch.setattr(F, "linear", counted_linear)
    return calls


@torch.inference_mode()
@pytest.mark.parametrize("kind", ["bf16", "int8"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_projection_and_the_head_get_a_decode_copy(artifacts, family, kind):
    exact, model = _model(artifacts[family]), _model(artifacts[family], kind)
    named = _projections(model)
    assert len(named) > 20
    for name, (proj, weight) in named.items():
        assert proj.weight is weight, name  # the module's own fp32 tensor, not a copy
        assert weight.dtype == torch.float32, name
        if kind == "int8":
            assert isinstance(proj.narrow, Int8Rows), name
            # int8 rows: within half a code step (the row scale), rounded in fp32: one step
            assert torch.allclose(proj.narrow.dequantize(), weight,
                                  atol=proj.narrow.scales.float().max().item()), name
        else:
            assert proj.narrow.dtype == torch.bfloat16, name
            assert torch.equal(proj.narrow, weight.bfloat16()), name
    assert all(proj.narrow is None for proj, _ in _projections(exact).values())
    if family == "qwen3_5_moe":  # the router picks the experts from exact scores
        assert model.blocks[0].ffn.router.dtype == torch.float32
    # the console's weight memory counts the decode copies beside the fp32 weights
    narrow_bytes = sum(proj.narrow_bytes for proj, _ in named.values())
    assert narrow_bytes > 0
    assert model.weight_bytes() == exact.weight_bytes() + narrow_bytes


@torch.inference_mode()
@pytest.mark.parametrize("kind", ["bf16", "int8"])
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_rows_take_the_decode_copies_and_prefill_keeps_fp32(artifacts, family, kind,
                                                                   monkeypatch):
    """Fails if the option is ignored (no narrow calls) or leaks into prefill."""
    exact, model = _model(artifacts[family]), _model(artifacts[family], kind)
    named = _projections(model)
    by_ptr = {_narrow_ptr(proj): name for name, (proj, _) in named.items()}
    calls = _count_narrow_calls(monkeypatch, kind)
    prompt = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(3))
    state, exact_state = model.new_state(), exact.new_state()
    logits = model.forward(prompt, state)  # every row reaches the head: 40 rows
    prefill = [by_ptr[ptr] for _, ptr in calls]
    if family == "qwen3_5":
        assert prefill == []
        assert torch.equal(logits, exact.forward(prompt, exact_state))  # all fp32
    else:
        # only a routed expert that few of the 80 (token, slot) pairs picked runs narrow
        assert all(_routed(name) for name in prefill)
        assert all(rows <= NARROW_MAX_ROWS for rows, _ in calls)
    calls.clear()
    model.forward(torch.tensor([7]), state)
    decode = [by_ptr[ptr] for _, ptr in calls]
    assert all(rows == 1 for rows, _ in calls)
    # every projection but the unrouted experts' runs narrow, each once, the head last
    assert sorted(n for n in decode if not _routed(n)) == sorted(n for n in named
                                                                 if not _routed(n))
    assert decode[-1] == "head"
    moe_layers = sum(not isinstance(b.ffn, SwiGLU) for b in model.blocks)
    top_k = artifacts[family].config("text").get("num_experts_per_tok", 0)
    assert sum(map(_routed, decode)) == 3 * top_k * moe_layers


@torch.inference_mode()
@pytest.mark.parametrize("kind", ["bf16", "int8"])
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_logits_track_fp32(artifacts, family, kind):
    exact, model = _model(artifacts[family]), _model(artifacts[family], kind)
    prompt = torch.randint(0, 128, (24,), generator=torch.Generator().manual_seed(1))
    steps = torch.randint(0, 128, (12,), generator=torch.Generator().manual_seed(2))
    state = exact.new_state()
    exact.forward(prompt, state)
    errors = []
    for token in steps:  # each step from the same fp32 state: one step's error, not a drift
        fast = model.forward(token[None], copy.deepcopy(state))[0]
        ref = exact.forward(token[None], state)[0]
        assert fast.dtype == torch.float32 and torch.isfinite(fast).all()
        errors.append(((fast - ref).abs().max() / ref.abs().max()).item())
    error = torch.tensor(errors).median().item()
    assert 0 < error < LOGIT_BOUND[kind], errors


def test_engine_serves_a_hybrid_model_with_int8_matmuls(artifacts, monkeypatch):
    monkeypatch.setattr(engine_load, "serving_device", lambda config: CPU)  # CPU-only option
    artifact = artifacts["qwen3_5_moe"]
    engine = Engine(EngineConfig(artifact=Path("tiny.ninfer"), cpu_matmul="int8",
                                 prefill_chunk=64, max_context=1024), artifact)
    assert isinstance(engine.model.blocks[0].mixer.q.narrow, Int8Rows)
    assert isinstance(engine.model.blocks[0].ffn.experts[0].projections[0].narrow, Int8Rows)
    assert engine.stats.weight_bytes > _model(artifact).weight_bytes()
    calls = _count_narrow_calls(monkeypatch, "int8")
    engine.start()
    try:
        events = greedy_events(engine, tuple(range(1, 30)), 6)
    finally:
        engine.stop()
    assert sum(len(e.token_ids) for e in events) == 6 and events[-1].finish == "length"
    assert len(calls) > 5 * len(engine.model.blocks)  # the decode steps ran int8
