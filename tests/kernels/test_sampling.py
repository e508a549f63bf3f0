import torch

from ninfer_engine.kernels.sampling import argmax_triton, topk_triton


def test_chunked_topk_and_argmax_match_torch(device):
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 300, generator=g).bfloat16()
    logits[1, 17] = logits[1, 250] = 9.0  # a tie resolves to the lower id
    vals, ids = topk_triton(logits.to(device), 5, chunk=64)
    ref_vals, ref_ids = torch.topk(logits.float(), 5, -1)
    assert torch.equal(vals.cpu(), ref_vals)
    assert torch.equal(argmax_triton(logits.to(device), chunk=64).cpu(), logits.argmax(-1))
    assert ids[1, :2].tolist() == [17, 250]
    assert torch.equal(ids.cpu()[[0, 2]], ref_ids[[0, 2]])
