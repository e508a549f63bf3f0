"""A drafter wrapper for the speculative tests: the engine's own drafter (MTP, DFlash) proposes,
each proposal is recorded and then steered — its first j drafts replaced by the plain run's
tokens and draft j + 1 made wrong (j cycling through 0..k) — so every acceptance length occurs
while the drafter sees what the engine commits. Every third step it leaves the drafter out (a
plain decode row), so the drafter also catches up over a plain row after a partly accepted
verify row."""
from __future__ import annotations

import itertools


class Steered:
    def __init__(self, drafter, want: dict[str, list[int]], vocab: int) -> None:
        self.drafter, self.want, self.vocab = drafter, want, vocab
        self.proposed: list[tuple[str, int, list[int]]] = []  # (request, cached, own drafts)
        self._j, self._steps = itertools.count(), itertools.count(1)

    @classmethod
    def install(cls, engine, plain: list[list[int]]):
        """Steer `engine`'s own drafter toward `plain` (request "r{i}"'s tokens at i); returns
        the steered drafter, now the engine's."""
        steered = cls(engine.speculator.drafter, {f"r{i}": t for i, t in enumerate(plain)},
                      engine.model.vocab_size)
        engine.speculator.drafter = steered
        return steered

    def observe(self, seq, position, hidden):
        self.drafter.observe(seq, position, hidden)

    def forget(self, seq):
        self.drafter.forget(seq)

    def propose_rows(self, seqs, ks):
        if next(self._steps) % 3 == 0:
            return [[] for _ in seqs]
        out = []
        for seq, own in zip(seqs, self.drafter.propose_rows(seqs, ks)):
            if own:
                self.proposed.append((seq.id, seq.cached, own))
                truth = self.want[seq.id][len(seq.output): len(seq.output) + len(own)]
                j = next(self._j) % (len(own) + 1)
                own = (truth[:j] + [(t + 1) % self.vocab for t in truth[j: j + 1]]
                       + own[j + 1:])
            out.append(own)
        return out
