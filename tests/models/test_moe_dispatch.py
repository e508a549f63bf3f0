"""Sort-based and grouped MoE dispatch (`SparseMoE`) against the per-expert-loop reference."""

from __future__ import annotations

import pytest
import torch

from ninfer_engine.kernels.moe_route import route_topk
from ninfer_engine.models import moe
from ninfer_engine.models.moe import SparseMoE
from ninfer_engine.models.packed import linear
from ninfer_engine.models.swiglu import stacked_experts
from tests.tolerance import E4M3_HALF_STEP, TRANSCENDENTAL, bound


def reference(m: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """The original `SparseMoE.__call__`: one `torch.where` per used expert."""
    weights, ids = m.route(x)
    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        rows, slot = torch.where(ids == e)
        y = m.experts[e](x[rows]) * weights[rows, slot, None]
        out.index_add_(0, rows, y)
    shared = torch.sigmoid(linear(x, m.shared_score)) * m.shared(x)
    return out + shared


def make(n_experts: int, top_k: int, renormalise: bool, dtype, stacked: bool = False,
         hidden: int = 32, width: int = 16, seed: int = 0, device="cpu") -> SparseMoE:
    config = dict(hidden_size=hidden, num_experts=n_experts, num_experts_per_tok=top_k,
                  norm_topk_prob=renormalise, moe_intermediate_size=width,
                  shared_expert_intermediate_size=24)
    gen = torch.Generator().manual_seed(seed)
    made: dict[str, torch.Tensor] = {}

    def params(name, shape):
        if name not in made:
            made[name] = (torch.randn(shape, generator=gen) / shape[-1] ** 0.5).to(device, dtype)
        return made[name]

    if stacked:  # the FusedParams layout: experts as views of [E, 2I, H] / [E, H, I]
        gate_up = torch.randn(n_experts, 2 * width, hidden, generator=gen) / hidden ** 0.5
        down = torch.randn(n_experts, hidden, width, generator=gen) / width ** 0.5
        gate_up, down = gate_up.to(device, dtype), down.to(device, dtype)
        for e in range(n_experts):
            p = f"l/moe/experts/{e}/"
            made[p + "gate"], made[p + "up"] = gate_up[e, :width], gate_up[e, width:]
            made[p + "down"] = down[e]
    return SparseMoE(config, params, "l/")


def close(a: torch.Tensor, b: torch.Tensor, dtype, m: SparseMoE) -> None:
    """The same routing (both call `m.route`), then each side's experts in its own grouping:
    the longer of the routed chain (gate/up over H, SiLU, the product, down over the width,
    the weight product, the k-slot sum) and the shared expert's (its score's sigmoid, its
    SwiGLU), and the final add; in bf16 each side stores gate, up, SiLU, the product, down,
    the weighted rows and every one of the k slot adds (`tests.tolerance`)."""
    H, k = m.router.shape[1], m.top_k
    width, shared_width = m.experts[0].gate.shape[0], m.shared.gate.shape[0]
    routed = H + TRANSCENDENTAL + 2 + width + 1 + k
    shared = H + TRANSCENDENTAL + 1 + H + TRANSCENDENTAL + 2 + shared_width + 1
    tol = bound(dtype, max(routed, shared) + 1, roundings=6 + k)
    err = (a.float() - b.float()).norm() / b.float().norm()
    assert err <= tol, err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("renormalise", [True, False])
@pytest.mark.parametrize("T", [1, 5, 64])
def test_sorted_dispatch_matches_loop(T, renormalise, dtype):
    gen = torch.Generator().manual_seed(T)
    for n_experts in (4, 7, 16):
        for top_k in range(1, 5):
            m = make(n_experts, top_k, renormalise, dtype, seed=n_experts * 10 + top_k)
            x = torch.randn(T, 32, generator=gen).to(dtype)
            got = m(x)
            assert got.dtype == dtype and got.shape == x.shape
            close(got, reference(m, x), dtype, m)


def test_fp32_sorted_dispatch_is_exact_on_loop_order():
    # same rows per expert, same per-row math: only the slot-sum order may differ
    m = make(16, 4, True, torch.float32)
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(3))
    want = reference(m, x)
    tol = bound(torch.float32, 4 + 1)  # the 4-slot sums (and the add of the shared expert)
    torch.testing.assert_close(m(x), want, rtol=tol, atol=tol * want.abs().max().item())


