"""Packed (quantized) weights: the artifact's bytes kept as planes, and models built over them.

On the CPU the packed kernels dispatch to their torch references, so these tests pin the
plumbing (plane extraction from the file, row views, mixed-format fused groups, the model
loader) against the dequantize-at-load path; the Triton kernels themselves are compared with
those references in tests/kernels/test_quant_gemv.py.
"""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.artifact import open_artifact
from ninfer_engine.artifact.synth import parameter_shapes, write_synthetic
from ninfer_engine.models import build_model, is_projection
from ninfer_engine.kernels._dispatch import interpreting
from ninfer_engine.kernels.act_quant import quantize_rows_ref
from ninfer_engine.models.packed import (FP8_ROW, GEMV_MAX_ROWS, PackedMatrix, linear, load_packed,
                                          quantize_packed, serving_form)
from tests.models.engine_run import greedy_tokens, started_engine
from tests.models.qwen35_tiny import hybrid_depth
from tests.tolerance import assert_rounded_once, assert_within, bound, gamma, gamma_of

F32 = torch.float32


def _assert_matmul(got, x, w):
    """got = x @ wᵀ in fp32, each side within γ_K of Σ|xᵢwᵢ| (any summation order; the
    packed path's code × scale products are exact in fp32: ≤ 8-bit codes × fp16 scales, e4m3 ×
    bf16)."""
    K = x.shape[-1]
    assert_within(got, x @ w.t(), bound(F32, K) * (x.abs() @ w.abs().t()))


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("packed") / "tiny.ninfer"
    # q/k and MLP gate/up Q4, the rest Q5, embedding Q6: mixed formats inside fused groups
    write_synthetic("tiny-dense", path, recipe="qwen3_6_27b")
    with open_artifact(path) as art:
        yield art


def test_projection_names():
    assert is_projection("text/layers/3/gdn/query") and is_projection("text/output_head")
    assert is_projection("text/layers/0/moe/shared/down")
    assert not is_projection("text/token_embedding")
    assert not is_projection("text/layers/3/attention/query_norm")
    assert not is_projection("text/layers/3/gdn/convolution")
    assert not is_projection("text/layers/3/moe/router")
    assert not is_projection("text/layers/3/moe/experts/5/gate")


def test_planes_from_the_file_dequantize_to_the_decoded_parameter(artifact):
    shapes = parameter_shapes(artifact.config("text"))
    seen = set()
    for name, shape in shapes.items():
        if not is_projection(name) or not artifact.has_parameter(name):
            continue
        packed = load_packed(artifact, name, shape, "cpu")
        assert packed is not None, name
        assert packed.shape == shape
        seen |= {b.fmt for b in packed.blocks}
        torch.testing.assert_close(packed.dequantize(torch.float32),
                                   artifact.parameter(name, shape), rtol=0, atol=0)
    assert seen == {"q4_g64_fp16", "q5_g64_fp16"}
    # not packed: a plain-format tensor, or a non-matrix
    assert load_packed(artifact, "text/layers/0/gdn/convolution", shapes[
        "text/layers/0/gdn/convolution"], "cpu") is None


def test_mixed_blocks_multiply_like_the_dense_matrix():
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(n, 192, generator=gen) for n in (8, 24, 16, 5)]
    members = [quantize_packed(parts[0], "q4_g64_fp16"), quantize_packed(parts[1], "q5_g64_fp16"),
               quantize_packed(parts[2], "fp8_e4m3fn_row_bf16"), parts[3]]
    fused = PackedMatrix.cat(members)
    # neighbours in one encoding merge into one block (one GEMV launch)
    merged = PackedMatrix.cat([members[0], quantize_packed(parts[1], "q4_g64_fp16"), parts[3]])
    assert [(b.fmt, b.rows) for b in merged.blocks] == [("q4_g64_fp16", 32), ("dense", 5)]
    # the same codes times the same scales: the same fp32 products
    torch.testing.assert_close(merged[8:32].dequantize(torch.float32),
                               quantize_packed(parts[1], "q4_g64_fp16").dequantize(torch.float32),
                               rtol=0, atol=0)
    dense = fused.dequantize(torch.float32)
    assert fused.shape == (53, 192) and dense.shape == (53, 192)
    x = torch.randn(3, 192, generator=gen)
    _assert_matmul(linear(x, fused), x, dense)
    x = torch.randn(40, 192, generator=gen)  # a prefill chunk: dequantize, then matmul
    _assert_matmul(linear(x, fused), x, dense)
    view = fused[6:34]  # spans the first three blocks
    assert [b.rows for b in view.blocks] == [2, 24, 2]
    torch.testing.assert_close(view.dequantize(torch.float32), dense[6:34], rtol=0, atol=0)
    # quantization error of each member is bounded by its format (a wrong decoder is far off):
    # Q4 rounds x / fp16(absmax / 7) (an fp32 reciprocal product) to an integer, within half a
    # step of the group's absmax, ≤ the tensor's
    err = (dense[:8] - parts[0]).abs().max() / parts[0].abs().max()
    assert 0 < err < (1 + 2 ** -11) / 14 + gamma(F32, 2)


