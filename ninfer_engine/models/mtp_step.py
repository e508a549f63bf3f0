"""`MtpStep`: a whole MTP draft round for up to B rows over static buffers, capturable in one
CUDA graph (`step.mtp_round` replays it), on the decode step's kernels.

A round is what `MtpDrafter.propose_rows` does eagerly (model-math.md §3.2): first the rows'
committed pairs (h_j, x_{j+1}), `q` token rows a row (row b's pair t is token row b·q + t,
padded past its `n_b` real pairs), through the head into the MTP layer's pages; the output of
each row's last real pair gives draft 1 (argmax of the target's head over the tokenizer's ids);
then each draft with the MTP output before it, at positions L, L+1, ..., gives the next. The
head's layer runs as one layer of `HybridStep` (`blocks`): its attention reads and writes the
KV pool's MTP layer in place (`mtp_drafter`: pair j's K/V in position j's slot), so nothing of
a row's context is copied into the round. A padding pair writes K/V at a position ≥ L, which
a draft step or a later committed pair writes again before anything reads it; the engine leases
a row's pages through L + k before the round. Rotary positions are the target's (model-math.md
§3.1: the pair of h_t at p_t): position + a row's shift (a media prompt's p_t - t, the same on
the three MRoPE axes past its media: `step.mtp_round` drafts eagerly where a media placeholder
is among a row's pairs).
"""
from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ..kernels.paged_attention import PAGE
from ..kernels.rmsnorm import rms_norm_triton
from .qwen3_5_step import HybridStep
from .qwen3_5_step_weights import FusedLinear, KvLayer, layer_weights


