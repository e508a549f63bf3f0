"""`GatedAttention`'s CUDA branch with its projections fused (`bind_fused`): one q|gate|k|v GEMM
and the decode step's q/k norm + rotary kernel give the unfused branch's output and K/V, run on
the CPU through Triton's interpreter."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.kernels import _dispatch
from ninfer_engine.models import gated_attention
from ninfer_engine.models.gated_attention import GatedAttention, PartialRope
from tests.tolerance import TRANSCENDENTAL, bound

H, NQ, NKV, D = 64, 4, 2, 16
CONFIG = {"hidden_size": H, "num_attention_heads": NQ, "num_key_value_heads": NKV,
          "head_dim": D, "rms_norm_eps": 1e-6}
ROPE = {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}


def test_fused_projection_and_qk_norm_rope_match_the_unfused_branch(monkeypatch):
    if not (_dispatch.HAVE_TRITON and _dispatch.interpreting()):
        pytest.skip("needs Triton's interpreter")
    monkeypatch.setattr(gated_attention, "use_triton", lambda tensor: True)
    gen = torch.Generator().manual_seed(11)
    fused = torch.randn(2 * (NQ + NKV) * D, H, generator=gen) / H ** 0.5
    rows = dict(zip(("query", "gate", "key", "value"),
                    fused.split([NQ * D, NQ * D, NKV * D, NKV * D])))  # row views, as FusedParams
    extra = {"output": torch.randn(H, NQ * D, generator=gen) / (NQ * D) ** 0.5,
             "query_norm": 0.1 * torch.randn(D, generator=gen),
             "key_norm": 0.1 * torch.randn(D, generator=gen)}

    def params(name, shape):
        t = {**rows, **extra}[name.rpartition("/")[2]]
        assert tuple(t.shape) == shape
        return t

    attn = GatedAttention(CONFIG, params, "l/", PartialRope(D, ROPE))
    lengths = [3, 5]
    x = torch.randn(sum(lengths), H, generator=gen)
    positions = torch.cat([torch.arange(n) + 2 * i for i, n in enumerate(lengths)])

    def run():
        caches = [attn.new_state(torch.float32, torch.device("cpu")) for _ in lengths]
        return attn(x, caches, lengths, positions), caches

    calls = []
    kernel = gated_attention.qk_norm_rope_triton
    monkeypatch.setattr(gated_attention, "qk_norm_rope_triton",
                        lambda *a: calls.append(a[0].shape) or kernel(*a))
    plain, plain_caches = run()
    attn.bind_fused(fused)
    got, got_caches = run()
    assert calls == [(sum(lengths), fused.shape[0])]  # the fused branch ran, once
    # each side in fp32: the projections (H), the norms (D, an rsqrt), the rotation (cos/sin,
    # a product and a sum), the scores (D), the softmax over ≤ 5 keys, the weighted sum, the
    # gate's sigmoid, the output projection (NQ·D)
    depth = H + D + TRANSCENDENTAL + 2 * TRANSCENDENTAL + 2 + D + 5 + TRANSCENDENTAL + 5 \
        + TRANSCENDENTAL + 2 + NQ * D
    tol = bound(torch.float32, depth)
    assert (got - plain).abs().max() <= tol * plain.abs().max()
    for a, b in zip(got_caches, plain_caches):
        for u, v in ((a.k, b.k), (a.v, b.v)):
            assert (u - v).abs().max() <= tol * v.abs().max()
