import pytest
import torch

from ninfer_engine.kernels.gdn_decode import gdn_decode_ref, gdn_decode_triton

from tests.tolerance import bound, gated_delta_depth

from .conftest import compile_in_child, rel_err


def _tol(gates, dk):
    """fp32 both sides (bf16 inputs are exact in fp32): the recurrent rule with l2-normalised
    q, k over the steps taken so far (`tests.tolerance.gated_delta_depth`)."""
    return bound(torch.float32, gated_delta_depth(torch.stack(gates), dk, normalize=True))


@pytest.mark.parametrize("block_v", [16, 32])  # `launch_tiles`' two tiles
def test_gdn_decode_matches_reference_over_steps(device, block_v):
    g = torch.Generator().manual_seed(3)
    B, nk, nv, dk, dv = 2, 2, 4, 16, 32
    state = torch.randn(B, nv, dk, dv, generator=g)
    s_ref, s_tri = state.clone(), state.clone().to(device)
    gates = []
    for _ in range(2):  # two steps: the second reads the state the first wrote
        q, k = torch.randn(2, B, nk, dk, generator=g).bfloat16()
        v = torch.randn(B, nv, dv, generator=g).bfloat16()
        gate = -torch.rand(B, nv, generator=g)
        beta = torch.rand(B, nv, generator=g)
        o_ref = gdn_decode_ref(q, k, v, gate, beta, s_ref)
        args = [t.to(device) for t in (q, k, v, gate, beta)]
        o = gdn_decode_triton(*args, s_tri, block_v=block_v)
        gates.append(gate[0])
        assert rel_err(o, o_ref) < _tol(gates, dk)
    assert rel_err(s_tri, s_ref) < _tol(gates, dk)


@pytest.mark.parametrize("nk, nv, dk, dv", [
    (2, 4, 16, 16),  # tiny-dense / tiny-moe
    (2, 2, 16, 8),  # dv below the default block_v (16 at small grids)
    (1, 2, 32, 16),
    (2, 4, 32, 32),
    (1, 2, 64, 64),  # several value blocks
    (2, 2, 24, 40),  # dk not a power of two, a dv tail: the masked variant
])
def test_gdn_decode_default_block_at_small_head_dims(device, nk, nv, dk, dv):
    # the decoder calls with the default block_v; a dv below it once launched no program
    g = torch.Generator().manual_seed(13)
    state = torch.randn(1, nv, dk, dv, generator=g)
    s_ref, s_tri = state.clone(), state.clone().to(device)
    q, k = torch.randn(2, 1, nk, dk, generator=g).bfloat16()
    v = torch.randn(1, nv, dv, generator=g).bfloat16()
    gate = -torch.rand(1, nv, generator=g)
    beta = torch.rand(1, nv, generator=g)
    o_ref = gdn_decode_ref(q, k, v, gate, beta, s_ref)
    o = gdn_decode_triton(*[t.to(device) for t in (q, k, v, gate, beta)], s_tri)
    assert rel_err(o, o_ref) < _tol([gate[0]], dk)
    assert rel_err(s_tri, s_ref) < _tol([gate[0]], dk)


def test_gdn_decode_addresses_state_slots_by_index(device):
    # rows 0, 1, 2 continue slots 4, 0, 2 of a 5-slot pool: the same update as rows holding
    # those states themselves, and the slots no row names are left alone
    g = torch.Generator().manual_seed(21)
    nk, nv, dk, dv = 2, 4, 16, 32
    pool = torch.randn(5, nv, dk, dv, generator=g)
    index = torch.tensor([4, 0, 2])
    q, k = torch.randn(2, 3, nk, dk, generator=g).bfloat16()
    v = torch.randn(3, nv, dv, generator=g).bfloat16()
    gate, beta = -torch.rand(3, nv, generator=g), torch.rand(3, nv, generator=g)
    rows = pool[index].clone()
    o_rows = gdn_decode_ref(q, k, v, gate, beta, rows)
    s_tri = pool.clone().to(device)
    o = gdn_decode_triton(*[t.to(device) for t in (q, k, v, gate, beta)], s_tri,
                          index.to(device))
    assert rel_err(o, o_rows) < _tol([gate[0]], dk)
    assert rel_err(s_tri[index], rows) < _tol([gate[0]], dk)
    untouched = torch.tensor([1, 3])
    assert torch.equal(s_tri[untouched].cpu(), pool[untouched])
    s_ref = pool.clone()
    assert torch.equal(gdn_decode_ref(q, k, v, gate, beta, s_ref, index), o_rows)
    assert torch.equal(s_ref[index], rows) and torch.equal(s_ref[untouched], pool[untouched])


