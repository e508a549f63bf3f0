"""`--spec dflash|dflash2`: drafts from a DFlash or DFlash2 drafter (model-math.md §3.3), verified
as MTP's (§3.2).

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
target's head, over the tokenizer's ids (never the mask or padded rows), is draft i (DFlash2:
its candidate selector's walk from x_L over those logits, `DFlashModel.drafts`).

Prefix reuse (model-math.md §4: a checkpoint holds the drafter context): a position's
conditioning row c_t (`DFlashModel.condition`) is a function of the tokens up to t alone, so
it is kept with the target's K/V, in the KV pool's drafter rows (`kv.cache.KvStorage`): shared
with the pages by the prefix tree, copied with a tail, moved to and from the host tier. A row
is written once its position is committed (as it joins the context, or when the sequence ends,
before its answer joins the tree), and every sequence is observed (`keeps_rows`), drafting or
not, so no page the tree holds lacks its rows. A sequence that restored a prefix rebuilds its
context from those rows at its first observation (`DFlashModel.restore`). Without the rows
(prefix reuse off) a sequence first seen past 0 drafts from the context it has.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kv.cache import keeps_rows
from ..models.dflash import DFlashContext, DFlashMissing, DFlashModel, load_dflash

SPILL = 32  # pending positions past which a row's committed features join its context at once


@dataclass
class _Row:
    seq: object
    ctx: DFlashContext
    pending: torch.Tensor  # tap features of positions ctx.end .. ctx.end + len - 1


class DFlashDrafter:
    """Per-sequence drafter contexts and batched proposals for a step's decode rows."""

    def __init__(self, model: DFlashModel, vocab: int) -> None:
        self.model = model
        self.vocab = vocab  # drafts are ids below this (the tokenizer's), never the mask
        self.page_rows = model.config.hidden  # the width of a position's row in the KV pool
        self._rows: dict[int, _Row] = {}
        self._proposals: dict[int, list] = {}  # by sequence: its last drafts' (`proposal`)

    keeps_rows = staticmethod(keeps_rows)

    def context_bytes(self, positions: int) -> int:
        """The most device bytes one sequence's context of `positions` holds (`--kv-capacity
        auto` keeps them free): per layer K and V of its positions (a sliding layer's at most
        2·window, `DFlashContext._trim`), in buffers that double when full."""
        c, itemsize = self.model.config, self.model.dtype.itemsize
        per_position = 2 * c.kv_heads * c.head_dim * itemsize
        return sum(2 * per_position * (positions if w is None else min(positions, 2 * w))
                   for w in c.windows)

    def observe(self, seq, position: int, features: torch.Tensor) -> None:
        """The target computed positions `position ..` of `seq`, with tap `features`."""
        row = self._rows.get(id(seq))
        if row is None and position > 0 and keeps_rows(seq):  # a restored prefix's rows
            ctx = self.model.restore(seq.cache.read_rows(position))
            row = self._rows[id(seq)] = _Row(seq, ctx, features.clone())
        elif row is None or not row.ctx.end <= position <= row.ctx.end + len(row.pending):
            # a first sighting, or positions that do not continue the committed context
            # (a copy: the graph step hands over a view of its static buffer)
            row = self._rows[id(seq)] = _Row(seq, DFlashContext(self.model, position),
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
        """Move each row's pending features of positions < `upto` into its context (and their
        conditioning rows into its pages)."""
        work = [(row, end - row.ctx.end) for row, end in zip(rows, upto) if end > row.ctx.end]
        if not work:
            return
        conds = self._store(work)
        self.model.extend_rows([row.ctx for row, _ in work], conds)
        for row, n in work:  # (a copy: a view would keep the step's buffer alive)
            row.pending = row.pending[n:].clone()

    def _store(self, work: list[tuple[_Row, int]]) -> list[torch.Tensor]:
        """The conditioning rows of each row's first `n` pending positions (one projection for
        all), written into its pages where they keep them."""
        conds = self.model.condition(torch.cat([row.pending[:n] for row, n in work]))
        conds = list(conds.split([n for _, n in work]))
        for (row, _), cond in zip(work, conds):
            if keeps_rows(row.seq):
                row.seq.cache.write_rows(row.ctx.end, cond)
        return conds

    def forget(self, seq) -> None:
        """`seq` ended: its committed positions' rows still pending go into its pages first
        (its answer joins the prefix tree next: `SequenceMemory.checkpoint`)."""
        self._proposals.pop(id(seq), None)
        row = self._rows.pop(id(seq), None)
        if row is not None and keeps_rows(seq):
            n = min(seq.cached - row.ctx.end, len(row.pending))
            if n > 0:
                self._store([(row, n)])

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
        anchors = [seq.output[-1] for _, seq, _, _ in work]
        hidden = self.model.propose(anchors, [row.ctx for _, _, row, _ in work],
                                    [k for *_, k in work])
        # a sampled row's DFlash2 walk draws with the request's own uniforms (its seed
        # reproduces it) and keeps its proposal distribution for the rejection test
        draws = ([None if seq.sampler.params.greedy else
                  (seq.sampler.params.temperature, [seq.sampler.uniform() for _ in range(k)])
                  for _, seq, _, k in work] if self.model.selector is not None else None)
        drafts, proposals = self.model.drafts(hidden, anchors, self.vocab, draws)
        for (i, seq, _, _), row_drafts, proposal in zip(work, drafts, proposals):
            out[i] = row_drafts
            if proposal is not None:
                self._proposals[id(seq)] = proposal
        return out

    def proposal(self, seq) -> list | None:
        """The proposal distributions of `seq`'s last drafts (a sampled DFlash2 walk's: a
        (candidate ids, q) pair a draft), or None for point-mass drafts; taken once."""
        return self._proposals.pop(id(seq), None)


def dflash_drafter(artifact, model, vocab: int, matmul_dtype: torch.dtype | None = None,
                   backend: str = "dflash", k: int = 7) -> DFlashDrafter:
    """The drafter over the artifact's `backend` component, for up to `k` drafts a round; from
    now on `model`'s hiddens handed to drafters are the drafter's tap features
    (`Qwen35Model.feature_taps`)."""
    drafter = load_dflash(artifact, model, model.device, model.dtype, matmul_dtype, backend)
    block = drafter.config.block
    if k > block - 1:
        raise DFlashMissing(f"--draft-tokens {k} is more than the drafter's block of {block} "
                            f"holds (its anchor and at most {block - 1} masks)")
    model.feature_taps = drafter.config.taps
    return DFlashDrafter(drafter, min(vocab, model.vocab_size))
