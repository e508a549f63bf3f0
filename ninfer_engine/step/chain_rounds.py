"""The verify chain's (`verify_chain`) rounds the host has not settled: `_Round`, one launched
chain's rows, the drafts they verify and its results' host copy; and `ChainRounds`, how the host
reads and settles them, oldest first: the tokens each row emits (`accepted`, the round's one
read-back), then each row's `cached` advanced, its GDN state taken back from the verify step's
trail where the host kept fewer tokens than the device, and a round launched ahead handed the
drafts it verifies (`settle`, `ahead_drafts`); whether a step's rows are the oldest round's
(`owns`) or the one round's alone (`alone`); a round whose rows all ended discarded, a failed
step's rounds dropped. `ChainRounds` is a part of `VerifyChain`, apart only to keep each file to
one concern: it reads the chain's own fields."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..types import EngineError


@dataclass
class _Round:
    """A launched chain the host has not settled: its rows by sequence, the drafts they verify
    (None for a round launched ahead, until its predecessor's are read), its results' host
    copy; `ahead`: the next round was launched on this one's device outputs."""

    rows: dict[int, int]
    drafts: list[list[int] | None]
    host: torch.Tensor
    event: torch.cuda.Event | None
    ahead: bool = False
    read: list[list[int]] | None = None
    penalized: bool = False  # some row has penalties (`chain_penalties`)
    candidates: int = 0  # some row samples, over this many candidates (`chain_accept`)

    def results(self) -> list[list[int]]:
        """[j, bonus, draft 1, .., draft k] of each row: waits for the round's copy."""
        if self.read is None:
            if self.event is not None:
                self.event.synchronize()
            self.read = self.host[: len(self.rows)].tolist()
        return self.read


class ChainRounds:
    def ahead_drafts(self) -> list[list[int]]:
        """The drafts the round launched ahead verifies, a row each (read with the round
        before it: `settle`)."""
        return list(self._rounds[-1].drafts)

    def discard(self) -> None:
        """The oldest round unsettled for good: every row of it ended with the round before."""
        self._rounds.popleft()

    def drop(self) -> None:
        """Every unsettled round forgotten: the step that carried its rows failed, and they
        ended with it (`step_failure`)."""
        self._rounds.clear()

    def alone(self, seqs: list) -> bool:
        """Whether the one unsettled round is of exactly `seqs` (in order): its next may go
        ahead (`chain_ahead`)."""
        return len(self._rounds) == 1 and list(self._rounds[0].rows) == list(map(id, seqs))

    def owns(self, seqs: list) -> bool:
        """Whether `seqs` are rows of the oldest unsettled round (the step being finished)."""
        return bool(self._rounds) and all(id(s) in self._rounds[0].rows for s in seqs)

    def accepted(self, seqs: list) -> list[list[int]]:
        """The tokens each of `seqs` (rows of the oldest round) emits: its first j drafts and
        the bonus. Waits for that round (its one read-back)."""
        r = self._rounds[0]
        results, out = r.results(), []
        for seq in seqs:
            b = r.rows[id(seq)]
            j, bonus = results[b][:2]
            out.append([*r.drafts[b][:j], bonus])
        return out

    def settle(self, seqs: list, kept: list[int]) -> None:
        """After the host's acceptance of the oldest round: row i keeps `kept[i]` tokens and
        `cached` advances. Where the device kept more (the host ended the row), its GDN state
        goes back to them from the trail. Where the next round is already under way, the
        rows going on hand it their drafts; a row that ended on its bonus is taken to its
        state after that token (the next round's first: `cached` covers it, as a lookahead
        step's row); one the host ended inside the round has no exact state left (no
        checkpoint: `Sequence.state_exact`)."""
        r = self._rounds.popleft()
        nxt = self._rounds[0] if r.ahead else None
        results, q = r.results(), self.k + 1
        for seq, n in zip(seqs, kept):
            b = r.rows[id(seq)]
            j, _, *drafts = results[b]
            if nxt is None:
                if n != j + 1:
                    self.graphs.decoder.keep(b, n)
                seq.cached += n
                self.drafter.chained(seq, drafts if n == j + 1 else None)
                continue
            nxt.drafts[b] = drafts
            seq.cached += n
            self.drafter.chained(seq, None)  # its drafts are being verified already
            if n != j + 1:
                seq.state_exact = False
                if seq.finish_reason is None:  # not a row `ChainAhead` lets go ahead
                    seq.fail(EngineError("the verify chain lost this request's state"))
            elif seq.finish_reason is not None:
                self.graphs.decoder.keep(b, 1)
                seq.cached += 1
            else:  # h of the next round's positions, for prefix reuse
                self.drafter.store_rows(seq, seq.cached, self.core.hidden[b * q: (b + 1) * q])
