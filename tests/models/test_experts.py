"""Routed experts served fp8 (`models.experts`): the serving-form decision, the stacks
`FusedParams` builds, their detection by `SparseMoE`, and the prefill paths over them."""

from __future__ import annotations

import pytest
import torch

from ninfer_engine.artifact.synth import synth_config
from ninfer_engine.models import moe
from ninfer_engine.models.experts import (DENSE, FP8_GROUPS, FP8_ROW, ExpertStack, bf16_fits,
                                          bf16_model_bytes, check_prefill_scratch, expert_form,
                                          prefill_scratch_bytes, serve_expert, stack_experts)
from ninfer_engine.models.moe import SparseMoE
from ninfer_engine.models.packed import PackedMatrix, quantize_packed
from tests.benchmark.tiny import tiny_config, tiny_source
from tests.models.engine_run import greedy_tokens, started_engine
from tests.models.qwen35_tiny import hybrid_depth
from tests.models.test_moe_dispatch import _grouped_cpu_works, close, reference
from tests.tolerance import (E4M3_HALF_STEP, E4M3_HALF_STEP_SUBNORMAL, assert_within, bound,
                             gamma)

Q4, Q5, Q6, Q8 = "q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"


@pytest.mark.parametrize("fmt,cols,mode,fits,form", [
    (FP8_ROW, 2048, "auto", True, FP8_ROW),     # fp8-row experts stay fp8, fit or not
    (FP8_ROW, 2048, "packed", True, FP8_ROW),
    (FP8_ROW, 2048, "dequant", False, DENSE),  # dequant: always the plain dtype
    (Q4, 2048, "auto", True, DENSE),           # auto keeps today's bf16 expansion if it fits
    (Q4, 2048, "auto", False, FP8_GROUPS),     # ... and repacks Q4/Q5 exactly when not
    (Q5, 512, "packed", True, FP8_GROUPS),     # packed: always the exact fp8 groups
    (Q5, 96, "packed", True, DENSE),           # no whole 128-column groups: bf16
    (Q6, 512, "packed", False, DENSE),         # Q6/Q8/nvfp4: no exact e4m3 form
    (Q8, 2048, "packed", False, DENSE),
    ("nvfp4", 2048, "packed", False, DENSE),
    ("bf16", 2048, "packed", False, DENSE),
])
def test_expert_form(fmt, cols, mode, fits, form):
    assert expert_form(fmt, cols, mode, fits) == form


def test_bf16_fit_of_the_real_shapes():
    # Flash-Next (80B-A3B class) is ~160 GB in bf16: not one H200 (~140 GB free); 35B-A3B is
    flash = bf16_model_bytes(synth_config("flash-next"))
    assert 155e9 < flash < 165e9
    assert not bf16_fits(synth_config("flash-next"), int(140e9))
    assert bf16_fits(synth_config("35b-a3b"), int(140e9))
    assert bf16_fits(synth_config("flash-next"), None)  # unknown (not CUDA): as before


def test_serve_expert_repacks_q4_exactly():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    q4 = quantize_packed(w, Q4)
    served = serve_expert(q4, "packed", True)
    assert [b.fmt for b in served.blocks] == [FP8_GROUPS]
    codes, scale = served.blocks[0].planes
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (64, 4)
    torch.testing.assert_close(served.dequantize(torch.float32), q4.dequantize(torch.float32),
                               rtol=0, atol=0)
    assert serve_expert(q4, "auto", True) is None  # bf16 fits: the caller expands it


def test_stack_experts_mixed_forms_and_views():
    """gate|up fp8-row, down bf16 (the forms of one layer may differ); members are views."""
    gen = torch.Generator().manual_seed(1)
    n, width, hidden = 3, 8, 32
    made = {}

    def get(e, m, shape):
        w = torch.randn(shape, generator=gen)
        made[e, m] = w
        return quantize_packed(w, FP8_ROW) if m != "down" else w

    gate_up, down = stack_experts(get, n, width, hidden)
    assert (gate_up.fmt, down.fmt) == (FP8_ROW, DENSE)
    assert gate_up.w.dtype == torch.float8_e4m3fn and gate_up.scale.shape == (n, 2 * width)
    assert gate_up.expert_bytes == 2 * width * hidden + 2 * width * 2  # codes + bf16 scales
    up = gate_up.member(2, width, 2 * width)
    assert isinstance(up, PackedMatrix)
    assert up.blocks[0].planes[0].data_ptr() == gate_up.w[2, width:].data_ptr()
    # e4m3 codes of x / (absmax / 448 in bf16): within half an e4m3 step, 2⁻⁴ relative for
    # normals (a bf16 scale rounded down clamps at 448: 2⁻⁸ more, inside it), half the subnormal
    # step 2⁻⁹ · scale near 0; the decode's product one fp32 rounding
    scale = made[2, "up"].abs().amax(-1, keepdim=True) / 448 * (1 + 2 ** -8)
    assert_within(up.dequantize(torch.float32), made[2, "up"],
                  (E4M3_HALF_STEP + gamma(torch.float32, 1)) * made[2, "up"].abs()
                  + E4M3_HALF_STEP_SUBNORMAL * scale)
    assert torch.equal(down.member(1), made[1, "down"])


