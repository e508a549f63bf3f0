"""`mask.allowed`: int32 bit words -> a bool mask, token t being bit t % 32 of word t // 32."""
import torch

from ninfer_engine.constrained.mask import allowed


def reference(bits: torch.Tensor, columns: int) -> torch.Tensor:
    shifts = torch.arange(32, dtype=torch.int64)
    out = ((bits.long().unsqueeze(-1) >> shifts) & 1).bool().view(bits.shape[0], -1)
    pad = torch.zeros((bits.shape[0], max(columns - out.shape[1], 0)), dtype=torch.bool)
    return torch.cat([out, pad], dim=1)[:, :columns]


def test_unpacked_bits_match_the_word_layout(device):
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (3, 7), generator=gen, dtype=torch.int64).int()
    bits[0, 0] = 1 << 5  # token 5 alone in the first word
    for columns in (7 * 32, 7 * 32 - 9, 7 * 32 + 40):  # exact, cut, padded logits
        got = allowed(bits, columns, device).cpu()
        assert torch.equal(got, reference(bits, columns))
    assert allowed(bits, 224, device)[0, :32].nonzero().flatten().tolist() == [5]
