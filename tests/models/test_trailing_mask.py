"""`layers.trailing_causal_mask`: the attention of queries that end a row (a chunk after
cached positions, an MTP or verify block) equals the boolean bottom-right causal mask's, with
GQA, in the dtype and head size the models use (on CUDA it runs flash attention through
torch's lower-right `CausalBias` instead of a materialised mask)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ninfer_engine.models.layers import trailing_causal_mask
from tests.kernels.conftest import attention_tol, rel_err


@pytest.mark.parametrize("queries, keys", [(4, 4), (4, 37), (1, 9), (130, 700)])
def test_the_trailing_mask_attends_as_the_boolean_mask(queries, keys, device):
    gen = torch.Generator().manual_seed(queries * keys)
    nq, nkv, d = 16, 2, 256  # Qwen3.5's gated attention
    low = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(1, n, length, d, generator=gen).to(low)
               for n, length in ((nq, queries), (nkv, keys), (nkv, keys)))
    allowed = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=allowed,
                                          enable_gqa=True)
    got = F.scaled_dot_product_attention(
        *(t.to(device) for t in (q, k, v)),
        attn_mask=trailing_causal_mask(queries, keys, device), enable_gqa=True)
    assert rel_err(got, want) <= attention_tol(q, k, keys)