def test_empty_batch():
    m = make(8, 2, True, torch.float32)
    assert m(torch.zeros(0, 32)).shape == (0, 32)


def test_stacked_detection_on_plain_and_stacked_params():
    assert make(8, 2, True, torch.float32).stacked is None
    m = make(8, 2, True, torch.float32, stacked=True)
    gate_up, down = m.stacked
    assert gate_up.scale is None and down.scale is None  # bf16 (here fp32) stacks
    assert gate_up.w.shape == (8, 32, 32) and down.w.shape == (8, 32, 16)
    assert m.experts[3].up.data_ptr() == gate_up.w[3, 16:].data_ptr()


def test_stacked_detection_rejects_a_foreign_view():
    m = make(4, 2, True, torch.float32, stacked=True)
    m.experts[2].down = m.experts[2].down.clone()
    assert stacked_experts(m.experts) is None


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_stacked_detection_with_fused_params(mode):
    # through Qwen35Model's `record` wrapper: detection needs no attribute on the source, and
    # no `Tensor._base` (views made under inference_mode have none)
    from ninfer_engine.models.fused import FusedParams
    from ninfer_engine.models.qwen3_5 import Qwen35Model
    from tests.benchmark.tiny import tiny_config, tiny_source

    config = tiny_config(True)
    with mode():
        params = FusedParams(config, tiny_source(config))
        model = Qwen35Model(config, params)
    moes = [b.ffn for b in model.blocks if isinstance(b.ffn, SparseMoE)]
    assert moes
    for i, b in enumerate(model.blocks):
        if isinstance(b.ffn, SparseMoE):
            key = f"text/layers/{i}/moe/experts/"
            stacks = (params.fused[key + "gate_up"], params.fused[key + "down"])
            for found, fused in zip(b.ffn.stacked, stacks):
                found, fused = found.w, fused.w[: config["num_experts"]]  # routed experts
                assert (found.data_ptr(), found.shape, found.stride()) == (
                    fused.data_ptr(), fused.shape, fused.stride())
            # the shared expert (bf16, the routed width) is expert E of the same stacks
            assert params.shared_in_stack(f"text/layers/{i}/moe/")
            E = config["num_experts"]
            assert b.ffn.shared.gate.data_ptr() == stacks[0].w[E].data_ptr()
            assert b.ffn.shared.down.data_ptr() == stacks[1].w[E].data_ptr()


needs_grouped = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="no _grouped_mm")


def _grouped_cpu_works() -> bool:
    try:
        torch._grouped_mm(torch.ones(2, 8), torch.ones(2, 16, 8).transpose(-2, -1),
                          offs=torch.tensor([1, 2], dtype=torch.int32))
        return True
    except (RuntimeError, AttributeError):
        return False


@needs_grouped
@pytest.mark.skipif(not _grouped_cpu_works(), reason="no CPU _grouped_mm kernel")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 5, 64])
def test_grouped_path_matches_loop(T, dtype, monkeypatch):
    # the CUDA-only path, forced on the CPU kernel (torch >= 2.10 ships one)
    monkeypatch.setattr(SparseMoE, "use_grouped", lambda self, x: self.stacked is not None)
    gen = torch.Generator().manual_seed(T)
    for n_experts, top_k in ((4, 1), (7, 3), (16, 4)):
        m = make(n_experts, top_k, True, dtype, stacked=True, seed=n_experts)
        x = torch.randn(T, 32, generator=gen).to(dtype)
        close(m(x), reference(m, x), dtype, m)