@pytest.mark.skipif(not (torch.cuda.is_available() or interpreting()),
                    reason="the row quantizer is a Triton kernel: CUDA or TRITON_INTERPRET=1")
def test_fp8_row_prompt_rows_multiply_as_e4m3_codes():
    """`fp8_act` (`--prefill-activations fp8`): more than GEMV_MAX_ROWS bf16 rows through an
    fp8-row matrix are multiplied as e4m3 codes with power-of-two row scales (the reference
    quantizer's, bit for bit) times the stored codes: each output is that exact product up to
    the sums' rounding (γ_K: fp32 under the interpreter; on a GPU the fp8 tensor cores'
    accumulation, ~14 bits between promotions, unit 2⁻¹³ as in test_moe_grouped_fp8_act) and
    one rounding to bf16, far tighter than the activations' own rounding (2⁻⁴ of each
    element), so the bf16 path (x unrounded) would not pass it; fewer rows, fp32 rows or the
    flag off keep their paths."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(48, 64, generator=gen)
    (block,) = quantize_packed(w, FP8_ROW).blocks
    packed = PackedMatrix([block.to(device)])
    weight = packed.dequantize(torch.float32).double().cpu()  # codes × bf16 scales: exact
    x = (torch.randn(GEMV_MAX_ROWS + 24, 64, generator=gen) * 3).bfloat16()
    got = packed.linear(x.to(device), fp8_act=True)
    assert got.dtype == torch.bfloat16 and got.shape == (40, 48)
    codes, scale = quantize_rows_ref(x)
    x_hat = codes.double() * scale.double()[:, None]
    K = x.shape[1]
    acc = gamma_of(2.0 ** -13, K) if device == "cuda" else gamma(F32, K)
    assert_rounded_once(got, x_hat @ weight.t(), acc * (x_hat.abs() @ weight.abs().t()))
    bf16_path = packed.linear(x.to(device), fp8_act=False)  # dequantized, x as given
    assert not torch.equal(bf16_path, got)
    _assert_matmul(packed.linear(x.float().to(device), fp8_act=True).cpu(), x.float(),
                   weight.float())  # fp32 rows: the dequantize path, fp32 exact
    few = x[:GEMV_MAX_ROWS].to(device)
    torch.testing.assert_close(packed.linear(few, fp8_act=True), packed.linear(few),
                               rtol=0, atol=0)  # the GEMV's rows


def test_prefill_activations_reach_every_mixer_and_mlp_projection():
    """The text config's `FP8_ACTIVATIONS_KEY` (absent: on) sets `fp8_act` on the GDN and
    attention projections (and their fused q|k|v…), the MLPs' and the MoE's shared expert; the
    router and the head stay exact."""
    from ninfer_engine.artifact.synth import build_synthetic
    from ninfer_engine.models.packed import FP8_ACTIVATIONS_KEY
    from ninfer_engine.models.qwen3_5 import Qwen35Model

    for arch, key in (("tiny-moe", None), ("tiny-dense", False)):
        config, source = build_synthetic(arch, "cpu", torch.float32)
        if key is not None:
            config = {**config, FP8_ACTIVATIONS_KEY: key}
        model = Qwen35Model(config, source)
        want = key is None
        for block in model.blocks:
            ffn = getattr(block.ffn, "shared", block.ffn)
            linears = [*block.mixer.projections, *ffn.projections]
            assert {lin.fp8_act for lin in linears} == {want} and block.mixer.fp8_act == want
        assert not model.head_projection.fp8_act


def test_auto_serving_form_repacks_q4_q5_exactly_and_dequantizes_the_rest():
    """`--cuda-weights auto`: Q4/Q5 blocks become e4m3 codes with their group scales (exact:
    the same matrix, the fp8 GEMV), fp8-row stays, Q6 (no exact e4m3 form) turns dense."""
    gen = torch.Generator().manual_seed(2)
    parts = [torch.randn(n, 256, generator=gen) for n in (8, 24, 16)]
    fused = PackedMatrix.cat([quantize_packed(parts[0], "q4_g64_fp16"),
                              quantize_packed(parts[1], "q5_g64_fp16"),
                              quantize_packed(parts[2], "fp8_e4m3fn_row_bf16")])
    served = serving_form(fused, torch.float32)
    assert [(b.fmt, b.rows) for b in served.blocks] == [("fp8_groups", 8), ("fp8_groups", 24),
                                                        ("fp8_e4m3fn_row_bf16", 16)]
    torch.testing.assert_close(served.dequantize(torch.float32), fused.dequantize(torch.float32),
                               rtol=0, atol=0)
    x = torch.randn(2, 256, generator=gen)
    _assert_matmul(linear(x, served), x, fused.dequantize(torch.float32))
    q6 = quantize_packed(parts[0], "q6_g64_fp16")
    dense = serving_form(q6, torch.bfloat16)
    assert isinstance(dense, torch.Tensor) and dense.dtype == torch.bfloat16
    torch.testing.assert_close(dense, q6.dequantize(torch.bfloat16), rtol=0, atol=0)


def test_packed_model_equals_the_dequantized_model(artifact):
    """The whole model over packed weights (GEMV for decode rows, dequantize + matmul for the
    prefill chunk) against the same artifact dequantized at load, fp32 on the CPU."""
    config = artifact.config("text")
    packed = build_model(config, artifact, "cpu", torch.float32, weights_mode="packed")
    plain = build_model(config, artifact, "cpu", torch.float32)
    assert isinstance(packed.blocks[0].mixer.w_q, PackedMatrix)
    assert not isinstance(plain.blocks[0].mixer.w_q, PackedMatrix)
    # 4-bit planes (K = 64 pads to 128) against fp32; the tied fp32 embedding dominates the model
    assert packed.blocks[0].mixer.w_q.nbytes < plain.blocks[0].mixer.w_q.nbytes / 3
    assert packed.weight_bytes() < plain.weight_bytes()
    tokens = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(1))
    s1, s2 = packed.new_state(), plain.new_state()
    # the same fp32 weights, other summation orders: γ of the model's chain, each side
    tol = bound(F32, hybrid_depth(config, 43))

    def assert_logits(got, want):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())

    assert_logits(packed.forward(tokens, s1), plain.forward(tokens, s2))
    for token in (5, 77, 901):
        t = torch.tensor([token])
        assert_logits(packed.forward(t, s1), plain.forward(t, s2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="packed weights are served on CUDA")
def test_cuda_engine_serves_fp8_rows_packed_by_default(tmp_path):
    """`--cuda-weights auto` keeps fp8-row projections packed (their GEMV beats bf16); the
    engine decodes through the graphs with them, and the same request repeats exactly."""
    with started_engine(tmp_path, "tiny-dense", "fp8-row") as engine:
        assert isinstance(engine.model.blocks[0].mixer.w_q, PackedMatrix)
        assert {b.fmt for b in engine.model.blocks[0].mixer.w_q.blocks} == {
            "fp8_e4m3fn_row_bf16"}
        first, again = greedy_tokens(engine, "a"), greedy_tokens(engine, "b")
    assert len(first) == 24 and again == first


@pytest.mark.parametrize("capability, runs", [((9, 0), True), ((8, 9), False), ((12, 0), False),
                                              ((8, 6), None)])
def test_fp8_prompt_projections_ask_the_device_once(monkeypatch, capability, runs):
    """A row-wise `torch._scaled_mm` is Hopper's in PyTorch builds (sm89 and sm120 cards refuse
    it): each device is asked once with a tiny product and keeps the bf16 path if refused;
    below sm89 (no fp8 tensor cores) it is not asked; during a CUDA graph's capture an unasked
    device answers no without asking (the probe would be recorded, not run)."""
    from ninfer_engine.kernels import fp8_rows_matmul as fp8_rows

    asked = []

    def probe(device):
        asked.append(device)
        if not runs:
            raise RuntimeError("Rowwise scaling is not currently supported on your device\n…")

    monkeypatch.setattr(fp8_rows, "_ROWWISE", {})
    monkeypatch.setattr(fp8_rows, "_probe", probe)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    cuda0 = torch.device("cuda", 0)
    if runs is not None:  # sm89+: not asked while capturing, nothing kept
        assert fp8_rows.rowwise_runs(cuda0) is False and asked == [] and fp8_rows._ROWWISE == {}
    capturing[0] = False
    assert fp8_rows.rowwise_runs(cuda0) is bool(runs)
    assert fp8_rows.rowwise_runs(cuda0) is bool(runs)  # kept: asked at most once
    assert asked == ([] if runs is None else [cuda0])
