"""The Triton chunked Gated DeltaNet prefill against the torch chunked and recurrent rules."""

import pytest
import torch

from ninfer_engine.kernels import gdn_chunk, gdn_fused, gdn_prep, gdn_prompt
from ninfer_engine.kernels.gdn_chunk import chunk_gated_delta
from ninfer_engine.kernels.gdn_prompt import prompt_layout
from ninfer_engine.kernels.gdn_ref import chunked_gated_delta, l2_normalize, recurrent_gated_delta
from ninfer_engine.models import gdn

from tests.tolerance import CAST, bound, cast_roundings, gated_delta_depth, recurrence_length

from .conftest import compile_in_child, rel_err

F32 = torch.float32


def _tol(args, chunk):
    """fp32 both sides (the interpreter too): γ of the chunked rule's chain against the
    recurrent rule's (`tests.tolerance.gated_delta_depth`, the chunked one is the longer)."""
    q, _, _, g, _, _ = args
    return bound(F32, gated_delta_depth(g, q.shape[-1], chunk))


def _inputs(T, nv, dk, dv, seed=0, g_scale=1.0, beta=None):
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(T, nv, dk, generator=gen))
    k = l2_normalize(torch.randn(T, nv, dk, generator=gen))
    v = torch.randn(T, nv, dv, generator=gen)
    g = -torch.rand(T, nv, generator=gen) * g_scale
    b = torch.rand(T, nv, generator=gen) if beta is None else beta(T, nv, gen)
    state = torch.randn(nv, dk, dv, generator=gen)
    return q, k, v, g, b, state


def _check(args, device, chunk, **kw):
    tol = _tol(args, chunk)
    ref_o, ref_s = chunked_gated_delta(*args, chunk=chunk)
    rec_o, rec_s = recurrent_gated_delta(*args)
    state = args[-1].clone()
    o, s = chunk_gated_delta(*[t.to(device) for t in args], chunk=chunk, **kw)
    assert o.shape == ref_o.shape and s.shape == ref_s.shape
    assert torch.equal(args[-1], state)  # the input state is not modified
    for got, want in ((o, ref_o), (s, ref_s), (o, rec_o), (s, rec_s)):
        assert rel_err(got, want) < tol, rel_err(got, want)


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("T", [1, 5, 64, 70, 130])
@pytest.mark.parametrize("nv, d", [(1, 16), (3, 32)])
def test_chunk_matches_torch_rules(device, nv, d, T, chunk):
    _check(_inputs(T, nv, d, d, seed=T), device, chunk)


@pytest.mark.parametrize("nv, dk, dv", [(3, 16, 32), (1, 32, 16), (2, 24, 40)])
def test_chunk_rectangular_and_masked_heads(device, nv, dk, dv):
    # dk != dv; dk = 24 / dv = 40 take the masked (non power of two) variant
    _check(_inputs(70, nv, dk, dv, seed=1), device, 16)


def test_chunk_several_value_blocks(device):
    # dv = 64 with block_v = 16: four programs per head, each with its own state columns
    _check(_inputs(70, 2, 32, 64, seed=2), device, 16, block_v=16)


@pytest.mark.parametrize("chunk", [16, 64])
def test_chunk_strong_decay(device, chunk):
    # in-chunk cumulative decays reach ~-1500: the pairwise decays must not cancel them, and a
    # chunk's state decay underflows to 0 without producing NaNs
    args = _inputs(130, 3, 32, 32, seed=3, g_scale=50.0)
    _check(args, device, chunk)
    o, s = chunk_gated_delta(*[t.to(device) for t in args], chunk=chunk)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()


@pytest.mark.parametrize("which", ["zero", "one", "mixed"])
def test_chunk_beta_extremes(device, which):
    def beta(T, nv, gen):
        if which == "zero":
            return torch.full((T, nv), 1e-4)
        if which == "one":
            return 1 - 1e-4 * torch.rand(T, nv, generator=gen)
        return torch.where(torch.rand(T, nv, generator=gen) < 0.5, 1e-4, 1 - 1e-4)

    _check(_inputs(70, 3, 16, 16, seed=4, g_scale=0.1, beta=beta), device, 16)


