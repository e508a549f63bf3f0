"""Presence and frequency penalties of greedy rows accepted on the device (`verify_chain`).

The host's acceptance penalizes position i of a verify row with the request's generated
tokens and drafts 1..i counted (`acceptance._position_views`), then takes the argmax. On the
device the counts live in a table of one row of the vocabulary per batch row: the host writes
it when a round starts from its samplers' counts (`load`), and the chain adds each round's
emitted tokens (`count`, into a second table that `advance` makes current) so that a round
launched ahead, before the host has read and recorded the one before, sees them too (every op
of a chain must give the same result run twice: a capture runs it once before it replays).
`picks` gives the host's choices bit for bit: the same `frequency·c + presence` in fp32,
subtracted from the same fp32 logits, the same argmax kernel; `logits_of` gives those logits,
from which a sampled row draws (`chain_accept`).
"""
from __future__ import annotations

import torch

from ..host_copy import to_device
from ..kernels.sampling import argmax


class ChainPenalties:
    """Static buffers a captured chain reads: `logits` [max_batch · q, V] (the verify step's,
    copied in: each verify graph has its own output), `counts` [max_batch, V] fp32, each row's
    `presence` and `frequency`."""

    def __init__(self, max_batch: int, q: int, vocab: int, device: torch.device) -> None:
        self.q = q
        self.logits = torch.zeros(max_batch * q, vocab, dtype=torch.float32, device=device)
        self.counts = torch.zeros(max_batch, vocab, dtype=torch.float32, device=device)
        self.after = torch.zeros_like(self.counts)  # with the round's tokens (`count`)
        self.presence = torch.zeros(max_batch, dtype=torch.float32, device=device)
        self.frequency = torch.zeros(max_batch, dtype=torch.float32, device=device)
        k = q - 1  # position i (1..k) counts drafts m = 1..i once more: the pairs (i, m)
        pairs = [(i, m) for i in range(1, q) for m in range(1, i + 1)]
        self._at = torch.tensor(pairs or [(0, 0)], dtype=torch.long, device=device).T
        self._k = k

    def load(self, seqs: list) -> None:
        """Each row's counted tokens and settings from its sampler (a round the host starts:
        every token before its first is recorded)."""
        batch = len(seqs)
        parts = [seq.sampler.counted() if seq.sampler.params.penalized else
                 (torch.zeros(0, dtype=torch.long), torch.zeros(0)) for seq in seqs]
        rows = torch.repeat_interleave(torch.arange(batch), torch.tensor([len(p[0])
                                                                          for p in parts]))
        # (page-locked and asynchronous: a blocking copy would wait for the verify step)
        ints = to_device(torch.cat([rows, *(p[0] for p in parts)]), self.counts.device)
        floats = to_device(torch.cat([
            torch.tensor([s.sampler.params.presence_penalty for s in seqs]),
            torch.tensor([s.sampler.params.frequency_penalty for s in seqs]),
            *(p[1] for p in parts)]).float(), self.counts.device)
        n = len(rows)
        self.counts[:batch].zero_()
        self.counts[:batch].index_put_((ints[:n], ints[n:]), floats[2 * batch:])
        self.presence[:batch].copy_(floats[:batch])
        self.frequency[:batch].copy_(floats[batch: 2 * batch])

    def take(self, logits: torch.Tensor) -> None:
        """The verify step's logits [batch, q, V] (or [batch · q, V]) into the static copy."""
        self.logits[: logits.numel() // logits.shape[-1]].copy_(logits.view(-1, logits.shape[-1]))

    def picks(self, drafts: torch.Tensor) -> torch.Tensor:
        """The host's greedy choice at each position of the verify rows of `drafts` [B, k]
        under their penalties: [B, q]."""
        batch, q = drafts.shape[0], self.q
        return argmax(self.logits_of(drafts, True).view(batch * q, -1)).view(batch, q)

    def logits_of(self, drafts: torch.Tensor, penalized: bool) -> torch.Tensor:
        """The verify rows' logits [B, q, V] fp32 as the host's acceptance sees them: less
        each position's penalties (`penalized`), else as taken."""
        batch, q = drafts.shape[0], self.q
        logits = self.logits[: batch * q].view(batch, q, -1)
        if not penalized:
            return logits
        return penalized_logits(logits, drafts, self.counts[:batch], self.presence[:batch],
                                self.frequency[:batch], self._at)

    def count(self, drafts: torch.Tensor, accepted: torch.Tensor, bonus: torch.Tensor) -> None:
        """The counts after a round's emitted tokens (its first `accepted` drafts and the
        bonus), for the round after it (`advance`)."""
        batch = drafts.shape[0]
        taken = (torch.arange(self._k, device=drafts.device) < accepted[:, None]).float()
        after = self.after[:batch]
        after.copy_(self.counts[:batch])
        after.scatter_add_(1, drafts, taken)
        after.scatter_add_(1, bonus[:, None], torch.ones_like(taken[:, :1]))

    def advance(self, batch: int) -> None:
        """A round launched ahead: the counts after the round before it are current."""
        self.counts[:batch].copy_(self.after[:batch])


def penalized_logits(logits: torch.Tensor, drafts: torch.Tensor, counts: torch.Tensor,
                     presence: torch.Tensor, frequency: torch.Tensor,
                     at: torch.Tensor) -> torch.Tensor:
    """`logits` [B, q, V] fp32, `drafts` [B, q - 1], each row's `counts` [B, V] and settings
    [B]; `at` [2, P]: the pairs (position i, draft m ≤ i). Each position's logits less the
    penalties of its counts, plus drafts 1..i at position i: [B, q, V]."""
    batch, q, vocab = logits.shape
    front = frequency[:, None] * counts + presence[:, None]  # the host's `penalty`, unfused
    out = logits - torch.where(counts > 0, front, 0.0)[:, None, :]
    if q > 1:
        i, m = at[0], at[1] - 1
        token = drafts[:, m]  # [B, P]
        same = (drafts[:, :, None] == drafts[:, None, :]).float().cumsum(2)  # d_m among d_1..
        times = counts.gather(1, token) + same[:, m, i - 1]
        row = torch.arange(batch, device=logits.device)[:, None]
        value = logits[row, i, token] - (frequency[:, None] * times + presence[:, None])
        out[row, i, token] = value  # a token drafted twice: the same value both times
    return out
