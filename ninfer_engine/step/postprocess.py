"""A step's postprocess (nano-vllm's schedule -> run -> postprocess): the launched step's
tokens, sampled from its logits or read from its device picks (a lookahead step), appended to
their requests; verify rows accepted and the rest of their drafts rolled back; the step counted;
the finished retired.

`StepPostprocess` is that half of `Engine`: it reads the engine's `memory`, `runner`,
`speculator`, `stats`, `model`, `max_context`, `_faults` and `_settled`, and hands ended
requests to its `_retire`. A failure here ends the one request it belongs to, never the step.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import torch

from ..types import EngineError
from .lookahead import picked_tokens
from .sampling import Picked, prefetch_masks
from .scheduler import Batch
from .sequence import Sequence, next_tokens
from .acceptance import accept, split_verify_rows

log = logging.getLogger("ninfer.engine")


class StepPostprocess:
    """The postprocess methods of `Engine` (see the module docstring)."""

    def _finish(self, batch: Batch, logits: torch.Tensor | None, started: float,
                picked: Picked | None = None) -> None:
        """A launched step's tokens: sampled from `logits`, or read from its device `picked`
        (a lookahead step: rows that ended meanwhile are skipped); appended, accepted,
        counted, and the finished retired."""
        if picked is not None:  # a pure-decode step: every row sampled, none verifying
            token_of = dict(zip(map(id, batch.decode), picked_tokens(batch.decode, picked)))
            live = [seq for seq in batch.decode if token_of[id(seq)] is not None]
            batch, verified = dataclasses.replace(batch, decode=live, sampled=live), {}
        else:
            logits, verified = split_verify_rows(batch, logits)
        # the decode rows' output before this step's tokens, for the speculation policy
        emitted = sum(len(seq.output) for seq in batch.decode) if self.speculator else 0
        for chunk in batch.chunks:
            if chunk.seq.request.report_progress:
                chunk.seq.report_progress()  # before its first token, if this chunk samples
            self.memory.prefilled(chunk.seq)  # its full pages (and snapshot) join the tree
        rows = []
        for row, seq in enumerate(batch.sampled):
            try:
                self._faults.check_request(seq)
                rows.append(row)
            except Exception as exc:  # this request only: the batch and the loop are fine
                self._fail_request(seq, exc)
        plain = [row for row in rows if id(batch.sampled[row]) not in verified]
        if picked is not None:
            tokens = [token_of[id(batch.sampled[row])] for row in plain]
        else:  # with every row verifying there is nothing to sample (and `logits` is None)
            tokens = self._next_tokens(batch.sampled, plain, logits) if plain else []
        # stamped once the tokens are on the host: a kernel-bound prompt step's launches end
        # long before its kernels do, and a stamp before this read was early by that gap
        now = time.monotonic()
        for row, token in zip(plain, tokens):
            seq = batch.sampled[row]
            try:
                if token is not None:
                    seq.append(token, now)
            except Exception as exc:
                self._fail_request(seq, exc)
        if verified:
            now = self._accept(batch, verified)
        if self.speculator is not None and batch.decode and not batch.chunks:
            # pure decode steps, plain or verifying: what `spec_policy` compares; a step
            # launched before the one before settled (lookahead, a chain round ahead) costs
            # from that settling on, not from its launch, which overlapped that step's time
            self.speculator.record_step(len(batch.decode), bool(verified),
                                        sum(len(seq.output) for seq in batch.decode) - emitted,
                                        time.perf_counter() - max(started, self._settled))
        for seq in batch.sampled:
            if seq.finish_reason is None and seq.cached + 1 >= self.max_context:
                seq.finish("length")
        prompted = [chunk.seq for chunk in batch.chunks]
        for seq in prompted:
            if seq.prefill_done and seq.request.max_tokens == 0:
                seq.first_token = seq.last_token = now
                seq.finish("length")
        # the next step's grammar masks fill in the background while it schedules and forwards
        prefetch_masks([s.sampler for s in batch.sampled if s.finish_reason is None],
                       self.model.device)
        self.stats.record_step(len(batch.decode), batch.prefill_tokens, now)
        for seq in [*batch.decode, *prompted]:
            if seq.finish_reason is not None:
                self._retire(seq)
        self._settled = time.perf_counter()

    def _accept(self, batch: Batch, verified: dict) -> float:
        """Acceptance of the step's verify rows (`acceptance.accept`); each row keeps the
        tokens it emitted and rolls back the rest (`runner.keep`). Returns when their tokens
        reached the host (the time they are stamped with)."""
        rows = [seq for seq in batch.decode if id(seq) in verified]
        emitted = []
        live = [seq for seq in rows if seq.finish_reason is None]
        try:
            emitted = self.runner.accepted(live) or accept(
                [self._verify_row(seq, verified[id(seq)]) for seq in live])
        except Exception as exc:  # these requests only
            for seq in rows:
                self._fail_request(seq, exc)
        now = time.monotonic()
        taken = iter(emitted)
        kept = {}
        for seq in rows:
            if seq.finish_reason is not None:
                kept[id(seq)] = 1
                continue
            drafts, tokens, before = verified[id(seq)][0], next(taken), len(seq.output)
            # the drafts the target verified (its own token ends the row), counted before the
            # tokens go out: a request that ends in this round reports it in its final event
            accepted = len(tokens) - 1
            seq.drafted += len(drafts)
            seq.draft_accepted += accepted
            seq.draft_rounds.append(accepted)
            self.speculator.record(seq, len(drafts), accepted)
            try:
                seq.extend(tokens, now)
            except Exception as exc:
                self._fail_request(seq, exc)
            kept[id(seq)] = max(len(seq.output) - before, 1)
        self.runner.keep(batch, [kept.get(id(seq), 1) for seq in batch.decode])
        return now

    def _verify_row(self, seq: Sequence, verified: tuple) -> tuple:
        """`acceptance.accept`'s row for `seq`: (sampler, drafts, logits), and the drafts'
        proposal distributions where its drafter sampled them (a DFlash2 walk)."""
        proposal = self.speculator.proposal(seq)
        return (seq.sampler, *verified) + (() if proposal is None else (proposal,))

    def _next_tokens(self, sampled: list[Sequence], rows: list[int],
                     logits: torch.Tensor) -> list[int | None]:
        """The tokens of the given rows, all sampled at once; if that fails, row by row so only
        the failing request ends (None: that request failed)."""
        seqs = [sampled[row] for row in rows]
        try:
            return next_tokens(seqs, logits if len(rows) == len(sampled) else logits[rows])
        except Exception:
            log.exception("batched sampling failed; sampling row by row")
        tokens: list[int | None] = []
        for row, seq in zip(rows, seqs):
            try:
                tokens.append(seq.next_token(logits[row]))
            except Exception as exc:
                self._fail_request(seq, exc)
                tokens.append(None)
        return tokens

    def _fail_request(self, seq: Sequence, exc: Exception) -> None:
        log.exception("request %s failed", seq.id, exc_info=exc)
        seq.fail(EngineError(f"request failed: {exc}"))

