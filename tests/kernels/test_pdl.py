"""Programmatic dependent launch (`kernels.pdl`): when it is used, what it compiles to, and that
a chain of PDL launches computes what the same chain computes without it (CUDA)."""

import pytest
import torch

from ninfer_engine.kernels import pdl
from ninfer_engine.kernels._dispatch import HAVE_TRITON

from .conftest import compile_in_child

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="Triton is not installed")


@pytest.fixture
def pdl_on():
    pdl.set_pdl(True)
    yield
    pdl.set_pdl(True)


def test_no_pdl_off_cuda(pdl_on):
    assert pdl.pdl_launch(torch.zeros(2)) == {}  # CPU tensors (and the interpreter): never


COMPILE = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.dequant_gemv_kernels import _dequant_gemv_kernel

names = ("x_ptr", "g_ptr", "w_ptr", "s_ptr", "y_ptr", "B", "N", "K", "k_per_split", "SXB")
types = ("*bf16", "*bf16", "*fp8e4nv", "*bf16", "*fp32", "i32", "i32", "i32", "i32", "i32")
consts = {"SCALE": "row", "DOT": tl.bfloat16, "BB": 16, "BN": 32, "BK": 256, "KT": 256,
          "FMA": True, "ATOMIC": True, "STAGES": 3, "ACT": "none", "PDL": int(sys.argv[1])}
signature = {**dict(zip(names, types)), **dict.fromkeys(consts, "constexpr")}
kernel = triton.compile(ASTSource(_dequant_gemv_kernel, signature, constexprs=consts),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print(kernel.asm["ptx"])
"""


def test_gemv_kernel_compiles_to_grid_dependency_control():
    """Compiled for an H100/H200 (sm_90; no GPU needed, but not under the interpreter, hence
    a child process): with PDL=1 the GEMV waits for its predecessor before its first load and
    releases its dependents; with PDL=0 it does neither."""
    ptx = {flag: compile_in_child(COMPILE, str(flag)) for flag in (0, 1)}
    assert "griddepcontrol.wait" in ptx[1] and "griddepcontrol.launch_dependents" in ptx[1]
    assert "griddepcontrol" not in ptx[0]
    body = ptx[1][ptx[1].index(".entry"):]
    first_load = min(body.find(op) for op in ("ld.global", "cp.async") if op in body)
    assert body.index("griddepcontrol.wait") < first_load  # no global load before it


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pdl_chain_equals_plain_chain(pdl_on):
    """RMSNorm -> one-row GEMV -> routing, captured in a CUDA graph with and without PDL (the
    engine's decode step replays such graphs): the same bits out."""
    from ninfer_engine.benchmark.timing import graph_of
    from ninfer_engine.kernels.dequant_gemv import engine_launch
    from ninfer_engine.kernels.dequant_gemv_kernels import dequant_gemv_triton
    from ninfer_engine.kernels.moe_route import route_topk_triton
    from ninfer_engine.kernels.rmsnorm import rms_norm_triton

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("PDL needs compute capability 9.0")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, 2048, device="cuda", generator=g).bfloat16()
    norm = torch.rand(2048, device="cuda", generator=g).bfloat16()
    w = (torch.randn(256, 2048, device="cuda", generator=g) / 45).bfloat16()
    launch = engine_launch(1, 256, 2048, w, None)  # one bf16 row: no K split, no atomics

    def step():
        y, _ = rms_norm_triton(x, norm, 1e-6)
        return route_topk_triton(dequant_gemv_triton(y, w, None, **launch), 8, True)

    results = []
    for enabled in (False, True):
        pdl.set_pdl(enabled)
        assert ("launch_pdl" in pdl.pdl_launch(x)) == enabled
        out = []
        graph = graph_of(lambda out=out: out.append(step()))
        graph.replay()
        torch.cuda.synchronize()
        results.append([t.clone() for t in out[-1]])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))
