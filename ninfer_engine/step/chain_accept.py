"""Verify rows accepted on the device (`verify_chain`): greedy rows by the host's rule
(`accept_on_device`), sampled rows by the host's rejection sampling
(`acceptance.accept_sampled`) on the same candidates with the same uniforms (`ChainSampling`).

A sampled row qualifies where its draws take the top-k path (1 ≤ top_k ≤ `TOPK_CAP`,
`sampling_paths`: the candidates are a fixed count, `candidate_count`, so a captured graph has
one shape; the Qwen presets' top_k is 20). When a round launches, the host draws its k + 1
uniforms from each sampled row's stream (`acceptance.round_uniforms`, as the host's acceptance
would after the step) and copies them and the rows' settings into static buffers. The chain
computes each position's candidates from the (penalized) logits as
`sampling_paths.top_k_candidates` does, tests each draft against its probability with the row's
uniforms, and draws the bonus from the first rejected position's distribution without its draft
(or from the last position's), all in fp64 as the host does on its copy. The host and the device
then emit the same tokens, up to the order of fp64 sums (a uniform within ~1e-16 of a boundary).
"""
from __future__ import annotations

import torch

from ..host_copy import to_device
from .acceptance import round_uniforms
from .sampling_paths import candidate_count, path_of, top_k_candidates

# a greedy row's settings in a sampled graph: any finite distribution (its draws are unused)
_GREEDY_SETTINGS = (1.0, 1, 1.0, 0.0)


def samples_on_device(params) -> bool:
    """A sampled row whose draws the chain can make: the top-k path's."""
    return not params.greedy and path_of(params) == "top_k"


class ChainSampling:
    """The static buffer a captured chain reads, `rows` [max_batch, 5 + k + 1] fp64: each
    row's settings (temperature, top_k, top_p, min_p), whether it samples (1) or not (0),
    then its round's k + 1 uniforms; loaded by one copy a round."""

    def __init__(self, max_batch: int, k: int, device: torch.device) -> None:
        self.k = k
        self.rows = torch.zeros(max_batch, 5 + k + 1, dtype=torch.float64, device=device)

    @staticmethod
    def candidates(seqs: list, vocab: int) -> int:
        """The candidate count of these rows' sampled ones (0: none samples)."""
        top = [s.sampler.params.top_k for s in seqs if not s.sampler.params.greedy]
        return candidate_count(max(top), vocab) if top else 0

    def load(self, seqs: list) -> None:
        """The rows' settings and a round's uniforms, drawn now from each sampled row's
        stream (one asynchronous copy)."""
        table = []
        for seq in seqs:
            p = seq.sampler.params
            table.append([*_GREEDY_SETTINGS, 0.0, *[0.0] * (self.k + 1)] if p.greedy else
                         [p.temperature, p.top_k, p.top_p, p.min_p, 1.0,
                          *round_uniforms(seq.sampler, self.k)])
        self.rows[: len(seqs)].copy_(to_device(torch.tensor(table, dtype=torch.float64),
                                               self.rows.device))

    def accept(self, logits: torch.Tensor, picks: torch.Tensor, drafts: torch.Tensor,
               forced: torch.Tensor, ends: torch.Tensor, n: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(accepted drafts j [B], the bonus [B]) of verify rows whose logits (penalties
        applied) are `logits` [B, q, V] fp32 and greedy choices `picks` [B, q]: greedy rows by
        agreement, sampled ones by the rejection test, over `n` candidates a position;
        `forced`, `ends` as `verify_chain.accept_on_device`'s."""
        batch, q, vocab = logits.shape
        rows = self.rows[:batch]
        # fp32 settings, as the host's `sampling_paths._columns` rounds its Python floats
        columns = rows[:, :4].float().repeat_interleave(q, 0).unsqueeze(-1).unbind(1)
        probs, ids = top_k_candidates(logits.view(batch * q, vocab), n, *columns)
        sampled, u = rows[:, 4] > 0, rows[:, 5:]
        probs, ids = probs.view(batch, q, n), ids.view(batch, q, n)
        k = drafts.shape[1]
        greedy = (drafts == picks[:, :k]).long().cumprod(1).sum(1)
        p, column, present = _draft_columns(probs, ids, drafts)
        taken = present & (u[:, :k] < p[:, :k].gather(2, column[..., None])[..., 0])
        agree = torch.where(sampled, taken.long().cumprod(1).sum(1), greedy)
        accepted = torch.where(forced >= 0, forced, agree)
        index = torch.arange(k, device=drafts.device)
        cut = torch.where(ends, index, k).amin(1)  # the first end token among the drafts
        ended = cut < accepted  # taken: it goes out as the bonus, the row stops there
        accepted = torch.minimum(accepted, cut)
        drawn = _residual_draw(p, ids, column, present, accepted, u[:, k])
        row = torch.arange(batch, device=drafts.device)
        last = torch.cat([drafts, drafts[:, :1]], 1)[row, accepted]  # d_j (j < k where ended)
        bonus = torch.where(sampled, torch.where(ended, last, drawn),
                            picks.gather(1, accepted[:, None])[:, 0])
        return accepted, bonus


def accept_on_device(drafts: torch.Tensor, picks: torch.Tensor, forced: torch.Tensor,
                     ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance of verify rows on the device: `drafts` [B, k], the target's `picks`
    after each of the row's tokens [B, k + 1], `forced` [B] (a benchmark's count of drafts
    taken, -1: by agreement), `ends` [B, k] (the draft is an end token of a row that stops at
    one). (accepted drafts j [B], the bonus picks[j] [B]): j is the longest agreeing prefix (or
    the forced count), cut before the first end token, which then goes out as the bonus."""
    k = drafts.shape[1]
    agree = (drafts == picks[:, :k]).long().cumprod(1).sum(1)
    accepted = torch.where(forced >= 0, forced, agree)
    index = torch.arange(k, device=drafts.device)
    accepted = torch.minimum(accepted, torch.where(ends, index, k).amin(1))
    return accepted, picks.gather(1, accepted[:, None])[:, 0]


def _draft_columns(probs: torch.Tensor, ids: torch.Tensor, drafts: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(each position's distribution [B, q, n] fp64, normalised as the host normalises its
    copy; the column of draft i among position i's candidates [B, k]; whether it is one)."""
    p = probs.double()
    p = p / p.sum(-1, keepdim=True)
    k = drafts.shape[1]
    hit = ids[:, :k] == drafts[:, :, None]
    return p, hit.long().argmax(-1), hit.any(-1)


def _residual_draw(p: torch.Tensor, ids: torch.Tensor, column: torch.Tensor,
                   present: torch.Tensor, at: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token drawn at position `at` [B] with uniform `u` [B]: from p_at without its draft
    where a draft was rejected there (at < k), from p_k after every draft was taken; the first
    candidate whose cumulative mass exceeds u · total (`acceptance._inverse_cdf`)."""
    batch, _, n = p.shape
    k = column.shape[1]
    row = torch.arange(batch, device=p.device)
    dist = p[row, at]  # [B, n]
    rejected = at < k
    col = column.gather(1, at.clamp(max=k - 1)[:, None])[:, 0]
    zero = rejected & present.gather(1, at.clamp(max=k - 1)[:, None])[:, 0]
    dist = dist.scatter(1, col[:, None], torch.where(zero[:, None], 0.0, dist.gather(
        1, col[:, None])))
    cdf = dist.cumsum(-1)
    pick = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).clamp_(max=n - 1)
    return ids[row, at].gather(1, pick)[:, 0]