def test_grouped_failure_falls_back_once(monkeypatch, caplog):
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("unsupported")

    monkeypatch.setattr(moe, "grouped_experts", broken)
    monkeypatch.setitem(moe._GROUPED_MM, "ok", True)
    monkeypatch.setattr(SparseMoE, "use_grouped",
                        lambda self, x: self.stacked is not None and moe._GROUPED_MM["ok"])
    m = make(8, 2, True, torch.float32, stacked=True)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(0))
    with caplog.at_level("WARNING"):
        close(m(x), reference(m, x), torch.float32, m)
        close(m(x), reference(m, x), torch.float32, m)
    assert len(calls) == 1 and not moe._GROUPED_MM["ok"]
    assert sum("grouped_mm" in r.message for r in caplog.records) == 1


def test_use_grouped_only_on_cuda_bf16():
    m = make(4, 2, True, torch.bfloat16, stacked=True)
    assert not m.use_grouped(torch.zeros(3, 32, dtype=torch.bfloat16))  # CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 8, 1024])
def test_grouped_mm_on_cuda_matches_sorted_loop(T):
    """The GPU check: the grouped_mm path (bf16, CUDA) against the per-expert-loop reference."""
    dev = torch.device("cuda")
    m = make(64, 8, True, torch.bfloat16, stacked=True, hidden=256, width=128, device=dev)
    assert m.stacked is not None and m.use_grouped(torch.zeros(1, device=dev, dtype=torch.bfloat16))
    x = torch.randn(T, 256, device=dev).to(torch.bfloat16)
    got = m(x)
    assert moe._GROUPED_MM["ok"], "grouped_mm raised and fell back"
    close(got, reference(m, x), torch.bfloat16, m)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_grouped_moe_on_cuda_never_waits_for_the_device():
    """An eager step's MoE layer queues its work without reading anything back to the host
    (torch.bincount read the ids' min and max: two syncs a layer of every prompt step)."""
    dev = torch.device("cuda")
    m = make(64, 8, True, torch.bfloat16, stacked=True, hidden=256, width=128, device=dev)
    x = torch.randn(96, 256, device=dev).to(torch.bfloat16)
    m(x)  # warm: cuBLAS and the caching allocator set up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        m(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T, fp8", [(1, True), (40, True), (1024, False), (1024, True)])
def test_fp8_stacks_run_the_grouped_kernels_and_match_the_loop(T, fp8, monkeypatch):
    """fp8-row stacks on CUDA take `kernels.moe_grouped` (codes read in place); the loop runs
    the same experts decoded to bf16 (each weight rounded once more, counted below). With
    `--prefill-activations fp8` a prompt-sized step (1,024 tokens: 128-row tiles) rounds its
    activations to e4m3 too; smaller ones (16-row tiles) keep them bf16."""
    dev = torch.device("cuda")
    m = make(64, 8, True, torch.bfloat16, stacked=True, hidden=256, width=128, device=dev)
    _fp8_rows(m)
    m.fp8_activations = fp8
    x = torch.randn(T, 256, device=dev).to(torch.bfloat16)
    assert m._fp8_grouped(x)
    taken = _record_fp8_act(monkeypatch)
    _close_to_the_loop(m, x, 256, 128, fp8_act=fp8 and T == 1024)
    assert taken == [fp8 and T == 1024]


def _record_fp8_act(monkeypatch) -> list[bool]:
    """Each grouped SwiGLU call's `fp8_act`, recorded."""
    taken, swiglu = [], moe.moe_grouped_swiglu
    monkeypatch.setattr(moe, "moe_grouped_swiglu",
                        lambda *a, fp8_act=False, **kw: taken.append(fp8_act) or swiglu(
                            *a, fp8_act=fp8_act, **kw))
    return taken


