"""`kernels.slot_sum`: a prompt step's MoE slots summed (plus the residual) against float64 and its
torch reference, and the MoE layer's residual taken in that sum."""
import pytest
import torch

from ninfer_engine.kernels.slot_sum import slot_sum_ref, slot_sum_triton
from tests.tolerance import assert_within, cast_roundings, gamma, unit_roundoff

from .conftest import compile_in_child

BF16, F32 = torch.bfloat16, torch.float32


def _inputs(T, K, H, seed):
    gen = torch.Generator().manual_seed(seed)
    slots = (torch.randn(T, K, H, generator=gen) * 3).to(BF16)
    residual = (torch.randn(T, H, generator=gen) * 10).to(BF16)
    return slots, residual


@pytest.mark.parametrize("T, K, H", [(7, 9, 40), (1, 8, 2048), (33, 3, 1100)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_the_kernel_is_its_reference_bit_for_bit_and_within_one_rounding(device, T, K, H,
                                                                         with_residual):
    """The same fp32 additions in the same order, one rounding: the kernel equals the torch
    reference exactly, and both are float64's sum within the fp32 sum's γ_(K+1) of Σ|terms| and
    one bf16 rounding (`cast_roundings()` where the interpreter truncates)."""
    slots, residual = _inputs(T, K, H, T + K)
    residual = residual if with_residual else None
    got = slot_sum_triton(slots.to(device), None if residual is None else residual.to(device))
    want = slot_sum_ref(slots, residual)
    assert got.dtype == BF16 and got.shape == (T, H)
    assert torch.equal(got.cpu(), want)
    terms = [slots.double()[:, j] for j in range(K)] + (
        [] if residual is None else [residual.double()])
    exact = sum(terms)
    magnitude = sum(t.abs() for t in terms)
    limit = gamma(F32, K + 1) * magnitude
    limit = limit + cast_roundings() * unit_roundoff(BF16) * (exact.abs() + limit)
    assert_within(got, exact, limit)


@torch.inference_mode()
def test_the_moe_layer_adds_the_residual_it_is_given():
    """`SparseMoE(x, residual)` is `residual + SparseMoE(x)` (the torch path's order, bit for
    bit), as the decoder block now asks it on one rank."""
    from tests.benchmark.tiny import tiny_config, tiny_source
    from ninfer_engine.models.moe import SparseMoE

    config = tiny_config(True)
    source = tiny_source(config)
    layer = SparseMoE(config, source, "text/layers/0/")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, config["hidden_size"], generator=gen).to(BF16)
    residual = torch.randn(5, config["hidden_size"], generator=gen).to(BF16)
    assert torch.equal(layer(x, residual=residual), residual + layer(x))


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.slot_sum import _slot_sum_kernel as k

types = ["*bf16"] * 3 + ["i32"]
consts = dict(H=2048, K=9, BT=4, BH=1024, RESIDUAL=True)
signature = {**dict(zip(k.arg_names, types)), **dict.fromkeys(consts, "constexpr")}
triton.compile(ASTSource(k, signature, constexprs=consts), target=GPUTarget("cuda", 90, 32),
               options={"num_warps": 4})
"""


def test_the_kernel_compiles_for_the_gpu():
    """Compiled for an H200 (sm_90) at the 35B-A3B shape (8 routed slots and the shared one),
    no GPU needed; a child process, not under the interpreter."""
    compile_in_child(COMPILE)
