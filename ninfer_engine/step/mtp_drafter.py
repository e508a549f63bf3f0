"""`--spec mtp`: drafts from the model's MTP head on the reference schedule (model-math.md §3.2).

The runner hands over the target's final-normed hidden of every position it computes
(`observe`). A sequence's MTP-layer KV holds the pairs (h_j, x_{j+1}) at positions
`start <= j < done`; hiddens of positions `done..` wait in `pending` until their next token is
known. A prompt's pairs run as its chunks are computed. When a row drafts at L = `seq.cached`
(its last token x_L not computed yet), the pairs `done..L-1` run through the head first: the
prompt's last, and after a verify row the hiddens of the columns it kept, so the MTP KV only
ever holds committed outputs with the target's own hiddens (never a draft's). The last of them
drafts d₁; d₂..d_k feed the previous draft with the previous MTP output at L, L+1, ...,
extending the KV, which is cut back to L right after, so the next round starts from committed
pairs alone. Rejected columns' hiddens are overwritten when their positions are computed again
(a row that verified, then decodes without drafting, holds them until then). Drafts are the
head's argmax over the tokenizer's ids (the head's padded rows are never proposed).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from ..models.mtp import MtpHead, MtpKv


@dataclass
class _MtpRow:
    cache: MtpKv  # the MTP layer's keys and values of positions start .. done-1
    start: int
    pending: torch.Tensor  # target hiddens of positions done .. done + len - 1

    @property
    def done(self) -> int:
        return self.start + self.cache.length


class MtpDrafter:
    """Per-sequence MTP state and batched drafting for a step's decode rows."""

    def __init__(self, head: MtpHead, vocab: int, draft_head=None) -> None:
        self.head, self.vocab = head, vocab
        self.draft_head = draft_head  # `--lm-head-draft`'s shortlist (draft_head.py), or None
        self._rows: dict[int, _MtpRow] = {}

    def observe(self, seq, position: int, hidden: torch.Tensor) -> None:
        """The target computed positions `position ..` of `seq`, with final-normed `hidden`."""
        row = self._rows.get(id(seq))
        if row is None or not row.done <= position <= row.done + len(row.pending):
            # a first sighting, or positions that do not continue the committed pairs
            row = self._rows[id(seq)] = _MtpRow(self.head.new_cache(), position, hidden)
        else:  # what is held from `position` on came from rejected drafts' columns
            row.pending = torch.cat([row.pending[: position - row.done], hidden])
        # a prompt chunk's pairs whose next token is the prompt's run now, a chunk at a time
        # (as the target's prefill), not all at the first draft
        ready = min(row.done + len(row.pending), len(seq.prompt) - 1) - row.done
        if ready > 0:
            self._run_pairs([(seq, row, ready)])

    def forget(self, seq) -> None:
        self._rows.pop(id(seq), None)

    def propose_rows(self, seqs: list, ks: list[int]) -> list[list[int]]:
        """Up to `ks[i]` drafts for decode row `seqs[i]` (0: none); [] where its hiddens up to
        its last computed position are not all held."""
        out: list[list[int]] = [[] for _ in seqs]
        work = []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            row, last = self._rows.get(id(seq)), seq.cached
            if k > 0 and row is not None and row.done < last <= row.done + len(row.pending):
                work.append((i, seq, row, last))
        if not work:
            return out
        h = self._run_pairs([(seq, row, last - row.done) for _, seq, row, last in work])
        active = list(range(len(work)))  # the rows of `work` still drafting
        for step in itertools.count():
            tokens = self._argmax(h)
            for n, token in zip(active, tokens.tolist()):
                out[work[n][0]].append(token)
            going = [j for j, n in enumerate(active) if ks[work[n][0]] > step + 1]
            if not going:
                break
            active = [active[j] for j in going]
            picked = torch.tensor(going, device=h.device)
            # the pair (previous MTP output, previous draft) at position L + step
            positions = torch.tensor([work[n][3] + step for n in active], device=h.device)
            h = self.head(tokens[picked], h[picked], [work[n][2].cache for n in active],
                          [1] * len(active), positions)
        for _, seq, row, _ in work:  # back to the committed pairs
            row.cache.truncate(seq.cached - row.start)
        return out

    def _run_pairs(self, work: list) -> torch.Tensor:
        """Runs the next `n` pending pairs (h_j, x_{j+1}) of each (seq, row, n) of `work`
        through the head, into its KV; the MTP output of each row's last pair, [rows, H]."""
        tokens, hidden, positions, lengths = [], [], [], []
        for seq, row, n in work:
            tokens += _tokens(seq, row.done + 1, row.done + n + 1)
            hidden.append(row.pending[:n])
            positions += range(row.done, row.done + n)
            lengths.append(n)
        device = hidden[0].device
        h = self.head(torch.tensor(tokens, device=device), torch.cat(hidden),
                      [row.cache for _, row, _ in work], lengths,
                      torch.tensor(positions, device=device))
        for _, row, n in work:  # (a copy: a view would keep the step's hiddens alive)
            row.pending = row.pending[n:].clone()
        ends = torch.tensor(list(itertools.accumulate(lengths)), device=device) - 1
        return h[ends]

    def _argmax(self, h: torch.Tensor) -> torch.Tensor:
        if self.draft_head is not None:
            return self.draft_head.argmax(h)
        return self.head.logits(h)[:, : self.vocab].argmax(-1)


def _tokens(seq, begin: int, end: int) -> list[int]:
    """The tokens at positions begin .. end-1 of `seq`'s prompt followed by its output."""
    p = len(seq.prompt)
    return [*seq.prompt[begin:end], *seq.output[max(begin - p, 0): max(end - p, 0)]]