def _fp8_rows(m: SparseMoE) -> None:
    """`m`'s stacks as e4m3 codes with row scales; the experts' bf16 views see the decoded
    values, so the loop reference multiplies by the same weights."""
    from ninfer_engine.models.experts import ExpertStack

    stacks = []
    for stack in m.stacked:
        scale = (stack.w.float().abs().amax(-1) / 448).bfloat16()
        codes = (stack.w.float() / scale.float()[..., None]).to(torch.float8_e4m3fn)
        stack.w.copy_((codes.float() * scale.float()[..., None]).bfloat16())
        stacks.append(ExpertStack(codes, scale))
    m.stacked = tuple(stacks)


# e4m3 activations (`kernels.act_quant`): half a code step, `E4M3_HALF_STEP`. Each element's
# rounding is independent of the signs of the terms it meets, so norm-wise a stage's roundings
# add up as one rounding of this unit (`tests.tolerance`'s √n argument with one term an
# element): three stages, the tokens' through gate and through up, the SwiGLU output's through
# down
E4M3_STAGES = 3


def _close_to_the_loop(m: SparseMoE, x: torch.Tensor, H: int, width: int,
                       fp8_act: bool = False) -> None:
    """`m(x)` against the per-expert loop: the grouped chain (gate/up over H, SiLU, down over
    the width, k slots) or the shared expert's (width 24), each value stored in bf16; with
    `fp8_act` the activations' e4m3 roundings on top."""
    got, want, k = m(x), reference(m, x), m.top_k
    depth = max(H + TRANSCENDENTAL + 2 + width + 1 + k,
                H + TRANSCENDENTAL + 1 + H + TRANSCENDENTAL + 2 + 24 + 1) + 1
    err = (got.float() - want.float()).norm() / want.float().norm()
    limit = bound(torch.bfloat16, depth, roundings=7 + k) + (
        E4M3_STAGES * E4M3_HALF_STEP * fp8_act)
    assert err <= limit, err


@pytest.mark.parametrize("where, T", [("interpreter", 1), ("interpreter", 9), ("cuda", 1),
                                      ("cuda", 40), ("cuda", 1024)])
