"""The split chunk walk (`kernels.gdn_split`: the state in order, the output in parallel over
the chunks) against the torch chunked and recurrent rules and against `gdn_chunk`'s walk."""

import pytest
import torch

from ninfer_engine.kernels import gdn_chunk
from ninfer_engine.kernels.gdn_ref import chunked_gated_delta
from ninfer_engine.kernels.gdn_chunk import chunk_gated_delta
from ninfer_engine.kernels.gdn_prep import chunk_prep_triton
from ninfer_engine.kernels.gdn_fused import gdn_gated_norm_triton
from ninfer_engine.kernels.gdn_split import GatedNorm, chunk_output, split_walk, state_walk

from ninfer_engine.models import gdn
from tests.tolerance import (CAST, TRANSCENDENTAL, bound, cast_roundings, gated_delta_depth,
                             recurrence_length)

from .conftest import compile_in_child, rel_err
from .test_gdn_chunk import _check, _inputs, _layer_on_a_pool, _padded_rows, _small_gdn, _tol


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
                      out=dict(block=16))
    tol = _tol((q, k, v, g, beta, state), 16)
    assert rel_err(o[:T], want_o) < tol and rel_err(s, want_s) < tol


def _nan_after(x: torch.Tensor) -> torch.Tensor:
    """`x` copied into the front of a buffer whose rest is NaN (a read past it shows)."""
    buffer = torch.full((x.numel() + 4096,), float("nan"), dtype=x.dtype, device=x.device)
    return buffer[: x.numel()].view(x.shape).copy_(x)


@pytest.mark.parametrize("dk", [96, 24])
def test_chunk_output_reads_nothing_past_its_states(device, dk):
    """dk = 96 runs the output's dk loop in three full 32-wide blocks (not to 128, the power of
    two above: that read the next chunk's state rows and, for the last chunk, past the end),
    dk = 24 in one masked block: with NaN right after the states and V' (and after w and u
    for the state walk, whose row blocks of 64 are masked at both sizes), the outputs are
    those of the plain tensors, bit for bit."""
    T, nv, dv = 70, 2, 16
    q, k, v, g, beta, state = (t.to(device) for t in _inputs(T, nv, dk, dv, seed=9))
    tiles, n = chunk_prep_triton(q, k, v, g, beta, 16, walk=False)
    hs, vn, s = state_walk(tiles, n, k, g, state, None, 16, False)
    hs2, vn2, s2 = state_walk([_nan_after(x) for x in tiles], n, k, g, state, None, 16, False)
    assert torch.equal(hs2, hs) and torch.equal(vn2, vn) and torch.equal(s2, s)
    want = chunk_output(q, k, g, hs, vn, False, block=32)
    got = chunk_output(q, k, g, _nan_after(hs), _nan_after(vn), False, block=32)
    assert torch.isfinite(got[:T]).all() and torch.equal(got[:T], want[:T])


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


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
def test_split_output_applies_the_gated_norm(device, weight_dtype):
    """With a `GatedNorm`, the output launch stores `gdn_gated_norm`'s bf16 rows at their
    tokens (padding skipped, dv = 40 masked inside a 64-wide head tile). Against the split
    output normed by `gdn_gated_norm_triton`: bit for bit under the interpreter (the same
    arithmetic, the same sum order); on a GPU the two sums of squares may run in another
    order, so a rounding to bf16 (o, the weighted product, the result: three a side) may
    land one ulp apart."""
    nv, nk, dk, dv, lengths = 4, 2, 24, 40, [1, 70, 16]
    gen = torch.Generator().manual_seed(12)
    _, lay, padded = _padded_rows(lengths, nv, nk, dk, dv, gen, device)
    pool = torch.randn(3, nv, dk, dv, generator=gen).to(device)
    z = torch.randn(sum(lengths), nv * dv, generator=gen).bfloat16().to(device)
    weight = (1 + 0.1 * torch.randn(dv, generator=gen)).to(weight_dtype).to(device)
    index = torch.arange(3, dtype=torch.int64, device=device)
    run = dict(chunk=16, slots=index, split=True)
    o, _ = gdn_chunk.chunk_gated_delta_padded(*padded, pool.clone(), lay.first, **run)
    want = gdn_gated_norm_triton(o, z, weight, 1e-6, lay.at)
    got, _ = gdn_chunk.chunk_gated_delta_padded(
        *padded, pool.clone(), lay.first, **run,
        norm=GatedNorm(z, weight, 1e-6, lay.meta[: lay.padded]))
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    if device == "cpu":
        assert torch.equal(got, want)
    tol = bound(torch.bfloat16, dv + 2 * TRANSCENDENTAL, roundings=3 * cast_roundings())
    assert rel_err(got.float(), want.float()) < tol


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 dots exist only on the GPU")
def test_split_tf32_stays_within_bf16_rounding():
    """At the models' head size on the GPU, in TF32: the bound of `gdn_chunk`'s TF32 test
    (test_gdn_chunk.py), the same six dot stages over the chunks the state carries."""
    args = [t.cuda() for t in _inputs(1000, 4, 128, 128, seed=6)]
    ref_o, ref_s = chunked_gated_delta(*args)
    o, s = chunk_gated_delta(*args, tf32=True, split=True)
    g, dk = args[3], args[0].shape[-1]
    chunks = recurrence_length(g) / 64 + 1
    depth = gated_delta_depth(g, dk, 64)
    tol = bound(torch.float32, depth, sides=1) + bound(
        torch.float16, depth, roundings=6 * CAST * chunks, sides=1)
    assert rel_err(o, ref_o) < tol and rel_err(s, ref_s) < tol


