"""The batched decode step against the reference `Qwen35Model` forward, on the CPU (interpreter)."""

from __future__ import annotations

import pytest
import torch

from ninfer_engine.kernels._dispatch import HAVE_TRITON, interpreting
from ninfer_engine.models.qwen3_5 import Qwen35Model
from tests.benchmark.tiny import bf16_step_tol, tiny_config, tiny_source

pytestmark = pytest.mark.skipif(
    not HAVE_TRITON or not (torch.cuda.is_available() or interpreting()),
    reason="needs Triton on CUDA or TRITON_INTERPRET=1")

# bf16 everywhere, against the bf16 reference: the worst case of both sides' stores
# (`tiny.bf16_step_tol`: ~0.3 on a GPU, ~0.75 interpreted); another sequence's logits are ~140 %
# away, so a mixed-up slot, page or position still fails
CONTEXT = 133  # the longest prompt, 131, and two steps


def _assert_single(err, config):
    """Against the batch-1 `StepHarness`. On the CPU the interpreter runs the same kernel
    programs on the same row: the same bits. On CUDA one row's o/down projections add fp32
    sums into the residual (`dequant_gemv` out) where several rows' cuBLAS products are rounded
    to bf16 first, and every later store may round the two differently: the same bound as
    against the reference."""
    if torch.cuda.is_available():
        assert err < bf16_step_tol(config, CONTEXT), err
    else:
        assert err == 0, err


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# the MoE step (~15 s interpreted on the 2-core box) with -m slow; test_hybrid_graphs and
# tests/experts check the MoE graph step in the default suite
@pytest.mark.parametrize("moe", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["dense", "moe"])
def test_batched_steps_match_reference(moe):
    from tests.hybrid_step_harness import StepHarness
    from ninfer_engine.models.fused import FusedParams

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    config = tiny_config(moe)
    if moe:
        # every expert routed: the tiny router is near-uniform, so bf16 noise would flip top-k
        # choices between the kernels and the reference (seen on CUDA)
        config["num_experts_per_tok"] = config["num_experts"]
    source = tiny_source(config)
    params = FusedParams(config, lambda n, s: source(n, s).to(dev))
    model = Qwen35Model(config, params)
    dec = StepHarness(model, params, 256)
    lengths = [70, 131] if moe else [5, 70, 131]  # one, two and three pages
    batched = StepHarness(model, params, 256, batch=len(lengths), weights=dec.weights)
    gen = torch.Generator().manual_seed(0)
    states, singles = [], []
    for b, n in enumerate(lengths):
        state = model.new_state()
        model.forward(torch.randint(0, 512, (n,), generator=gen).to(dev), state)
        batched.load_state(state, b)
        states.append(state)
        singles.append(StepHarness(model, params, 256))
        singles[-1].load_state(state)
    token = torch.randint(0, 512, (len(lengths),), generator=gen).to(dev)
    with torch.no_grad():
        for i in range(2):  # the second step reads the KV and GDN state the first one wrote
            got = batched.step(token)
            ref = torch.cat([model.forward(token[b : b + 1], s) for b, s in enumerate(states)])
            errs = [_rel(got[b], ref[b]) for b in range(len(lengths))]
            assert max(errs) < bf16_step_tol(config, CONTEXT), errs
            if i == 0:  # the batch-1 twin: one step is enough to pin the batching down
                one = [_rel(got[b], d.step(token[b : b + 1])[0]) for b, d in enumerate(singles)]
                _assert_single(max(one), config)
            token = ref.argmax(-1)
    assert batched.pos.tolist() == [n + 2 for n in lengths]


def test_weight_bytes_count_the_union_of_experts():
    from ninfer_engine.benchmark import roofline as rf
    from ninfer_engine.models.fused import FusedParams
    from ninfer_engine.models.qwen3_5_step_weights import HybridWeights

    config = tiny_config(True)  # 8 experts, top-2
    params = FusedParams(config, tiny_source(config))
    weights = HybridWeights(Qwen35Model(config, params), params)
    per_expert = 3 * 64 * 128 * 2  # gate, up, down of one expert in bf16
    layers = config["num_hidden_layers"]
    one = rf.step_weight_bytes(weights, 1)
    assert one == weights.weight_bytes()
    assert rf.step_weight_bytes(weights, 2) - one == layers * 2 * per_expert
    assert rf.step_weight_bytes(weights, 8) - one == layers * 6 * per_expert  # min(8, 16)
    assert rf.state_bytes(weights, 3, 100) == 3 * rf.state_bytes(weights, 1, 100)