# a split inside the first chunk and one past a chunk boundary; the others with -m slow
@pytest.mark.parametrize("split", [1, pytest.param(20, marks=pytest.mark.slow),
                                   pytest.param(64, marks=pytest.mark.slow), 100])
def test_chunk_continues_state_across_calls(device, split):
    q, k, v, g, b, state = (t.to(device) for t in _inputs(150, 3, 16, 16, seed=5))
    one_o, one_s = chunk_gated_delta(q, k, v, g, b, state, chunk=16)
    a, c = slice(0, split), slice(split, None)
    o1, s1 = chunk_gated_delta(q[a], k[a], v[a], g[a], b[a], state, chunk=16)
    o2, s2 = chunk_gated_delta(q[c], k[c], v[c], g[c], b[c], s1, chunk=16)
    tol = _tol((q, k, v, g, b, state), 16)
    assert rel_err(torch.cat([o1, o2]), one_o) < tol
    assert rel_err(s2, one_s) < tol


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 dots exist only on the GPU")
def test_chunk_tf32_stays_within_bf16_rounding():
    args = [t.cuda() for t in _inputs(1000, 4, 128, 128, seed=6)]
    ref_o, ref_s = chunked_gated_delta(*args)
    o, s = chunk_gated_delta(*args, tf32=True)
    # TF32 dots round both operands to 10 mantissa bits (u = 2⁻¹¹, as fp16): two roundings
    # per dot, relative to its terms, for each of a chunk's six dot stages (k·kᵀ, the solve,
    # w·S, qd·S, p·v', keᵀ·v') over the chunks the state carries; on top of the fp32 chain
    g, dk = args[3], args[0].shape[-1]
    chunks = recurrence_length(g) / 64 + 1
    depth = gated_delta_depth(g, dk, 64)
    tol = bound(F32, depth, sides=1) + bound(torch.float16, depth, roundings=6 * CAST * chunks,
                                             sides=1)
    assert rel_err(o, ref_o) < tol and rel_err(s, ref_s) < tol


def test_walk_widens_bf16_tiles_exactly(device):
    # the walk over bf16 tiles is the walk over those values widened to fp32: the same dots,
    # so equal up to their fp32 sum order (bit-equal under the interpreter)
    q, k, v, g, b, state = [t.to(device) for t in _inputs(130, 3, 32, 32, seed=7)]
    tiles, n = gdn_prep.chunk_prep_triton(q, k, v, g, b, 64, tiles_dtype=torch.bfloat16)
    widened = tuple(t.float() for t in tiles)
    o, s = gdn_chunk._walk(tiles, n, state, None, 64, False, None, 4, 1)
    o32, s32 = gdn_chunk._walk(widened, n, state, None, 64, False, None, 4, 1)
    tol = bound(F32, gated_delta_depth(g.cpu(), 32, 64))
    assert rel_err(o, o32) <= tol and rel_err(s, s32) <= tol


@pytest.mark.parametrize("T", [64, 300])
def test_chunk_bf16_tiles_within_their_rounding(device, T):
    args = _inputs(T, 2, 32, 32, seed=8)
    ref_o, ref_s = chunked_gated_delta(*args)
    o, s = chunk_gated_delta(*[t.to(device) for t in args], tiles_dtype=torch.bfloat16)
    # each of a chunk's five tiles (w, u, qd, ke, p) rounded once to bf16, counted on the
    # chain once per chunk the state carries; on top of the fp32 chain of both sides
    g = args[3]
    chunks = recurrence_length(g) / 64 + 1
    tol = bound(F32, gated_delta_depth(g, 32, 64)) + bound(
        torch.bfloat16, 0, roundings=5 * cast_roundings() * chunks, sides=1)
    assert rel_err(o, ref_o) < tol and rel_err(s, ref_s) < tol


