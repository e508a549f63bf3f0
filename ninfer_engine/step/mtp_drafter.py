"""`--spec mtp`: drafts from the model's MTP head on the reference schedule (model-math.md §3.2).

The runner hands over the target's final-normed hidden of every position it computes
(`observe`). A sequence's MTP-layer KV holds the pairs (h_j, x_{j+1}) at positions j < `done`;
hiddens of positions `done..` wait in `pending` until their next token is known. A prompt's
pairs run as its chunks are computed. When a row drafts at L = `seq.cached` (its last token x_L
not computed yet), the pairs `done..L-1` run through the head first: the prompt's last, and
after a verify row the hiddens of the columns it kept, so the committed pairs are only ever
committed outputs with the target's own hiddens (never a draft's). The last of them drafts d₁;
d₂..d_k feed the previous draft with the previous MTP output at L, L+1, .... Rejected columns'
hiddens are overwritten when their positions are computed again (a row that verified, then
decodes without drafting, holds them until then). Drafts are the head's argmax over the
tokenizer's ids (the head's padded rows are never proposed).

The MTP layer's K/V live in the KV pool, as one more attention layer after the target's
(`kv_layers`): pair j's K/V in the slot of position j, under the sequence's own page table, so
the head's steps read them in place (the eager head through `kv.LayerKv`, the captured draft
round, `mtp_round`, through the paged-attention kernel) and nothing is cut back after a round:
a draft step's K/V at L, L+1, ... are written again by the committed pairs before anything
reads them. The engine leases a row's pages for its drafts before it drafts
(`StepPrepare._draft`).

Prefix reuse (model-math.md §4: a checkpoint holds the last hidden plus the MTP KV): pair j's
MTP K/V depends on the tokens up to j+1 alone, so the pages of a reused prefix bring them along
with the target's; h_j is kept beside them in the KV pool's drafter rows (`kv.cache.KvStorage`).
A pair's h row is written as it runs, and at `forget` the committed pairs still pending run
first (the answer joins the prefix tree next); every sequence is observed (`keeps_rows`),
drafting or not, and a row's pairs run at least every `SPILL` positions. A sequence that
restored m positions holds the K/V of pairs 0..m-2 in its pages, and takes h_{m-1} as its
pending hidden: pair m-1 needs x_m, which the prefix's first owner may not share. (Without the
drafter rows, under tensor parallelism, a restored row starts its pairs at m, and its first
draft steps attend over whatever MTP K/V the prefix's pages hold before m: drafts only, which
verification checks.)

Under the verify chain (`verify_chain`) a greedy round's pairs run on the device, right after
its verify step: the chain hands the drafter its drafts and the new `done` (`chained`).

A pair (h_t, x_{t+1}) runs at the target's rotary position p_t (model-math.md §3.1): for a media
prompt its MRoPE positions, past the prompt t + rope delta on every axis (`pair_positions`); a
media placeholder x_{t+1} is embedded by its vision row, as in the target's input (a pair's
tokens and vision rows are read from its sequence by `mtp_pair_inputs`).
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import torch

from ..host_copy import to_device
from ..kv import LayerKv
from ..kv.cache import keeps_rows
from ..models.mtp import MtpHead
from .graph_capture import start_up_capture
from .mtp_pair_inputs import _embeddable, _pair_media, _tokens
from .mtp_round import MtpRound, pair_positions, rope_delta_of

log = logging.getLogger("ninfer.engine")

SPILL = 32  # pending positions past which a row keeping page rows runs its committed pairs


@dataclass
class _MtpRow:
    done: int  # pairs whose MTP K/V the pages hold: those of positions .. done-1
    pending: torch.Tensor  # target hiddens of positions done .. done + len - 1
    # drafts for the row's next step, drafted on the device by the verify chain
    # (`step.verify_chain`) from pairs through done - 1; None once anything else is computed
    drafted: list[int] | None = None


class MtpDrafter:
    """Per-sequence MTP state and batched drafting for a step's decode rows."""

    def __init__(self, head: MtpHead, vocab: int, draft_head=None) -> None:
        self.head, self.vocab = head, vocab
        self.draft_head = draft_head  # `--lm-head-draft`'s shortlist (draft_head.py), or None
        self._rows: dict[int, _MtpRow] = {}
        self.kv_layers = 1  # the MTP layer's K/V: the pool's attention layer after the target's
        self.layer = head.target.kv_layout()[0]  # its index there
        self.page_rows = head.target.config["hidden_size"]  # a KV slot's row: h_j (`keeps_rows`)
        self.round: MtpRound | None = None  # the captured draft round (`bind_step`)

    keeps_rows = staticmethod(keeps_rows)

    def bind_step(self, storage, graphs) -> None:
        """With the hybrid family's captured decode step (`graphs`: `DecodeGraphs` over
        `storage`), draft rounds replay a CUDA graph too (`mtp_round`, over the shortlist of
        `--lm-head-draft` where given); not on a rank of a tensor-parallel group."""
        decoder = getattr(graphs, "decoder", None)
        core = getattr(decoder, "core", None)
        if (core is None or not graphs.capture or self.head.target.ranks.parallel
                or decoder.max_q < 2):
            return
        try:
            self.round = MtpRound(self.head, core.w.head, storage, self.layer,
                                  decoder.max_batch, decoder.max_context, decoder.max_q - 1,
                                  self.vocab, capture=True, draft_head=self.draft_head)
            with start_up_capture("the MTP draft round", self.head.target.device):
                self.round.capture_at_start(graphs.start_buckets)
        except Exception:  # drafting still works eagerly: serve, and say why it is slower
            log.exception("--spec mtp: the draft round's CUDA graph could not be built; "
                          "drafting eagerly")
            self.round = None

    def observe(self, seq, position: int, hidden: torch.Tensor) -> None:
        """The target computed positions `position ..` of `seq`, with final-normed `hidden`."""
        row = self._rows.get(id(seq))
        if row is not None:
            row.drafted = None
        if row is None and position > 0 and keeps_rows(seq):  # a restored prefix's rows
            row = self._rows[id(seq)] = self._restore(seq, position, hidden)
        elif row is None or not row.done <= position <= row.done + len(row.pending):
            # a first sighting, or positions that do not continue the committed pairs
            # (a copy: the graph step hands over a view of its static buffer)
            row = self._rows[id(seq)] = _MtpRow(position, hidden.clone())
        else:  # what is held from `position` on came from rejected drafts' columns
            row.pending = torch.cat([row.pending[: position - row.done], hidden])
        # a prompt chunk's pairs whose next token is the prompt's run now, a chunk at a time
        # (as the target's prefill), not all at the first draft; one whose next token is a
        # media pad not encoded yet (the next chunk's) waits for that chunk
        upto = min(row.done + len(row.pending), len(seq.prompt) - 1)
        if upto > row.done and not _embeddable(seq, upto):
            upto -= 1
        if position - row.done > SPILL and keeps_rows(seq):  # a row not drafting: its
            # committed pairs (x_position: this step's input, unless a lookahead step's,
            # still on the device) go into its pages
            upto = max(upto, min(position, len(seq.prompt) + len(seq.output) - 1))
        if upto > row.done:
            self._run_pairs([(seq, row, upto - row.done)])

    def _restore(self, seq, position: int, hidden: torch.Tensor) -> _MtpRow:
        """The row of a sequence whose positions 0 .. position-1 came from the prefix tree:
        the K/V of pairs 0 .. position-2 in its pages, h_{position-1} pending."""
        last = seq.cache.read_rows(position)[position - 1:].to(hidden.dtype)
        return _MtpRow(position - 1, torch.cat([last, hidden]))

    def forget(self, seq) -> None:
        """`seq` ended: its committed pairs still pending run into its pages first, and the
        last computed position's hidden joins them (its answer joins the prefix tree next:
        `SequenceMemory.checkpoint`)."""
        row = self._rows.pop(id(seq), None)
        if row is None or not keeps_rows(seq):
            return
        n = min(seq.cached - 1 - row.done, len(row.pending))
        if n > 0:
            self._run_pairs([(seq, row, n)])
        if row.done < seq.cached and len(row.pending):
            seq.cache.write_rows(row.done, row.pending[:1])

    def propose_rows(self, seqs: list, ks: list[int]) -> list[list[int]]:
        """Up to `ks[i]` drafts for decode row `seqs[i]` (0: none); [] where its hiddens up to
        its last computed position are not all held."""
        out: list[list[int]] = [[] for _ in seqs]
        work = []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            row, last = self._rows.get(id(seq)), seq.cached
            if k > 0 and row is not None and row.drafted is not None and row.done == last:
                out[i], row.drafted = row.drafted[:k], None  # the verify chain's
            elif k > 0 and row is not None and row.done < last <= row.done + len(row.pending):
                work.append((i, seq, row, last))
        if not work:
            return out
        if self.round is not None and self.round.takes([w[1] for w in work],
                                                       [w[3] for w in work]):
            try:
                return self._propose_round(work, ks, out)
            except Exception:  # the eager head runs the same pairs again (their K/V too)
                log.exception("--spec mtp: the captured draft round failed; drafting eagerly "
                              "from now on")
                self.round = None
        h = self._run_pairs([(seq, row, last - row.done) for _, seq, row, last in work])
        active = list(range(len(work)))  # the rows of `work` still drafting
        # each step's drafts stay on the device until the last: read once a round, the host
        # queues the k head steps back to back instead of waiting for each one's argmax
        steps: list[tuple[list[int], torch.Tensor]] = []
        for step in itertools.count():
            tokens = self._argmax(h)
            steps.append((active, tokens))
            going = [j for j, n in enumerate(active) if ks[work[n][0]] > step + 1]
            if not going:
                break
            active = [active[j] for j in going]
            picked = to_device(going, h.device)
            # the pair (previous MTP output, previous draft) at position L + step (past the
            # prompt: rotary position L + step + rope delta on every axis)
            positions = to_device([work[n][3] + step + rope_delta_of(work[n][1]) for n in active],
                                  h.device)
            h = self.head(tokens[picked], h[picked],
                          [LayerKv(work[n][1].cache, self.layer, work[n][3] + step)
                           for n in active], [1] * len(active), positions)
        drafted = torch.cat([tokens for _, tokens in steps]).tolist()
        for n, token in zip((n for rows, _ in steps for n in rows), drafted):
            out[work[n][0]].append(token)
        return out

    def _propose_round(self, work: list, ks: list[int], out: list[list[int]]
                       ) -> list[list[int]]:
        """`propose_rows` through the captured round: each row's last `q` committed pairs go
        in (any before them run eagerly first), its first `ks[i]` of the k drafts come out."""
        q = self.round.q
        behind = [(seq, row, last - row.done - q) for _, seq, row, last in work
                  if last - row.done > q]
        if behind:
            self._run_pairs(behind)
        drafts = self.round.propose([seq for _, seq, _, _ in work], [
            (_tokens(seq, row.done + 1, last + 1), row.pending[: last - row.done], row.done)
            for _, seq, row, last in work])
        for (i, seq, row, last), d in zip(work, drafts):
            n, row.done = last - row.done, last
            if keeps_rows(seq):
                self._store(seq, row, n)
            row.pending = row.pending[n:].clone()
            out[i] = d[: ks[i]]
        return out

    def ready(self, seq) -> bool:
        """Whether `seq`'s pairs have run up to its last computed position (as after drafting
        its step): a verify chain can run the next ones from the verify step alone."""
        row = self._rows.get(id(seq))
        return row is not None and row.done == seq.cached

    def chained(self, seq, drafts: list[int] | None) -> None:
        """A verify chain ran `seq`'s pairs up to its new last position (`cached`, its
        acceptance settled) and drafted `drafts` after them, for its next step to verify (None:
        none to hand on: the row ended inside the round, or its next round, launched ahead,
        verifies them already)."""
        row = self._rows.get(id(seq))
        if row is not None:
            row.done, row.drafted = seq.cached, drafts
            row.pending = row.pending.new_empty(0, row.pending.shape[-1])

    def store_rows(self, seq, position: int, hidden: torch.Tensor) -> None:
        """The target's hiddens of `seq` from `position` on into its drafter rows, where its
        pages keep them (prefix reuse)."""
        if keeps_rows(seq):
            seq.cache.write_rows(position, hidden.to(seq.cache.storage.dtype))

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
        rope = [pair_positions(seq, row.done, n) for seq, row, n in work]
        if any(p is not None for p in rope):  # a media prompt's: MRoPE positions, [3, T]
            at = torch.cat([torch.arange(row.done, row.done + n).expand(3, -1) if p is None
                            else p for p, (_, row, n) in zip(rope, work)], 1).to(device)
        else:
            at = to_device(positions, device, torch.long)
        h = self.head(to_device(tokens, device, torch.long), torch.cat(hidden),
                      [LayerKv(seq.cache, self.layer, row.done) for seq, row, _ in work],
                      lengths, at, _pair_media(work, device))
        for seq, row, n in work:
            row.done += n
            if keeps_rows(seq):  # the hiddens of the pairs just run, into the pages
                self._store(seq, row, n)
        for _, row, n in work:  # (a copy: a view would keep the step's hiddens alive)
            row.pending = row.pending[n:].clone()
        ends = to_device(list(itertools.accumulate(lengths)), device) - 1
        return h[ends]

    def _store(self, seq, row: _MtpRow, n: int) -> None:
        """Writes the hiddens h_j of `row`'s last `n` pairs into `seq`'s drafter rows."""
        seq.cache.write_rows(row.done - n, row.pending[:n].to(seq.cache.storage.dtype))

    def _argmax(self, h: torch.Tensor) -> torch.Tensor:
        if self.draft_head is not None:
            return self.draft_head.argmax(h)
        return self.head.logits(h)[:, : self.vocab].argmax(-1)
