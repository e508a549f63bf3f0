
import pytest
import torch

from ninfer_engine.kernels.paged_attention import (
    MERGE_SPLITS,
    PAGE,
    paged_attention_ref,
    paged_attention_triton,
    dequantize_kv_int8,
    quantize_kv_int8,
)

from .conftest import attention_tol, compile_in_child, rel_err


@pytest.mark.parametrize("quant", [False, True])
def test_paged_attention_matches_reference(device, quant):
    g = torch.Generator().manual_seed(4)
    B, nq, nkv, D, n_pages = 2, 4, 2, 32, 6
    lens = torch.tensor([70, 150], dtype=torch.int32)
    # pages handed out shuffled, so the table really indirects
    table = torch.randperm(n_pages, generator=g).int().view(B, 3)
    q = torch.randn(B, nq, D, generator=g).bfloat16()
    k = torch.randn(n_pages, PAGE, nkv, D, generator=g).bfloat16()
    v = torch.randn(n_pages, PAGE, nkv, D, generator=g).bfloat16()
    ks = vs = None
    if quant:
        (k, ks), (v, vs) = quantize_kv_int8(k, 16), quantize_kv_int8(v, 16)
    ref = paged_attention_ref(q, k, v, table, lens, ks, vs)
    dev = [None if t is None else t.to(device) for t in (q, k, v, table, lens, ks, vs)]
    out = paged_attention_triton(*dev)
    keys = dequantize_kv_int8(k, ks) if quant else k
    assert rel_err(out, ref) < attention_tol(q, keys, int(lens.max()))


@pytest.mark.parametrize("nq, nkv, D", [(4, 2, 16), (4, 2, 32), (2, 2, 32), (8, 1, 32),
                                        (8, 2, 64), (3, 1, 16)])
def test_paged_attention_decoder_shapes(device, nq, nkv, D):
    # batch 1 with a split grid sized by max_seq_len, as StepHarness calls it; GQA 1..8
    _check_one_row(device, nq, nkv, D, n_pages=3, length=100, seed=14)


def _check_one_row(device, nq, nkv, D, n_pages, length, seed):
    """One sequence of `length` tokens over `n_pages` shuffled pages, the split grid sized by
    all of them, against the reference."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(n_pages, generator=g).int()[None]
    lens = torch.tensor([length], dtype=torch.int32)
    q = torch.randn(1, nq, D, generator=g).bfloat16()
    k = torch.randn(n_pages, PAGE, nkv, D, generator=g).bfloat16()
    v = torch.randn(n_pages, PAGE, nkv, D, generator=g).bfloat16()
    ref = paged_attention_ref(q, k, v, table, lens)
    out = paged_attention_triton(*[t.to(device) for t in (q, k, v, table, lens)],
                                 max_seq_len=n_pages * PAGE)
    assert rel_err(out, ref) < attention_tol(q, k, length)


def test_a_strided_query_gives_the_dense_querys_rows(device):
    """The hybrid runner's planned decode step passes q as a [heads, T, D] transpose: the
    output's rows are still the batch's rows (an output shaped like the strided q once put
    row b's heads in other rows' places from batch 2 on)."""
    g = torch.Generator().manual_seed(5)
    B, nq, nkv, D, n_pages = 3, 4, 2, 32, 6
    table = torch.randperm(n_pages, generator=g).int().view(B, 2)
    lens = torch.tensor([9, 64, 100], dtype=torch.int32)
    k = torch.randn(n_pages, PAGE, nkv, D, generator=g).bfloat16()
    v = torch.randn(n_pages, PAGE, nkv, D, generator=g).bfloat16()
    heads_first = torch.randn(nq, B, D, generator=g).bfloat16()
    args = [t.to(device) for t in (k, v, table, lens)]
    strided = paged_attention_triton(heads_first.to(device).transpose(0, 1), *args)
    dense = paged_attention_triton(heads_first.transpose(0, 1).contiguous().to(device), *args)
    assert torch.equal(strided.reshape(B, -1), dense.reshape(B, -1))


def test_a_long_context_merges_more_splits_than_one_block(device):
    """Batch 1 over 40 pages: 40 splits, merged MERGE_SPLITS at a time with a running max; the
    last pages lie past the sequence's end, so the last block's splits are empty."""
    assert 40 > 2 * MERGE_SPLITS
    _check_one_row(device, nq=2, nkv=1, D=16, n_pages=40, length=33 * PAGE - 5, seed=6)


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer_engine.kernels.paged_attention import MERGE_SPLITS, _paged_merge_kernel as k

consts = dict(D=256, SB=MERGE_SPLITS, PDL=1)
signature = {**dict(zip(k.arg_names, ["*fp32", "*fp32", "*bf16", "i32"])),
             **dict.fromkeys(consts, "constexpr")}
triton.compile(ASTSource(k, signature, constexprs=consts), target=GPUTarget("cuda", 90, 32),
               options={"num_warps": 4})
"""


def test_the_merge_kernel_compiles_for_the_gpu():
    """The merge's running-max loop compiled for an H200 (sm_90), no GPU needed: Triton's
    compiler checks loop-carried types its interpreter does not. A child process: not under
    the interpreter."""
    compile_in_child(COMPILE)
