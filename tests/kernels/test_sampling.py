import torch

from ninfer_engine.kernels.sampling import argmax_triton, sample_top_k_top_p, topk_triton


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


def test_top_p_sampling_stays_in_the_nucleus():
    g = torch.Generator().manual_seed(7)
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0, 2.9]]).repeat(4000, 1)
    ids = sample_top_k_top_p(logits, 4, 0.9, 1.0, generator=g)
    probs = torch.softmax(logits[0], -1)
    assert set(ids.tolist()) <= {0, 1, 4}  # top-p 0.9 keeps ids 0, 1, 4
    kept = probs[[0, 1, 4]] / probs[[0, 1, 4]].sum()
    freq = torch.bincount(ids, minlength=5)[[0, 1, 4]].float() / 4000
    # a binomial frequency over 4000 draws has σ ≤ √(0.25 / 4000) = 0.0079: 0.03 is 3.8σ
    assert (freq - kept).abs().max() < 0.03
