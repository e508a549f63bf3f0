"""Roofline arithmetic against the hand-derived numbers of perf-anchors §0 and §6."""

import pytest

from ninfer_engine.artifact.synth import synth_config
from ninfer_engine.benchmark import roofline as rf


def test_active_params_match_the_published_counts():
    # perf-anchors §0: 27B 25.6 B active (head 1.27 B included), 35B-A3B 2.95 B
    assert rf.active_params(synth_config("27b")) / 1e9 == pytest.approx(25.6, rel=0.01)
    assert rf.active_params(synth_config("35b-a3b")) / 1e9 == pytest.approx(2.95, rel=0.01)
    c = synth_config("27b")
    head = c["vocab_size"] * c["hidden_size"]
    assert rf.active_params(c) - rf.active_params(c, head=False) == head


def test_tied_head_is_counted_once():
    c = synth_config("0.8b")  # tied: the head is the embedding matrix
    assert rf.active_params(c) - rf.active_params(c, head=False) == c["vocab_size"] * 1024


def test_prefill_flops_per_token_match_perf_anchors():
    # perf-anchors §6: 27B 50.3 GFLOP/token, 35B-A3B 5.5 for an 8K prompt
    assert rf.prefill_flops(synth_config("27b"), 8192) / 8192 / 1e9 == pytest.approx(50.3, 0.01)
    assert rf.prefill_flops(synth_config("35b-a3b"), 8192) / 8192 / 1e9 == pytest.approx(5.5, 0.02)


def test_prefill_flops_small_case_by_hand():
    c = synth_config("tiny-dense")  # 4 layers, 1 attention layer, 4 heads × 32
    T = 10
    attn = 4 * 1 * 4 * 32 * (T * (T + 1) // 2)
    head = c["vocab_size"] * c["hidden_size"]
    assert rf.prefill_flops(c, T, 2) == 2 * rf.active_params(c, head=False) * T + 4 * head + attn


def test_decode_flops_grow_with_context():
    c = synth_config("27b")
    assert rf.decode_flops(c, 1024) - rf.decode_flops(c, 0) == 4 * 16 * 24 * 256 * 1024


def test_experts_read_bound_and_expectation():
    c = synth_config("35b-a3b")  # 256 experts, top-8
    assert rf.experts_read(c, 1) == (8, pytest.approx(8.0))
    bound, expected = rf.experts_read(c, 8)
    assert bound == 64 and 56 < expected < 64
    assert rf.experts_read(dict(num_experts=8, num_experts_per_tok=2), 8)[0] == 8


def test_roofline_is_the_lower_floor():
    r = rf.roofline(4, nbytes=50e9, flops=4 * 50e9, gbps=4000, tflops=800)
    assert r["bandwidth_roofline_tok_s"] == pytest.approx(4 * 4000e9 / 50e9)
    assert r["flop_roofline_tok_s"] == pytest.approx(4 * 800e12 / 200e9)
    assert r["roofline_tok_s"] == r["bandwidth_roofline_tok_s"] and r["bound"] == "bandwidth"
    r = rf.roofline(8192, nbytes=50e9, flops=8192 * 50e9, gbps=4000, tflops=800)
    assert r["bound"] == "compute" and r["roofline_tok_s"] == pytest.approx(16000)