def test_gdn_decode_walks_a_rows_tokens_and_keeps_the_trail(device):
    # two rows of 3 tokens in slots 2 and 0: the kernel's outputs, final state and the state
    # after tokens 1 and 2 (trail) against the reference walking the same tokens
    g = torch.Generator().manual_seed(34)
    nk, nv, dk, dv, T = 2, 4, 16, 32, 3
    pool = torch.randn(3, nv, dk, dv, generator=g)
    index = torch.tensor([2, 0])
    q, k = torch.randn(2, 2 * T, nk, dk, generator=g).bfloat16()
    v = torch.randn(2 * T, nv, dv, generator=g).bfloat16()
    gate, beta = -torch.rand(2 * T, nv, generator=g), torch.rand(2 * T, nv, generator=g)
    s_ref, trail_ref = pool.clone(), torch.zeros(T - 1, 2, nv, dk, dv)
    o_ref = gdn_decode_ref(q, k, v, gate, beta, s_ref, index, trail_ref)
    s_tri, trail = pool.clone().to(device), torch.zeros(T - 1, 4, nv, dk, dv, device=device)
    o = gdn_decode_triton(*[t.to(device) for t in (q, k, v, gate, beta)], s_tri,
                          index.to(device), trail)
    tol = _tol([gate[t] for t in range(T)], dk)
    assert rel_err(o, o_ref) < tol
    assert rel_err(s_tri, s_ref) < tol and torch.equal(s_tri[1].cpu(), pool[1])
    assert rel_err(trail[:, :2], trail_ref) < tol and not trail[:, 2:].any()
    # the reference's trail is the state after each token: one token at a time gets there
    one = pool.clone()
    for t in range(T - 1):
        gdn_decode_ref(q[t::T], k[t::T], v[t::T], gate[t::T], beta[t::T], one, index)
        assert torch.allclose(one[index], trail_ref[t])


def test_padding_tokens_past_valid_leave_the_state_of_the_real_ones(device):
    # rows of 4 tokens in slots 2 and 0 whose first 1 and 3 are real (`valid`, a prompt chunk
    # padded to a captured length): the state left and the real tokens' outputs are those of
    # the rows cut to their real tokens; the reference's own `valid` agrees
    g = torch.Generator().manual_seed(35)
    nk, nv, dk, dv, T = 2, 4, 16, 32, 4
    pool = torch.randn(3, nv, dk, dv, generator=g)
    index, valid = torch.tensor([2, 0]), torch.tensor([1, 3], dtype=torch.int32)
    q, k = torch.randn(2, 2 * T, nk, dk, generator=g).bfloat16()
    v = torch.randn(2 * T, nv, dv, generator=g).bfloat16()
    gate, beta = -torch.rand(2 * T, nv, generator=g), torch.rand(2 * T, nv, generator=g)
    s_tri = pool.clone().to(device)
    o = gdn_decode_triton(*[t.to(device) for t in (q, k, v, gate, beta)], s_tri,
                          index.to(device), valid=valid.to(device))
    s_ref = pool.clone()
    o_ref = gdn_decode_ref(q, k, v, gate, beta, s_ref, index, valid=valid)
    tol = _tol([gate[t] for t in range(2 * T)], dk)
    for b, (slot, n) in enumerate(zip(index.tolist(), valid.tolist())):
        real = slice(b * T, b * T + n)
        cut = pool.clone()
        o_cut = gdn_decode_ref(q[real], k[real], v[real], gate[real], beta[real], cut,
                               torch.tensor([slot]))
        assert rel_err(o[real], o_cut) < tol and rel_err(s_tri[slot], cut[slot]) < tol
        assert torch.equal(o_ref[real], o_cut) and torch.equal(s_ref[slot], cut[slot])
    assert torch.equal(s_tri[1].cpu(), pool[1])


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.gdn_decode import _gdn_decode_kernel as k

types = ["*bf16"] * 3 + ["*fp32"] * 3 + ["*i64", "*fp32", "*fp32", "*i32", "fp32", "i32"]
for block_v, warps in ((16, 1), (32, 2)):
    consts = dict(NK=16, NV=32, DK=128, DV=128, BK=128, BV=block_v, EVEN=True, INDEXED=True,
                  T=4, TRAIL=True, VALID=0, PDL=0)
    signature = {**dict(zip(k.arg_names, types)), **dict.fromkeys(consts, "constexpr")}
    triton.compile(ASTSource(k, signature, constexprs=consts),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
"""


def test_the_kernel_compiles_for_the_gpu():
    """Compiled for an H200 (sm_90) at the 35B-A3B GDN heads, a verify row of 4 tokens with
    its trail, at both of `launch_tiles`' tiles, no GPU needed."""
    compile_in_child(COMPILE)