def test_stack_experts_refuses_experts_of_different_forms():
    def get(e, m, shape):
        w = torch.ones(shape)
        return quantize_packed(w, FP8_ROW) if e == 0 else w

    with pytest.raises(ValueError, match="must share a storage format"):
        stack_experts(get, 2, 8, 32)


def _fp8_moe(recipe: str, mode: str, dtype=torch.float32):
    """The first MoE block of the tiny model (expert width 128: whole Q4/Q5 groups) over
    `FusedParams`, experts served as the bench serves recipe `recipe`."""
    from ninfer_engine.benchmark.run import packed_source
    from ninfer_engine.models.fused import FusedParams
    from ninfer_engine.models.qwen3_5 import Qwen35Model

    config = tiny_config(True)
    config["moe_intermediate_size"] = 128
    params = FusedParams(config, packed_source(tiny_source(config, dtype), recipe, mode))
    model = Qwen35Model(config, params)
    return next(b.ffn for b in model.blocks if isinstance(b.ffn, SparseMoE)), params


@pytest.mark.parametrize("recipe,mode,form", [("fp8-row", "auto", FP8_ROW),
                                              ("qwen3_6_35b_a3b", "packed", FP8_GROUPS)])
def test_fused_params_stack_fp8_experts_and_moe_finds_them(recipe, mode, form):
    m, params = _fp8_moe(recipe, mode)
    gate_up, down = m.stacked
    assert isinstance(gate_up, ExpertStack) and (gate_up.fmt, down.fmt) == (form, form)
    fused = params.fused["text/layers/0/moe/experts/gate_up"]
    assert gate_up.w.data_ptr() == fused.w.data_ptr()
    assert gate_up.scale.data_ptr() == fused.scale.data_ptr()
    assert gate_up.w.dtype == torch.float8_e4m3fn and down.w.shape == (8, 128, 128)
    assert isinstance(m.experts[5].down, PackedMatrix)


def test_sorted_dispatch_over_fp8_experts_matches_the_loop():
    m, _ = _fp8_moe("fp8-row", "auto")
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(2))
    close(m(x), reference(m, x), torch.float32, m)


@pytest.mark.skipif(not _grouped_cpu_works(), reason="no CPU _grouped_mm kernel")
@pytest.mark.parametrize("recipe,mode", [("fp8-row", "auto"), ("qwen3_6_35b_a3b", "packed")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 40])
def test_grouped_prefill_over_fp8_experts_matches_the_loop(recipe, mode, dtype, T,
                                                           monkeypatch):
    """The CUDA prefill path (routed experts decoded to the activation dtype, then
    `_grouped_mm`), forced on the CPU kernel, against the per-expert loop over the same
    packed experts."""
    monkeypatch.setattr(SparseMoE, "use_grouped", lambda self, x: self.stacked is not None)
    decoded = []
    real = ExpertStack.weights_for

    def spy(self, counts, dt):
        w = real(self, counts, dt)
        decoded.append((self.fmt, int((counts > 0).sum()), w.dtype))
        return w

    monkeypatch.setattr(ExpertStack, "weights_for", spy)
    m, _ = _fp8_moe(recipe, mode, dtype)
    x = torch.randn(T, 128, generator=torch.Generator().manual_seed(T)).to(dtype)
    got = m(x)
    assert moe._GROUPED_MM["ok"] and decoded and all(d[2] == dtype for d in decoded)
    assert all(fmt != DENSE for fmt, _, _ in decoded)
    close(got, reference(m, x), dtype, m)


class _StoredWeights:
    """An artifact's `parameter` / `row_parts` over tensors encoded in memory (a `.ninfer` file
    with the real vocabulary takes ~17 s to write here)."""

    def __init__(self, config: dict, recipe_name: str):
        from ninfer_engine.codecs import encodings
        from ninfer_engine.artifact.recipes import recipe
        from ninfer_engine.artifact.synth import parameter_shapes

        draw, choose = tiny_source(config, torch.float32), recipe(recipe_name)
        self.stored = {}
        for name, shape in parameter_shapes(config).items():
            fmt = choose(name, shape)
            self.stored[name] = (fmt, shape, encodings.encode(fmt, draw(name, shape)))

    def parameter(self, name, shape):
        from ninfer_engine.codecs import encodings

        fmt, stored_shape, raw = self.stored[name]
        return encodings.decode(fmt, raw, stored_shape).reshape(shape)

    def row_parts(self, name, shape):
        fmt, stored_shape, raw = self.stored[name]
        if len(stored_shape) != 2:
            return None
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        return [(fmt, stored_shape, 0, stored_shape[0], data)]