def _small_gdn():
    """A GDN layer's config at test size, and its (nv, dk, hidden)."""
    nk, nv, dk, dv, h = 1, 2, 16, 16, 32
    return ({"hidden_size": h, "linear_num_key_heads": nk, "linear_num_value_heads": nv,
             "linear_key_head_dim": dk, "linear_value_head_dim": dv,
             "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6}, (nv, dk, h))


def _spy_on_the_walk(monkeypatch) -> list[dict]:
    """Force the Triton path (the interpreter runs it on CPU tensors) and record the keyword
    arguments of every `chunk_gated_delta_padded` call."""
    calls = []
    kernel = gdn_chunk.chunk_gated_delta_padded

    def spy(*args, **kw):
        calls.append(dict(kw))
        return kernel(*args, **kw)

    for module in (gdn, gdn_prompt, gdn_fused):
        monkeypatch.setattr(module, "use_triton", lambda t: True)
    monkeypatch.setattr(gdn_chunk, "chunk_gated_delta_padded", spy)
    return calls


def _layer_on_a_pool(monkeypatch, device, slots: int, seed: int):
    """A bf16 `_small_gdn` layer of random weights, a `StatePool` of `slots` random states
    for it, the walk's calls recorded (`_spy_on_the_walk`): (layer, pool, calls, generator)."""
    from ninfer_engine.kv.slots import StatePool

    config, _ = _small_gdn()
    gen = torch.Generator().manual_seed(seed)
    weights = {}

    def params(name, shape):
        return weights.setdefault(name, (torch.randn(shape, generator=gen) * 0.3).to(device))

    layer = gdn.GatedDeltaNet(config, lambda n, s: params(n, s).bfloat16(), "layers/0/")
    calls = _spy_on_the_walk(monkeypatch)
    pool = StatePool(slots, [layer.state_layout(torch.bfloat16)], device, gdn.GDNState)
    for t in pool.fields[0].values():
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    return layer, pool, calls, gen


def test_layer_dispatches_prefill_to_the_kernel(monkeypatch, device):
    """`GatedDeltaNet.__call__` takes the Triton kernels (the fused prologue, the chunk walk
    with TF32 dots, the gated norm) for a bf16 prefill where `use_triton` holds (forced here,
    so the interpreter runs them on CPU tensors); fp32 activations (the exact path) and single
    tokens keep the torch rules."""
    config, (nv, dk, h) = _small_gdn()
    gen = torch.Generator().manual_seed(7)
    weights = {}

    def params(name, shape):
        return weights.setdefault(name, torch.randn(shape, generator=gen).to(device) * 0.3)

    x = torch.randn(70, h, generator=gen).to(device)

    def run(dtype):
        layer = gdn.GatedDeltaNet(config, lambda n, s: params(n, s).to(dtype), "layers/0/")
        state = layer.new_state(dtype, torch.device(device))
        xs = x.to(dtype)
        return layer(xs[:40], [state], [40]), layer(xs[40:41], [state], [1]), state.ssm

    ref = run(torch.bfloat16)
    calls = _spy_on_the_walk(monkeypatch)
    run(torch.float32)
    assert calls == []  # fp32 activations: the torch rule
    got = run(torch.bfloat16)
    # the 40-token prefill (the default walk, bf16 tiles); the single token is recurrent
    assert calls == [{"tf32": True, "split": False, "norm": None, "tiles_dtype": torch.bfloat16,
                      "out_dtype": torch.bfloat16}]
    monkeypatch.setattr(gdn, "BF16_TILES", False)  # the benchmark's switch reaches the walk
    run(torch.bfloat16)
    assert calls[-1]["tiles_dtype"] == torch.float32
    # bf16 activations both ways: the projections, the conv and the gated norm store their
    # outputs in bf16 (about 8 stores to the output, 6 to the state), the kernel's TF32 dots
    # round each operand to fp16 precision (2 per product term) over the chunked chain, and
    # the precompute's five tiles are each rounded once to bf16 (one chunk: 40 tokens)
    depth = gated_delta_depth(torch.full((40, nv), 0.0), dk, 64, normalize=True) + 3 * h
    tol = bound(torch.bfloat16, depth, roundings=8 * CAST) + bound(
        torch.float16, depth, roundings=2, sides=1) + bound(
        torch.bfloat16, 0, roundings=5 * cast_roundings(), sides=1)
    for a, b in zip(got, ref):
        assert rel_err(a.float(), b.float()) < tol


def _padded_rows(lengths, nv, nk, dk, dv, gen, device):
    """Random normed q, k and v, g, beta of rows of `lengths` tokens on `device`: (them, the
    rows' `prompt_layout` in 16-token chunks, them in its padded order)."""
    T = sum(lengths)
    q = l2_normalize(torch.randn(T, nk, dk, generator=gen))
    k = l2_normalize(torch.randn(T, nk, dk, generator=gen))
    v = torch.randn(T, nv, dv, generator=gen)
    g = -torch.rand(T, nv, generator=gen)
    beta = torch.rand(T, nv, generator=gen)
    inputs = [t.to(device) for t in (q, k, v, g, beta)]
    lay = prompt_layout(tuple(lengths), torch.device(device), 16)
    return inputs, lay, [t.new_zeros((lay.padded, *t.shape[1:])).index_copy_(0, lay.at, t)
                         for t in inputs]


@pytest.mark.parametrize("lengths", [[1, 70, 16], [130], [5, 5, 5, 5], [64, 1, 33]])
@pytest.mark.parametrize("nv, nk, dk, dv", [(3, 3, 32, 32), (4, 2, 24, 40)])
def test_rows_in_one_launch_equal_each_row_alone(device, lengths, nv, nk, dk, dv):
    """`chunk_gated_delta_padded` over rows padded to whole chunks walks (row, head)
    programs: each row's outputs and state equal `chunk_gated_delta` on that row alone, bit for
    bit (the same chunk tiles, the padding the single-row path adds to its own tail)."""
    gen = torch.Generator().manual_seed(len(lengths))
    inputs, lay, padded = _padded_rows(lengths, nv, nk, dk, dv, gen, device)
    states = torch.randn(len(lengths), nv, dk, dv, generator=gen)
    o, s = gdn_chunk.chunk_gated_delta_padded(*padded, states.to(device), lay.first, chunk=16)
    o = o.index_select(0, lay.at)
    start = 0
    for i, n in enumerate(lengths):
        rows = slice(start, start + n)
        want_o, want_s = chunk_gated_delta(*(t[rows] for t in inputs), states[i].to(device),
                                           chunk=16)
        assert torch.equal(o[rows], want_o) and torch.equal(s[i], want_s), i
        start += n


@pytest.mark.parametrize("lengths", [[1, 70, 16], [64, 1, 33]])
def test_bf16_inputs_walk_as_their_fp32_values_and_a_bf16_output_is_rounded_once(device,
                                                                                  lengths):
    """q, k, v in bf16 (the prompt step's, `kernels.gdn_prompt`) are widened in registers: the
    precompute and walk of them equal those of the same values in fp32, bit for bit; with
    `out_dtype` bf16 the output is that fp32 output rounded to the nearest."""
    nv, nk, dk, dv = 4, 2, 24, 40
    gen = torch.Generator().manual_seed(13)
    _, lay, (q, k, v, g, beta) = _padded_rows(lengths, nv, nk, dk, dv, gen, device)
    q, k, v = (x.bfloat16() for x in (q, k, v))
    states = torch.randn(len(lengths), nv, dk, dv, generator=gen).to(device)
    want_o, want_s = gdn_chunk.chunk_gated_delta_padded(q.float(), k.float(), v.float(), g, beta,
                                                        states, lay.first, chunk=16)
    o, s = gdn_chunk.chunk_gated_delta_padded(q, k, v, g, beta, states, lay.first, chunk=16,
                                              out_dtype=torch.bfloat16)
    assert o.dtype == torch.bfloat16 and torch.equal(o, want_o.bfloat16())
    assert torch.equal(s, want_s)


@pytest.mark.parametrize("lengths", [[1, 70, 16], [64, 1, 33]])
def test_rows_continue_their_pool_slots_in_place(device, lengths):
    """With `slots`, the walk reads row i's state from row slots[i] of a state pool and writes
    it back there: outputs and new states bit for bit those of the stacked rows, the pool's
    other rows untouched (vLLM's `state_indices`: no stack, no copy back)."""
    nv, nk, dk, dv = 4, 2, 24, 40
    gen = torch.Generator().manual_seed(11)
    _, lay, padded = _padded_rows(lengths, nv, nk, dk, dv, gen, device)
    pool = torch.randn(6, nv, dk, dv, generator=gen).to(device)
    slots = [4, 0, 2]
    want_o, want_s = gdn_chunk.chunk_gated_delta_padded(*padded, pool[slots].clone(), lay.first,
                                                        chunk=16)
    before = pool.clone()
    index = torch.tensor(slots, dtype=torch.int64, device=device)
    o, s = gdn_chunk.chunk_gated_delta_padded(*padded, pool, lay.first, chunk=16, slots=index)
    assert s is pool and torch.equal(o, want_o) and torch.equal(pool[slots], want_s)
    others = [i for i in range(6) if i not in slots]
    assert torch.equal(pool[others], before[others])


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.gdn_chunk import _gdn_chunk_kernel as k

# the engine's: bf16 tiles (w, u, qd, ke, p), fp32 cd and states, a bf16 output
types = ["*bf16"] * 5 + ["*fp32"] * 3 + ["*bf16", "i32", "*i32", "*i64"] + ["i32"] * 22
consts = dict(NV=32, DK=128, DV=128, C=64, BK=128, BV=64, EVEN=True, TF32=True, ROWS=True,
              SLOTS=True, O_BF16=True)
signature = {**dict(zip(k.arg_names, types)), **dict.fromkeys(consts, "constexpr")}
triton.compile(ASTSource(k, signature, constexprs=consts), target=GPUTarget("cuda", 90, 32),
               options={"num_warps": 8, "num_stages": 1})
"""


def test_the_walk_over_pool_slots_compiles_for_the_gpu():
    """The rows-by-slot walk compiled for an H200 (sm_90) at the 35B-A3B shape, no GPU needed
    (Triton's compiler checks what its interpreter does not); a child process, not under the
    interpreter."""
    compile_in_child(COMPILE)


def test_layer_prompt_rows_of_a_state_pool_run_in_place(monkeypatch, device):
    """`GatedDeltaNet` over prompt rows whose states are slots of one `StatePool` (the engine's
    running slots) addresses them by index in place; the outputs and states equal those of the
    same states held apart (stacked, then copied back), bit for bit, and the pool's other
    slots are untouched."""
    _, (_, _, h) = _small_gdn()
    layer, pool, calls, gen = _layer_on_a_pool(monkeypatch, device, 5, seed=3)
    before = {n: t.clone() for n, t in pool.fields[0].items()}
    slots = [pool.slot(i).layers[0] for i in (3, 1)]
    apart = [gdn.GDNState(s.conv.clone(), s.ssm.clone()) for s in slots]
    lengths = [20, 9]
    x = torch.randn(sum(lengths), h, generator=gen).to(device).bfloat16()
    want = layer(x, apart, lengths)
    got = layer(x, slots, lengths)
    # held apart: stacked; pool slots: by index
    assert [kw.pop("slots", None) is not None for kw in calls] == [False, True]
    assert torch.equal(got, want)
    for s, a in zip(slots, apart):
        assert torch.equal(s.conv, a.conv) and torch.equal(s.ssm, a.ssm)
    for name, t in pool.fields[0].items():
        assert torch.equal(t[[0, 2, 4]], before[name][[0, 2, 4]])
        assert not torch.equal(t[[3, 1]], before[name][[3, 1]])
