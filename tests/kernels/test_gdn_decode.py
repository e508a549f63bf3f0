import torch

from ninfer_engine.kernels.gdn_decode import gdn_decode_ref, gdn_decode_triton

from .conftest import rel_err


def test_gdn_decode_matches_reference_over_steps(device):
    g = torch.Generator().manual_seed(3)
    B, nk, nv, dk, dv = 2, 2, 4, 16, 32
    state = torch.randn(B, nv, dk, dv, generator=g)
    s_ref, s_tri = state.clone(), state.clone().to(device)
    for _ in range(2):  # two steps: the second reads the state the first wrote
        q, k = torch.randn(2, B, nk, dk, generator=g).bfloat16()
        v = torch.randn(B, nv, dv, generator=g).bfloat16()
        gate = -torch.rand(B, nv, generator=g)
        beta = torch.rand(B, nv, generator=g)
        o_ref = gdn_decode_ref(q, k, v, gate, beta, s_ref)
        args = [t.to(device) for t in (q, k, v, gate, beta)]
        o = gdn_decode_triton(*args, s_tri, block_v=16)
        assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s_tri, s_ref) < 1e-5