@pytest.mark.parametrize("recipe", ["fp8-row", "qwen3_6_27b"])
def test_packed_weights_batched_match_the_batch_1_decoder(recipe):
    """The packed dequant GEMVs over B rows equal B batch-1 GEMVs (one step, two sequences);
    `qwen3_6_27b` mixes Q4 and Q5 blocks inside the fused groups."""
    from tests.hybrid_step_harness import StepHarness
    from ninfer_engine.benchmark.footprint import packed_source
    from ninfer_engine.models.fused import FusedParams
    from ninfer_engine.models.packed import PackedMatrix

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    config = tiny_config(False)
    source = tiny_source(config)
    params = FusedParams(config, packed_source(lambda n, s: source(n, s).to(dev), recipe))
    model = Qwen35Model(config, params)
    assert isinstance(model.blocks[0].mixer.w_q, PackedMatrix)  # the head is tied: dense
    dec = StepHarness(model, params, 128)
    batched = StepHarness(model, params, 128, batch=2, weights=dec.weights)
    gen = torch.Generator().manual_seed(3)
    states = []
    for b, n in enumerate([5, 70]):
        state = model.new_state()
        model.forward(torch.randint(0, 512, (n,), generator=gen).to(dev), state)
        batched.load_state(state, b)
        states.append(state)
    token = torch.tensor([7, 300], device=dev)
    with torch.no_grad():
        got = batched.step(token)
        for b, state in enumerate(states):
            dec.load_state(state)
            _assert_single(_rel(got[b], dec.step(token[b : b + 1])[0]), config)
            # the reference rounds the dequantized weights of its 9 matmuls to bf16 besides
            # its stores; another sequence is ~140 % away
            ref = model.forward(token[b : b + 1], state)[0]
            assert _rel(got[b], ref) < bf16_step_tol(config, CONTEXT, extra_stores=9)


def _fp8_expert_model(recipe, mode, dev="cpu", every_expert=True):
    """The tiny MoE model (expert width 128: whole Q4/Q5 groups) with its routed experts served
    fp8 as the bench serves `recipe` under `--cuda-weights mode`."""
    from ninfer_engine.benchmark.footprint import packed_source
    from ninfer_engine.models.fused import FusedParams

    config = tiny_config(True)
    config["moe_intermediate_size"] = 128
    if every_expert:  # see test_batched_steps_match_reference
        config["num_experts_per_tok"] = config["num_experts"]
    source = tiny_source(config)
    params = FusedParams(config, packed_source(lambda n, s: source(n, s).to(dev), recipe, mode))
    return Qwen35Model(config, params), params


@pytest.mark.parametrize("recipe,mode,form", [("fp8-row", "auto", "fp8_e4m3fn_row_bf16"),
                                              ("qwen3_6_35b_a3b", "packed", "fp8_groups")])
def test_fp8_expert_decode_matches_reference(recipe, mode, form):
    """The fused expert kernels over fp8 stacks (row scales; Q4/Q5 group scales) against the
    reference forward over the same codes (per-expert loop, dequantized)."""
    from tests.hybrid_step_harness import StepHarness

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model, params = _fp8_expert_model(recipe, mode, dev)
    dec = StepHarness(model, params, 64)  # batch 1: the kernels' B > 1 is in tests/kernels
    moe_layers = [layer for layer in dec.weights.layers if "moe" in layer]
    assert {(lr["experts_gu"].fmt, lr["experts_down"].fmt) for lr in moe_layers} == {(form, form)}
    state = model.new_state()
    model.forward(torch.randint(0, 512, (5,), generator=torch.Generator().manual_seed(4)).to(dev),
                  state)
    dec.load_state(state)
    token = torch.tensor([9], device=dev)
    with torch.no_grad():
        assert _rel(dec.step(token)[0], model.forward(token, state)[0]) < bf16_step_tol(
            model.config, CONTEXT)


def test_weight_bytes_count_fp8_experts_at_one_byte_a_weight():
    from ninfer_engine.benchmark import roofline as rf
    from ninfer_engine.models.qwen3_5_step_weights import HybridWeights

    model, params = _fp8_expert_model("fp8-row", "auto", every_expert=False)  # top-2 of 8
    weights = HybridWeights(model, params)
    H = I = 128
    per_expert = 3 * I * H + (2 * I + H) * 2  # e4m3 codes + one bf16 scale a row
    moe_layers = sum("moe" in layer for layer in weights.layers)
    assert (rf.step_weight_bytes(weights, 2) - rf.step_weight_bytes(weights, 1)
            == moe_layers * 2 * per_expert)
