"""`--spec dflash`: drafts from a DFlash drafter (model-math.md §3.3), verified as MTP's (§3.2).

The runner hands over the target's tap features (the residual outputs of the drafter's
`target_layer_ids`, concatenated: `Qwen35Model.feature_taps`) of every position it computes
(`observe`). A sequence's context holds the projected features of positions `start .. end-1`;
features of positions `end ..` wait in `pending` until they are known to be committed: a
prompt's as its chunks are computed, an output position's once a later step computes the
positions after it. When a row drafts at L = `seq.cached` (its last token x_L not computed
yet), the pending features of `end .. L-1` join first: after a verify row, only its kept
columns', so the context only ever holds committed target features (z-lab's
`dflash_generate` crops its draft cache to the committed length the same way). Features of
rejected columns stay pending and are overwritten when their positions are computed again.
The proposal is one forward over [x_L, MASK×k] at L..L+k; mask row i's argmax through the
target's head, over the tokenizer's ids (never the mask or padded rows), is draft i.

Prefix reuse: a restored prefix brings no target features, so the drafter could not rebuild
its context; `rank_parts` turns prefix reuse off under `--spec dflash` (every prompt is
computed, and observed, from position 0). A sequence first seen past 0 still drafts, from the
context it has.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.dflash import DFlashContext, DFlashMissing, DFlashModel, load_dflash

SPILL = 32  # pending positions past which a row's committed features join its context at once


@dataclass
class _Row:
    ctx: DFlashContext
    pending: torch.Tensor  # tap features of positions ctx.end .. ctx.end + len - 1


class DFlashDrafter:
    """Per-sequence drafter contexts and batched proposals for a step's decode rows."""

    def __init__(self, model: DFlashModel, vocab: int) -> None:
        self.model = model
        self.vocab = vocab  # drafts are ids below this (the tokenizer's), never the mask
        self._rows: dict[int, _Row] = {}

    def observe(self, seq, position: int, features: torch.Tensor) -> None:
        """The target computed positions `position ..` of `seq`, with tap `features`."""
        row = self._rows.get(id(seq))
        if row is None or not row.ctx.end <= position <= row.ctx.end + len(row.pending):
            # a first sighting, or positions that do not continue the committed context
            # (a copy: the graph step hands over a view of its static buffer)
            row = self._rows[id(seq)] = _Row(DFlashContext(self.model, position),
                                             features.clone())
        else:  # what is held from `position` on came from rejected drafts' columns
            row.pending = torch.cat([row.pending[: position - row.ctx.end], features])
        # a prompt's features are committed: they join now, a chunk at a time (as the target's
        # prefill), not all at the first draft; so is every position before this step's, which
        # join at the next proposal (all rows' in one batch), or now once SPILL are pending (a
        # row that does not draft holds a few steps' features, not its whole output's)
        prompt = min(row.ctx.end + len(row.pending), len(seq.prompt))
        self._absorb([row], [position if position - row.ctx.end > SPILL else prompt])

    def _absorb(self, rows: list[_Row], upto: list[int]) -> None:
        """Move each row's pending features of positions < `upto` into its context."""
        work = [(row, end - row.ctx.end) for row, end in zip(rows, upto) if end > row.ctx.end]
        if not work:
            return
        self.model.extend_rows([row.ctx for row, _ in work],
                               [row.pending[:n] for row, n in work])
        for row, n in work:  # (a copy: a view would keep the step's buffer alive)
            row.pending = row.pending[n:].clone()

    def forget(self, seq) -> None:
        self._rows.pop(id(seq), None)

    def propose_rows(self, seqs: list, ks: list[int]) -> list[list[int]]:
        """Up to `ks[i]` drafts for decode row `seqs[i]` (0: none); [] where the features of
        its positions up to L - 1 are not all held."""
        out: list[list[int]] = [[] for _ in seqs]
        work = []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            row, last = self._rows.get(id(seq)), seq.cached
            if k > 0 and row is not None and row.ctx.end <= last <= row.ctx.end + len(
                    row.pending):
                work.append((i, seq, row, k))
        if not work:
            return out
        self._absorb([row for _, _, row, _ in work], [seq.cached for _, seq, _, _ in work])
        hidden = self.model.propose([seq.output[-1] for _, seq, _, _ in work],
                                    [row.ctx for _, _, row, _ in work], [k for *_, k in work])
        logits = self.model.logits(torch.cat(hidden))[:, : self.vocab]
        mask = self.model.config.mask_token
        if mask < self.vocab:  # (a tiny test vocabulary: the mask id is a tokenizer id)
            logits[:, mask] = float("-inf")
        drafts = logits.argmax(-1).tolist()
        start = 0
        for i, _, _, k in work:
            out[i] = drafts[start: start + k]
            start += k
        return out


def dflash_drafter(artifact, model, vocab: int, matmul_dtype: torch.dtype | None = None,
                   backend: str = "dflash", k: int = 7) -> DFlashDrafter:
    """The drafter over the artifact's `dflash` component, for up to `k` drafts a round; from
    now on `model`'s hiddens handed to drafters are the drafter's tap features
    (`Qwen35Model.feature_taps`)."""
    drafter = load_dflash(artifact, model, model.device, model.dtype, matmul_dtype, backend)
    block = drafter.config.block
    if k > block - 1:
        raise DFlashMissing(f"--draft-tokens {k} is more than the drafter's block of {block} "
                            f"holds (its anchor and at most {block - 1} masks)")
    model.feature_taps = drafter.config.taps
    return DFlashDrafter(drafter, min(vocab, model.vocab_size))