def test_a_stacked_shared_expert_runs_as_one_more_grouped_slot(where, T, monkeypatch):
    """Where the shared expert is expert E of the fp8 stacks (`FusedParams.shared_in_stack`)
    and the router and score rows are one matrix (`bind_fused`), a prompt step runs the shared
    expert as slot k of every token, weighed by sigmoid(score), routed in one launch: the
    result matches the loop over the same routing and decoded experts (the bound of the test
    above with k + 1 slots). On the CPU the kernels run in Triton's interpreter, small."""
    from ninfer_engine.kernels import _dispatch, moe_route
    from ninfer_engine.models.experts import ExpertStack

    if where == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
        dev, E, k, H, width = torch.device("cuda"), 64, 8, 256, 128
    else:
        if not (_dispatch.HAVE_TRITON and _dispatch.interpreting()):
            pytest.skip("needs Triton's interpreter")
        for module in (moe, moe_route):  # the CUDA branch, on CPU tensors
            monkeypatch.setattr(module, "use_triton", lambda tensor: True)
        dev, E, k, H, width = torch.device("cpu"), 8, 2, 64, 32
    gen = torch.Generator().manual_seed(3)
    config = dict(hidden_size=H, num_experts=E, num_experts_per_tok=k, norm_topk_prob=True,
                  moe_intermediate_size=width, shared_expert_intermediate_size=width)
    gate_up = torch.randn(E + 1, 2 * width, H, generator=gen) / H ** 0.5
    down = torch.randn(E + 1, H, width, generator=gen) / width ** 0.5
    fp8 = []
    for w in (gate_up, down):  # each row to e4m3; the experts' bf16 views see the decoded rows
        scale = (w.abs().amax(-1) / 448).bfloat16()
        codes = (w / scale.float()[..., None]).to(torch.float8_e4m3fn)
        w.copy_(codes.float() * scale.float()[..., None])
        fp8.append(ExpertStack(codes.to(dev), scale.to(dev)))
    gate_up, down = gate_up.to(dev, torch.bfloat16), down.to(dev, torch.bfloat16)
    group = (torch.randn(E + 1, H, generator=gen) / H ** 0.5).to(dev, torch.bfloat16)
    made = {"l/moe/router": group[:E], "l/moe/shared_score": group[E:]}
    for e, p in [(e, f"l/moe/experts/{e}/") for e in range(E)] + [(E, "l/moe/shared/")]:
        made[p + "gate"], made[p + "up"] = gate_up[e, :width], gate_up[e, width:]
        made[p + "down"] = down[e]
    m = SparseMoE(config, lambda name, shape: made[name], "l/")
    assert m.stacked_shared is not None and m.stacked_shared[0].w.shape[0] == E + 1
    m.stacked = tuple(ExpertStack(s.w[:E], s.scale[:E]) for s in fp8)
    m.stacked_shared = tuple(fp8)
    m.bind_fused(group)
    # E + 1 rows padded with zero rows to whole 8s (aligned GEMM outputs, sliced back)
    assert m.router_score.shape[0] == -(-(E + 1) // 8) * 8
    assert not m.router_score[E + 1:].any()
    x = torch.randn(T, H, generator=gen).to(dev, torch.bfloat16)
    calls = []
    routed = m.routed
    m.routed = lambda *a: calls.append(a[2].shape) or routed(*a)
    taken = _record_fp8_act(monkeypatch)
    got = m(x)
    assert calls == [(T, k + 1)]
    # the loop over the same routing (`kernels.moe_route`'s order among tied probabilities,
    # which torch.topk leaves unspecified), the shared expert as expert E
    weights, ids = route_topk(linear(x, group), k, True, shared=True)
    weights, want = weights.to(torch.bfloat16), torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        rows, slot = torch.where(ids == e)
        expert = m.experts[e] if e < E else m.shared
        want.index_add_(0, rows, expert(x[rows]) * weights[rows, slot, None])
    depth = max(H + TRANSCENDENTAL + 2 + width + 1 + k + 1,
                H + TRANSCENDENTAL + 1 + H + TRANSCENDENTAL + 2 + width + 1) + 1
    err = (got.float() - want.float()).norm() / want.float().norm()
    # 1,024 tokens on CUDA take 128-row tiles: e4m3 activations (`--prefill-activations fp8`)
    fp8_act = where == "cuda" and T == 1024
    assert taken == [fp8_act]
    assert err <= bound(torch.bfloat16, depth, roundings=7 + k + 1) + (
        E4M3_STAGES * E4M3_HALF_STEP * fp8_act), err


def test_a_shared_expert_outside_the_stacks_keeps_its_own_path(monkeypatch):
    """With the router and score fused (`bind_fused`) but the shared expert not in the fp8
    stacks (its width differs), a prompt step runs the routed experts through the grouped
    kernels and the shared expert on its own: no slot id E reaches a stack of E experts (the
    H200 run of this branch's first form hit an out-of-range index there). On the CPU, through
    Triton's interpreter."""
    from ninfer_engine.kernels import _dispatch, moe_route

    if not (_dispatch.HAVE_TRITON and _dispatch.interpreting()):
        pytest.skip("needs Triton's interpreter")
    for module in (moe, moe_route):
        monkeypatch.setattr(module, "use_triton", lambda tensor: True)
    m = make(8, 2, True, torch.bfloat16, stacked=True, hidden=64, width=32)
    _fp8_rows(m)
    m.bind_fused(torch.cat([m.router, m.shared_score]))
    assert m.stacked_shared is None
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    _close_to_the_loop(m, x, 64, 32)
