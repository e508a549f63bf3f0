"""`--cpu-matmul int8`: per-row int8 weights through `torch._weight_int8pack_mm` (CPU decode)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine, EngineLoadError
from ninfer_engine.models import Segment, build_model
from ninfer_engine.models.int8_rows import Int8Rows, quantize_rows

from tests.models.engine_run import greedy_events

from tests.tolerance import bound, gamma, unit_roundoff

from .helpers import DictWeights, FakeArtifact, error_chains, text_config, tiny_llama

CPU = torch.device("cpu")
BF16, F32 = torch.bfloat16, torch.float32
INT8_STEP = 1 / 127  # a row's int8 code step relative to its absmax (`quantize_rows`)


def _model(hf, matmul_dtype=None):
    return build_model(text_config(hf), DictWeights.from_hf(hf), CPU, matmul_dtype=matmul_dtype)


def _last_logits(model, prompt: list[int], chunk: int) -> torch.Tensor:
    cache, logits = model.new_cache(), None
    for start in range(0, len(prompt), chunk):
        ids = prompt[start:start + chunk]
        logits = model.forward(torch.tensor(ids), torch.arange(start, start + len(ids)),
                               [Segment(cache, start, len(ids))], torch.tensor([len(ids) - 1]))
    return logits[0]


@pytest.mark.parametrize("cols", [64, 20])  # 20: not a multiple of the kernel's K step, padded
def test_int8_rows_quantize_per_row_and_multiply_like_the_dequantized_weight(cols):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(40, cols, generator=gen) * torch.linspace(0.01, 3.0, 40)[:, None]
    codes, scales = quantize_rows(w)
    assert codes.dtype == torch.int8 and scales.shape == (40,)
    assert codes.abs().max() <= 127
    rows = Int8Rows(w)
    step = scales.float()[:, None]
    # half a step per row (codes round w / scale; a bf16 scale rounded down clamps at 127 by
    # at most 127·2⁻⁸ < ½ step), plus the fp32 division and product
    assert ((rows.dequantize() - w).abs() <= 0.5 * step + gamma(F32, 2) * w.abs()).all()
    x = torch.randn(3, cols, generator=gen)
    y = rows(x)
    assert y.dtype == torch.float32 and y.shape == (3, 40)
    ref = x.bfloat16().float() @ rows.dequantize().t()
    # the same bf16 activations and codes: the kernel's K-term sum, the row scale's product and
    # its bf16 output (2 roundings), against fp32
    tol = bound(BF16, cols + 1, roundings=2)
    assert torch.allclose(y, ref, rtol=tol, atol=tol * ref.abs().max().item())


@torch.inference_mode()
def test_int8_matmuls_track_fp32():
    hf = tiny_llama(seed=3)
    prompt = list(range(1, 40))
    exact = _last_logits(_model(hf), prompt, 16)
    fast = _last_logits(_model(hf, torch.int8), prompt, 16)
    assert fast.dtype == torch.float32
    error = ((fast - exact).abs().max() / exact.abs().max()).item()
    # per int8 matmul (QKV, output, gate/up, down per layer, the head): the weights' half code
    # step (a rounding of unit 1/254 relative to the row's absmax), the bf16 cast of the
    # activations and the bf16 output; the rest is the fp32 chain, both sides
    model = _model(hf)
    matmuls = 4 * len(model.layers) + 1
    depth = error_chains(model, len(prompt))[1][0]
    tol = bound(F32, depth) + matmuls * (INT8_STEP / 2 + 2 * unit_roundoff(BF16))
    assert 0 < error < tol, error  # and above 0: the int8 copies are used


@torch.inference_mode()
def test_int8_decode_runs_every_projection_and_the_head_through_the_int8_kernel(monkeypatch):
    """Fails if the int8 path silently falls back to fp32 (or bf16) weights."""
    hf = tiny_llama(seed=3)  # tied embedding: the head gets its own int8 copy
    model = _model(hf, torch.int8)
    linears = [model.head, *(getattr(layer, name) for layer in model.layers
                             for name in ("qkv", "output", "gate_up", "down"))]
    assert all(isinstance(linear.narrow, Int8Rows) for linear in linears)
    assert model.embedding.dtype == torch.float32  # the gather stays exact
    cache = model.new_cache()
    model.forward(torch.arange(1, 21), torch.arange(20), [Segment(cache, 0, 20)],
                  torch.tensor([19]))
    calls = []
    kernel = torch._weight_int8pack_mm

    def counted(a, codes, scales):
        calls.append(codes.shape)
        return kernel(a, codes, scales)

    monkeypatch.setattr(torch, "_weight_int8pack_mm", counted)
    logits = model.forward(torch.tensor([5]), torch.tensor([20]), [Segment(cache, 20, 1)],
                           torch.tensor([0]))
    assert len(calls) == 4 * len(model.layers) + 1
    assert calls[-1] == (model.vocab_size, hf.config.hidden_size)
    assert torch.isfinite(logits).all()


def test_int8_without_the_kernel_is_a_clear_startup_error(monkeypatch, device):
    monkeypatch.delattr(torch, "_weight_int8pack_mm")
    with pytest.raises(RuntimeError, match="--cpu-matmul int8 is unavailable"):
        _model(tiny_llama(seed=3), torch.int8)
    if device.type != "cpu":
        return  # an engine on a GPU ignores --cpu-matmul
    artifact = FakeArtifact(tiny_llama(seed=3, vocab_size=259))
    with pytest.raises(EngineLoadError, match="--cpu-matmul int8 is unavailable"):
        Engine(EngineConfig(artifact=Path("tiny.ninfer"), cpu_matmul="int8"), artifact)


def test_engine_serves_with_int8_matmuls(device):
    if device.type != "cpu":
        pytest.skip("--cpu-matmul applies to the CPU")
    artifact = FakeArtifact(tiny_llama(seed=3, vocab_size=259))
    exact = Engine(EngineConfig(artifact=Path("tiny.ninfer")), artifact)
    engine = Engine(EngineConfig(artifact=Path("tiny.ninfer"), cpu_matmul="int8"), artifact)
    assert isinstance(engine.model.layers[0].gate_up.narrow, Int8Rows)
    # the console's weight memory counts the int8 copies beside the fp32 weights
    assert engine.model.weight_bytes() > exact.model.weight_bytes()
    engine.start()
    try:
        events = greedy_events(engine, tuple(b"hello"), 6)
    finally:
        engine.stop()
    assert sum(len(e.token_ids) for e in events) == 6 and events[-1].finish == "length"
