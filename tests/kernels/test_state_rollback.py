"""`kernels.state_rollback`: a verify step's GDN states taken back by device counts, against
its torch form, bit for bit (a copy): every kept count of every row, slots and trail rows in
another order than the batch's, a block tail, and rows that keep every token left alone."""
import itertools

import pytest
import torch

from ninfer_engine.kernels.state_rollback import state_rollback_ref, state_rollback_triton

from .conftest import compile_in_child


@pytest.mark.parametrize("dtype, inner", [(torch.float32, (3, 4, 5)), (torch.bfloat16, (7, 9))])
def test_the_kernel_takes_back_exactly_the_rows_the_torch_form_does(device, dtype, inner):
    gen = torch.Generator().manual_seed(0)
    L, S, last, B = 3, 6, 3, 2  # layers, slots, trail steps (k drafts), rows
    state = torch.randn(L, S, *inner, generator=gen).to(dtype)
    trail = torch.randn(L, last, 4, *inner, generator=gen).to(dtype)
    rows, slots = torch.tensor([2, 0]), torch.tensor([4, 1])
    moved = 0
    for kept in itertools.product(range(1, last + 2), repeat=B):
        kept = torch.tensor(kept)
        want = state.clone()
        state_rollback_ref(want, trail, kept, rows, slots, last)
        got = state.to(device, copy=True)
        state_rollback_triton(got, trail.to(device), kept.to(device), rows.to(device),
                              slots.to(device), last, block=16, splits=2)
        assert torch.equal(got.cpu(), want), kept
        for b in range(B):  # the rule itself: a kept count past the trail leaves its slot
            k, slot = int(kept[b]), int(slots[b])
            expect = state[:, slot] if k == last + 1 else trail[:, k - 1, int(rows[b])]
            assert torch.equal(want[:, slot], expect)
        untouched = [s for s in range(S) if s not in slots.tolist()]
        assert torch.equal(want[:, untouched], state[:, untouched])
        moved += not torch.equal(want, state)
    assert moved == last ** B + 2 * last  # every count but (last + 1, last + 1) moves a slot


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.state_rollback import _rollback_kernel as k

types = ["*fp32", "*fp32", "*i64", "*i64", "*i64"] + ["i64"] * 7
consts = dict(BLOCK=4096)
signature = {**dict(zip(k.arg_names, types)), **dict.fromkeys(consts, "constexpr")}
triton.compile(ASTSource(k, signature, constexprs=consts), target=GPUTarget("cuda", 90, 32),
               options={"num_warps": 4})
"""


def test_the_kernel_compiles_for_the_gpu():
    """Compiled for an H100/H200 (sm_90), no GPU needed; a child process, not under the
    interpreter (whose Python runs what the compiler may refuse)."""
    compile_in_child(COMPILE)
