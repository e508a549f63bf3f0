"""The penalties kernel against its torch reference: the same logits bit for bit (both compute
frequency·c + presence unfused in fp32 and round the difference once to the logits' dtype),
for fp32 and bf16 logits, with and without the lookahead's pending picks, for rows whose counted
tokens span several of the kernel's blocks, a penalized row with nothing counted yet, and rows
given out of order."""
import pytest
import torch

from ninfer_engine.kernels._dispatch import interpreting
from ninfer_engine.kernels.penalties import BLOCK, penalize_ref, penalize_triton

VOCAB = 1000


def _case(seed: int):
    g = torch.Generator().manual_seed(seed)
    batch = 5
    logits = torch.randn(batch, VOCAB, generator=g) * 4
    rows = [3, 0, 4, 1]  # logits rows, out of order; row 2 has no penalties
    sizes = [2 * BLOCK + 17, 5, 0, 40]  # several blocks; a row with nothing counted yet
    ids = [torch.randperm(VOCAB, generator=g)[:n] for n in sizes]  # distinct within a row
    times = [torch.randint(1, 9, (n,), generator=g).float() for n in sizes]
    presence = torch.tensor([1.5, 0.0, 0.4, -0.7])
    frequency = torch.tensor([0.0, 0.5, 0.3, 1.25])
    offsets = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    # pending picks: row 3 counted before, row 0 new, row 4 (nothing counted) new, row 1 counted
    pending = torch.randint(0, VOCAB, (batch,), generator=g)
    pending[3], pending[1] = ids[0][BLOCK + 3], ids[3][7]
    pending[0] = next(t for t in range(VOCAB) if t not in set(ids[1].tolist()))
    return (logits, offsets, torch.tensor(rows), presence, frequency, torch.cat(ids),
            torch.cat(times), pending)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_pending", [False, True])
def test_the_kernel_gives_the_references_logits(device, dtype, with_pending):
    logits, *args, pending = _case(11)
    logits = logits.to(dtype)
    want = penalize_ref(logits.clone(), *args, pending if with_pending else None)
    got = penalize_triton(logits.clone().to(device), *(a.to(device) for a in args),
                          pending.to(device) if with_pending else None).cpu()
    if dtype == torch.bfloat16 and interpreting():
        # the interpreter truncates fp32 -> bf16 casts where GPUs round to nearest: each logit
        # is the fp32 difference (the same on both paths) rounded one way or the other
        exact = penalize_ref(logits.float(), *args, pending if with_pending else None)
        truncated = (exact.view(torch.int32) & -65536).view(torch.float32).to(dtype)
        assert torch.equal(want, exact.to(dtype))
        assert bool(((got == want) | (got == truncated)).all())
    else:
        assert torch.equal(got, want)
    changed = (want != logits).any(-1).tolist()
    # every penalized row moved (row 4 only through its pending pick); row 2 is untouched
    assert changed == [True, True, False, True, with_pending]


def test_a_pending_pick_counts_once_more_or_once(device):
    logits, offsets, rows, presence, frequency, ids, times, pending = _case(12)
    got = penalize_triton(logits.clone().to(device), offsets.to(device), rows.to(device),
                          presence.to(device), frequency.to(device), ids.to(device),
                          times.to(device), pending.to(device)).cpu()
    # row 3 (position 0): its pick was counted `times` times, now once more
    counted = ids[BLOCK + 3]
    expected = logits[3, counted] - (frequency[0] * (times[BLOCK + 3] + 1) + presence[0])
    assert got[3, counted] == expected
    # row 0 (position 1): a pick not counted before, counted once
    assert got[0, pending[0]] == logits[0, pending[0]] - (frequency[1] * 1.0 + presence[1])