def test_layer_prompt_rows_take_the_split_walk(monkeypatch, device):
    """With `gdn.SPLIT_WALK`, `GatedDeltaNet`'s prompt rows (bf16, a state pool's slots, the
    Triton path forced: the interpreter runs it on CPU tensors) walk with the split kernels and
    give the default walk's outputs and states: the two differ in fp32 sum order only, under
    the bf16 stores of the layer and the default walk's bf16 tiles (bound as in
    test_gdn_chunk's dispatch test; the split walk's tiles are fp32)."""
    _, (nv, dk, h) = _small_gdn()
    layer, pool, calls, gen = _layer_on_a_pool(monkeypatch, device, 3, seed=4)
    start = {n: t.clone() for n, t in pool.fields[0].items()}
    slots = [pool.slot(i).layers[0] for i in (2, 0)]
    x = torch.randn(29, h, generator=gen).to(device).bfloat16()
    runs = []
    for split in (False, True):
        for name, t in pool.fields[0].items():
            t.copy_(start[name])
        monkeypatch.setattr(gdn, "SPLIT_WALK", split)
        runs.append((layer(x, slots, [20, 9]), pool.fields[0]["ssm"][[2, 0]].clone()))
    assert [kw.get("split") for kw in calls] == [False, True]
    depth = gated_delta_depth(torch.full((20, nv), 0.0), dk, 64, normalize=True) + 3 * h
    tol = bound(torch.bfloat16, depth, roundings=8 * CAST) + bound(
        torch.bfloat16, 0, roundings=5 * cast_roundings(), sides=1)
    for got, want in zip(runs[1], runs[0]):
        assert rel_err(got.float(), want.float()) < tol


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.gdn_prep import _gdn_prep_kernel
from ninfer_engine.kernels.gdn_split import _chunk_out_kernel, _state_walk_kernel

head = dict(DK=128, DV=128, C=64)
walk = dict(head, KB=64, TWO=True, NV=32, GROUP=2, EVEN=True, TF32=True, ROWS=True, SLOTS=True)
walk_types = ["*fp32"] * 8 + ["i32", "i32", "*i32", "*i64"] + ["i32"] * 5
out_types = ["*fp32"] * 6 + ["*i32", "*bf16", "*bf16"] + ["i32"] * 9 + ["fp32"] * 2
out = dict(head, NV=32, GROUP=2, BLOCK=32, EVEN=True, TF32=True, ROUND_PROD=True,
           LIBDEVICE=True)
kernels = [  # the defaults: the walk's 64 / 32 value columns (and two stages), the output's 64
    # (and a whole head, with the gated norm)
    (_state_walk_kernel, walk_types, dict(walk, BV=64), 1),
    (_state_walk_kernel, walk_types, dict(walk, BV=32), 1),
    (_state_walk_kernel, walk_types, dict(walk, BV=32), 2),
    (_chunk_out_kernel, out_types, dict(out, BV=64, GATED=False), 1),
    (_chunk_out_kernel, out_types, dict(out, BV=128, GATED=True), 1),
    (_gdn_prep_kernel, ["*fp32"] * 12 + ["i32"] * 12 + ["fp32"],
     dict(head, BK=128, GROUP=2, BV=128, BLOCK=64, TF32=True, WALK=False), 1),
]
for k, types, consts, stages in kernels:
    assert len(types) + len(consts) == len(k.arg_names), k.arg_names
    signature = {**dict(zip(k.arg_names, types)), **dict.fromkeys(consts, "constexpr")}
    triton.compile(ASTSource(k, signature, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": 4, "num_stages": stages})
"""


def test_the_split_kernels_compile_for_the_gpu():
    """The split walk's kernels and the precompute without the old walk's tiles, compiled for
    an H200 (sm_90) at the 35B-A3B shape, no GPU needed (a child process, not under the
    interpreter)."""
    compile_in_child(COMPILE)