def test_engine_loads_fp8_row_experts_as_stored():
    """`build_model` keeps an fp8-row artifact's experts fp8 (auto and packed), decodes them
    under dequant; the model computes the same either way (fp32 on the CPU)."""
    from ninfer_engine.models import build_model
    from ninfer_engine.models.experts import load_expert

    config = tiny_config(True)
    art = _StoredWeights(config, "fp8-row")
    name, shape = "text/layers/1/moe/experts/3/down", (128, 64)
    kept = load_expert(art, name, shape, "cpu", "auto", True)
    assert [b.fmt for b in kept.blocks] == [FP8_ROW]
    # the same e4m3 codes times the same scales: the same fp32 products
    torch.testing.assert_close(kept.dequantize(torch.float32), art.parameter(name, shape),
                               rtol=0, atol=0)
    assert load_expert(art, name, shape, "cpu", "dequant", True) is None
    fp8 = build_model(config, art, "cpu", torch.float32, weights_mode="auto")
    plain = build_model(config, art, "cpu", torch.float32)
    assert isinstance(fp8.blocks[0].ffn.experts[2].gate, PackedMatrix)
    assert not isinstance(plain.blocks[0].ffn.experts[2].gate, PackedMatrix)
    assert fp8.weight_bytes() < plain.weight_bytes()
    tokens = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(1))
    # the same fp32 weights, other summation orders: γ of the model's chain, each side
    want = plain.forward(tokens, plain.new_state())
    tol = bound(torch.float32, hybrid_depth(config, len(tokens)))
    torch.testing.assert_close(fp8.forward(tokens, fp8.new_state()), want, rtol=tol,
                               atol=tol * want.abs().max().item())


@pytest.mark.skipif(not _grouped_cpu_works(), reason="no CPU _grouped_mm kernel")
def test_mixed_forms_in_one_layer_stay_grouped(monkeypatch):
    """gate|up fp8 groups with a bf16 down (the official 35B-A3B recipe's Q6-down layers under
    `packed`): both stacks found, the grouped path taken, equal to the loop."""
    gen = torch.Generator().manual_seed(5)
    n, width, hidden = 6, 16, 128
    drawn = {}

    def get(e, m, shape):
        w = torch.randn(shape, generator=gen) / shape[1] ** 0.5
        return serve_expert(quantize_packed(w, Q4), "packed", True) if m != "down" else w

    gate_up, down = stack_experts(get, n, width, hidden)
    for e in range(n):
        p = f"l/moe/experts/{e}/"
        drawn[p + "gate"], drawn[p + "up"] = gate_up.member(e, 0, width), gate_up.member(
            e, width, 2 * width)
        drawn[p + "down"] = down.member(e)
    config = dict(hidden_size=hidden, num_experts=n, num_experts_per_tok=2, norm_topk_prob=True,
                  moe_intermediate_size=width, shared_expert_intermediate_size=8)

    def params(name, shape):
        if name not in drawn:
            drawn[name] = torch.randn(shape, generator=gen) / shape[-1] ** 0.5
        return drawn[name]

    m = SparseMoE(config, params, "l/")
    assert [s.fmt for s in m.stacked] == [FP8_GROUPS, DENSE]
    monkeypatch.setattr(SparseMoE, "use_grouped", lambda self, x: self.stacked is not None)
    x = torch.randn(20, hidden, generator=gen)
    close(m(x), reference(m, x), torch.float32, m)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp8 experts are served on CUDA")
def test_cuda_engine_serves_fp8_row_experts(tmp_path):
    """An fp8-row MoE artifact on CUDA: the routed experts stay e4m3 stacks under the default
    `--cuda-weights auto`, the engine prefills (grouped matmuls over the decoded routed
    experts) and decodes through the graphs (fused fp8 kernels), and a request repeats."""
    with started_engine(tmp_path, "tiny-moe", "fp8-row") as engine:
        stacks = engine.model.params.fused
        forms = {v.fmt for k, v in stacks.items() if "/moe/experts/" in k}
        assert forms == {FP8_ROW}
        first, again = greedy_tokens(engine, "a"), greedy_tokens(engine, "b")
    assert len(first) == 24 and again == first


def test_a_kv_pool_that_leaves_no_room_for_the_fp8_prefill_scratch_is_a_startup_error():
    """Prefill decodes the largest fp8 stack to bf16 (allocated on the first prompt, after the
    KV pool): the engine checks at load that it fits, and says which flag to lower."""
    from types import SimpleNamespace

    fp8 = ExpertStack(torch.empty(4, 8, 16, dtype=torch.float8_e4m3fn), torch.ones(4, 8))
    small = ExpertStack(torch.empty(4, 2, 16, dtype=torch.float8_e4m3fn), torch.ones(4, 2))
    bf16 = ExpertStack(torch.empty(64, 8, 16, dtype=torch.bfloat16))  # read as it is: no scratch
    model = SimpleNamespace(params=SimpleNamespace(fused={"a": fp8, "b": small, "c": bf16}))
    need = 2 * 4 * 8 * 16
    assert prefill_scratch_bytes(model) == need
    assert prefill_scratch_bytes(SimpleNamespace()) == 0  # llama: no fused params
    check_prefill_scratch(model, need + 100, margin=100)
    check_prefill_scratch(model, None)  # the CPU: nothing to check
    with pytest.raises(RuntimeError, match="lower --kv-capacity"):
        check_prefill_scratch(model, need + 99, margin=100)
