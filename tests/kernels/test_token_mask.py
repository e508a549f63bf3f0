"""The grammar-mask kernel against its torch reference (`kernels.token_mask`): a selection, so
the same logits bit for bit, for fp32 and bf16 logits, every row constrained in order or some
rows out of order, and logits cut inside the last word or padded past the bits."""
import pytest
import torch

from ninfer_engine.kernels.token_mask import BLOCK, masked_logits_ref, masked_logits_triton

from .conftest import compile_in_child


def _bits(rows: int, words: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-2**31, 2**31 - 1, (rows, words), generator=g, dtype=torch.int64).int()
    bits[0, 0] = 1 << 5  # token 5 alone in the first word of the first bits row
    return bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [[0, 1, 2, 3], [3, 0], [2]])
@pytest.mark.parametrize("columns", [BLOCK + 37 * 32, BLOCK + 37 * 32 - 9, BLOCK + 37 * 32 + 70])
def test_the_kernel_masks_as_the_reference(device, dtype, rows, columns):
    words = (BLOCK + 37 * 32) // 32  # several blocks of columns a row
    logits = torch.randn(4, columns, generator=torch.Generator().manual_seed(1)).to(dtype)
    bits = _bits(len(rows), words, seed=len(rows))
    want = masked_logits_ref(logits.clone(), bits, rows)
    got = masked_logits_triton(logits.to(device), bits.to(device), rows).cpu()
    assert torch.equal(got, want)
    first = rows[0]
    assert got[first, :32].isfinite().nonzero().flatten().tolist() == [5]
    if columns > 32 * words:  # padded logits columns are never allowed
        assert torch.isinf(got[first, 32 * words:]).all()
    for row in set(range(4)) - set(rows):  # rows without a grammar are copied as they are
        assert torch.equal(got[row], logits[row])


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.token_mask import _masked_logits_kernel as k

for logits in ("*fp32", "*bf16"):
    for every in (True, False):
        types = [logits, logits, "*i32", "*i32", "i32", "i32", "i32"]
        consts = dict(ALL_ROWS=every, BLOCK=2048)
        signature = {**dict(zip(k.arg_names, types)), **dict.fromkeys(consts, "constexpr")}
        triton.compile(ASTSource(k, signature, constexprs=consts),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
"""


def test_the_kernel_compiles_for_the_gpu():
    """Both variants compiled for an H200 (sm_90), no GPU needed (Triton's compiler checks what
    its interpreter does not); a child process, not under the interpreter."""
    compile_in_child(COMPILE)
