"""The split chunk walk (`kernels.gdn_split`: the state in order, the output in parallel over
the chunks) against the torch chunked and recurrent rules and against `gdn_chunk`'s walk."""

import pytest
import torch

from ninfer_engine.kernels import gdn_chunk
from ninfer_engine.kernels.gdn_chunk import chunk_gated_delta
from ninfer_engine.kernels.gdn_prep import chunk_prep_triton
from ninfer_engine.kernels.gdn_split import split_walk

from .conftest import rel_err
from .test_gdn_chunk import _check, _inputs, _padded_rows, _tol


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("T", [1, 5, 70, 130])
def test_split_matches_torch_rules(device, T, chunk):
    _check(_inputs(T, 3, 32, 32, seed=T), device, chunk, split=True)


@pytest.mark.parametrize("nv, dk, dv", [(3, 16, 32), (2, 24, 40), (1, 128, 16), (1, 96, 16)])
def test_split_rectangular_and_masked_heads(device, nv, dk, dv):
    # dk = 24 / dv = 40 take the masked (non power of two) variant of both kernels; dk = 128
    # holds the walk's state in two row blocks (the models' shape), dk = 96 the second masked
    _check(_inputs(70, nv, dk, dv, seed=1), device, 16, split=True)


def test_split_strong_decay_and_value_blocks(device):
    # cumulative gates to ~-1500 (a chunk's decay underflows to 0) over four value blocks
    args = _inputs(130, 2, 32, 64, seed=3, g_scale=50.0)
    _check(args, device, 16, split=True, block_v=16)
    o, s = chunk_gated_delta(*[t.to(device) for t in args], chunk=16, split=True)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()


def test_split_output_over_column_blocks(device):
    """The output kernel's q·S and q·kᵀ summed over dk in 16-wide blocks (three, the last one
    masked), q/k heads shared by two value heads each: equal to `gdn_chunk`'s walk within the
    fp32 chain's bound."""
    T, nk, nv, dk, dv = 70, 2, 4, 48, 32
    q, k, v, g, beta, state = _inputs(T, nv, dk, dv, seed=5)
    q, k = q[:, :nk].contiguous(), k[:, :nk].contiguous()
    args = [t.to(device) for t in (q, k, v, g, beta)]
    want_o, want_s = chunk_gated_delta(*args, state.to(device), chunk=16)
    tiles, n = chunk_prep_triton(*args, 16, walk=False)
    o, s = split_walk(tiles, n, args[0], args[1], args[3], state.to(device), None, 16, False,
                      out_block=16)
    tol = _tol((q, k, v, g, beta, state), 16)
    assert rel_err(o[:T], want_o) < tol and rel_err(s, want_s) < tol


@pytest.mark.parametrize("lengths", [[1, 70, 16], [64, 1, 33]])
def test_split_rows_of_a_pool_in_place(device, lengths):
    """Rows padded to whole chunks continuing pool slots in place: the outputs and states of
    `gdn_chunk`'s walk over the same rows, within the fp32 chain's bound, and the pool's other
    rows untouched."""
    nv, nk, dk, dv = 4, 2, 24, 40
    gen = torch.Generator().manual_seed(11)
    inputs, lay, padded = _padded_rows(lengths, nv, nk, dk, dv, gen, device)
    pool = torch.randn(6, nv, dk, dv, generator=gen).to(device)
    slots = [4, 0, 2]
    index = torch.tensor(slots, dtype=torch.int64, device=device)
    want_pool = pool.clone()
    want_o, _ = gdn_chunk.chunk_gated_delta_padded(*padded, want_pool, lay.first, chunk=16,
                                                   slots=index)
    before = pool.clone()
    o, s = gdn_chunk.chunk_gated_delta_padded(*padded, pool, lay.first, chunk=16, slots=index,
                                              split=True)
    q, k, v, g, beta = (t.cpu() for t in inputs)
    tol = _tol((q, k, v, g, beta, pool), 16)
    assert s is pool
    assert rel_err(o.index_select(0, lay.at), want_o.index_select(0, lay.at)) < tol
    assert rel_err(pool[slots], want_pool[slots]) < tol
    others = [i for i in range(6) if i not in slots]
    assert torch.equal(pool[others], before[others])


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.gdn_prep import _gdn_prep_kernel
from ninfer_engine.kernels.gdn_split import _chunk_out_kernel, _state_walk_kernel

shape = dict(DK=128, DV=128, C=64, BK=128)
kernels = [
    (_state_walk_kernel, ["*fp32"] * 8 + ["i32", "i32", "*i32", "*i64"] + ["i32"] * 5,
     dict(DK=128, DV=128, C=64, KB=64, TWO=True, NV=32, GROUP=2, BV=64, EVEN=True, TF32=True, ROWS=True, SLOTS=True)),
    (_chunk_out_kernel, ["*fp32"] * 6 + ["i32"] * 8 + ["fp32"],
     dict(shape, NV=32, GROUP=2, BV=64, BLOCK=64, EVEN=True, TF32=True)),
    (_gdn_prep_kernel, ["*fp32"] * 12 + ["i32"] * 12 + ["fp32"],
     dict(shape, GROUP=2, BV=128, BLOCK=64, TF32=True, WALK=False)),
]
for k, types, consts in kernels:
    assert len(types) + len(consts) == len(k.arg_names), k.arg_names
    signature = {**dict(zip(k.arg_names, types)), **dict.fromkeys(consts, "constexpr")}
    triton.compile(ASTSource(k, signature, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": 4, "num_stages": 1})
"""


def test_the_split_kernels_compile_for_the_gpu():
    """The split walk's kernels and the precompute without the old walk's tiles, compiled for
    an H200 (sm_90) at the 35B-A3B shape, no GPU needed (a child process, not under the
    interpreter)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