class MtpStep(HybridStep):
    """Draft rounds of up to `max_batch` rows of `q` committed pairs and `k` drafts each, for
    `head` (`models.mtp.MtpHead`) over the target's head matrix `head_matrix` (the decode
    step's `HybridWeights.head`); `kv()` returns the pool's MTP layer (`KvLayer`); drafts are
    argmaxes over the first `vocab` ids, or `draft_head.argmax` (`--lm-head-draft`'s
    shortlist, `step.draft_head`: it reads rows / vocabulary of the head's bytes)."""

    def __init__(self, head, head_matrix: FusedLinear, max_batch: int, max_pages: int,
                 kv: Callable[[], KvLayer], q: int, k: int, vocab: int,
                 draft_head=None) -> None:
        target = head.target
        layer = layer_weights("full_attention", head.block, head.params, "mtp/layers/0/")
        weights = SimpleNamespace(c=target.config, model=target, eps=head.eps,
                                  head=head_matrix, layers=[layer])
        super().__init__(weights, max_batch, max_pages, lambda: [kv()], max_q=q, trail=False)
        self.mtp, self.q, self.k, self.vocab = head, q, k, vocab
        self.draft_head = draft_head
        self.fc = FusedLinear(head.fc.weight)
        dev, H = target.embedding.device, target.config["hidden_size"]
        # per token row: the target's hidden h_j of its pair (`tokens` holds x_{j+1})
        self.hidden_in = torch.zeros(max_batch * q, H, dtype=target.embedding.dtype,
                                     device=dev)
        # per row: its last real pair's token row, its first draft position L, its drafts'
        # rotary shift (a media prompt's rope delta)
        self.ends = torch.zeros(3, max_batch, dtype=torch.long, device=dev)
        self.drafts = torch.zeros(max_batch, k, dtype=torch.long, device=dev)
        self.outputs = torch.zeros(k, max_batch, H, dtype=target.embedding.dtype, device=dev)

    def load(self, rows: list[tuple[list[int], torch.Tensor, int]],
             shifts: list[tuple[list[int], int]] | None = None) -> None:
        """Each row's committed pairs: (their tokens x_{j+1}, their hiddens h_j [n, H], the
        position of the first), at most `q` each (the caller fills `table`); `shifts`: each
        row's rotary shifts of its `q` pair rows and of its drafts (None: none). One host
        copy, and a device copy a row."""
        q, B = self.q, len(rows)
        shifts = shifts or [([0] * q, 0)] * B
        tokens, positions, lasts, bases = [0] * (B * q), [], [], []
        for b, (ids, hidden, first) in enumerate(rows):
            n, at = len(ids), b * q
            assert 0 < n <= q
            tokens[at: at + n] = ids
            positions += range(first, first + q)  # padding pairs continue
            lasts.append(at + n - 1)
            bases.append(first + n)
            self.hidden_in[at: at + n].copy_(hidden, non_blocking=True)
        pair_shifts = [t for row, _ in shifts for t in row]
        # (lists, one tensor each: a tensor a row's part was ~4 host calls a row a round)
        self.meta[:2, : B * q].copy_(torch.tensor([tokens, positions]), non_blocking=True)
        self.shift[: B * q].copy_(torch.tensor(pair_shifts), non_blocking=True)
        self.ends[:, :B].copy_(torch.tensor([lasts, bases, [d for _, d in shifts]]),
                               non_blocking=True)

    def load_from_verify(self, verify: HybridStep, accepted: torch.Tensor, bonus: torch.Tensor,
                         batch: int) -> None:
        """`load` on the device, from rows 0..batch-1 of `verify`'s last step (rows of `q`
        tokens at positions L..L+q-1, hiddens kept) that accepted `accepted` [batch] drafts,
        then picked `bonus` [batch]: row b's pair t is (h_{L+t}, x_{L+t+1}), the verify row's
        input shifted by one with the bonus at t = j_b, its real pairs t ≤ j_b (the rest
        padding); the same page tables."""
        q, n = self.q, batch * self.q
        pairs = torch.cat([verify.tokens[:n].view(batch, q)[:, 1:], bonus[:, None]], 1)
        pairs.scatter_(1, accepted[:, None], bonus[:, None])
        self.tokens[:n].copy_(pairs.view(n))
        self.pos[:n].copy_(verify.pos[:n])
        self.shift[:n].copy_(verify.shift[:n])  # a verify row's: its rope delta throughout
        self.hidden_in[:n].copy_(verify.hidden[:n])
        self.table[:batch].copy_(verify.table[:batch])
        first = self.rows[:batch] * q
        torch.add(first, accepted, out=self.ends[0, :batch])
        torch.add(verify.pos[first], accepted + 1, out=self.ends[1, :batch])
        self.ends[2, :batch].copy_(verify.shift[first])

    def round(self, batch: int, kv_span: int) -> torch.Tensor:
        """The loaded rows' `k` drafts each, [batch, k] on the device; `kv_span` ≥ every
        position the round reaches + 1 (the attention kernel's split grid)."""
        q, last, base = self.q, self.ends[0, :batch], self.ends[1, :batch]
        out = self.outputs[:, :batch]  # each draft's MTP output ĥ (kept: a test reads them)
        out[0] = self._pass(batch * q, batch, q, kv_span, keep=last)
        self.shift[:batch].copy_(self.ends[2, :batch])  # the draft steps' rows: one a row
        for s in range(self.k):
            self.drafts[:batch, s] = draft = self._argmax(out[s])
            if s + 1 == self.k:
                break
            # the pair (previous MTP output, previous draft) at position L + s
            self.tokens[:batch] = draft
            self.hidden_in[:batch] = out[s]
            torch.add(base, s, out=self.pos[:batch])
            out[s + 1] = self._pass(batch, batch, 1, kv_span)
        return self.drafts[:batch]

    def _pass(self, n: int, batch: int, q_len: int, kv_span: int,
              keep: torch.Tensor | None = None) -> torch.Tensor:
        """Token rows 0..n-1 (`batch` rows of `q_len` pairs) through the head: ĥ [n, H], or
        only rows `keep`'s past the attention (every pair's K/V is written; only each row's
        last real pair's output drafts, so the MoE reads that row's experts alone)."""
        m, eps = self.mtp, self.eps
        pos = self.pos[:n]
        seq = self.rows[:n] // q_len if q_len > 1 else self.rows[:n]
        table = self.table[seq] if q_len > 1 else self.table[:batch]
        slot = self.table[seq, pos // PAGE] * PAGE + pos % PAGE
        e, _ = rms_norm_triton(F.embedding(self.tokens[:n], self.w.model.embedding),
                               m.embedding_norm, eps, None, True)
        h, _ = rms_norm_triton(self.hidden_in[:n], m.hidden_norm, eps, None, True)
        u = self.fc(torch.cat([e, h], -1))
        return self.blocks(u, n, batch, q_len, table, kv_span, slot, m.final_norm, keep)

    def _argmax(self, h: torch.Tensor) -> torch.Tensor:
        if self.draft_head is not None:
            return self.draft_head.argmax(h)
        logits = self.w.model.ranks.gather_vocab(self.w.head(h), self.c["vocab_size"])
        return logits[:, : self.vocab].argmax(-1)
