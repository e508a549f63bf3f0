"""The speculative benchmark's drafters: a chosen number of drafts taken a round, since random
weights accept nothing (`bench_engine`'s engine, `ninfer bench`'s speculative section,
`bench/profile_step.py --spec`).

`OracleDrafter` proposes random ids and costs nothing to draft (the host-accepted path's verify
cost curve); `ForcedRounds` keeps a model drafter's work (`--spec mtp` as served), and with
`free_drafts` hands the verify chain `FreeDraftRound` (the device-accepted path's curve, its
drafting taken out). `forced()` makes the engine's acceptance take the drawn counts.
"""

from __future__ import annotations

import random
from contextlib import contextmanager

import torch

from ..step import postprocess


class _ForcedAcceptance:
    """How many drafts each round takes: j ∈ {⌊m⌋, ⌊m⌋ + 1} with mean m = `tokens_per_round`
    − 1, drawn as the round's k drafts are proposed (a round the output limit cuts short
    decodes plainly instead, so every verified round carries k); `forced()` makes the engine's
    acceptance take them."""

    def __init__(self, tokens_per_round: float, k: int, seed: int = 0) -> None:
        if not 1.0 <= tokens_per_round <= 1 + k:
            raise ValueError(f"tokens per round {tokens_per_round} is outside [1, {1 + k}]")
        self.mean_correct, self.k = tokens_per_round - 1, k
        self._rng = random.Random(seed)
        # id(drafts) -> (the drafts, how many the round takes): the list is held so that its
        # id is not reused while the entry lasts (a round whose lease cannot grow drops it)
        self._taken: dict[int, tuple[list[int], int]] = {}

    def _take(self, drafts: list[int]) -> None:
        self._taken[id(drafts)] = (drafts, self._draw())

    def _draw(self) -> int:
        low = int(self.mean_correct)
        return min(self.k, low + (self._rng.random() < self.mean_correct - low))

    @contextmanager
    def forced(self):
        """Within: the engine's acceptance (`postprocess.accept`) runs as usual, then each verify
        row emits its first j drafts and one token more (the last token acceptance chose)."""
        real = postprocess.accept

        def accept(rows):
            emitted = real(rows)
            return [(drafts + out[-1:])[: self._taken.pop(id(drafts))[1] + 1]
                    if id(drafts) in self._taken else out  # a round not forced: as accepted
                    for (_, drafts, *_), out in zip(rows, emitted)]
        postprocess.accept = accept
        try:
            yield
        finally:
            postprocess.accept = real
            self._taken.clear()  # rounds that never reached acceptance


class OracleDrafter(_ForcedAcceptance):
    """The speculative benchmark mode: k drafts a round of which the first j are taken, j drawn
    so that a round averages `tokens_per_round` = 1 + E[j]; `forced()` makes the engine's
    acceptance take exactly those j and one token more. Random weights accept nothing, and a
    continuation recorded by plain decoding does not survive verification: bf16 rounding of a
    four-token verify row differs from a one-token step's, random logits have near-ties and
    random routers flip experts (measured on the H200: 1.08 tokens a round on the 35B-A3B
    shape at a 3.67 target). Forcing the count runs exactly the work of real acceptance — the
    verify forward, the acceptance pass over its logits, the GDN/KV rollback to j — with
    tokens that mean nothing, as every token of a random model. Its drafts are random ids:
    drafting costs nothing here (`ForcedRounds` keeps a model drafter's work)."""

    def __init__(self, tokens_per_round: float, k: int, vocab: int, seed: int = 0) -> None:
        super().__init__(tokens_per_round, k, seed)
        self.vocab = vocab

    def propose(self, tokens: list[int], k: int) -> list[int]:
        if k < self.k:  # a round cut short by the output limit: plain decode, so every
            return []   # verified round carries k drafts
        drafts = [self._rng.randrange(self.vocab) for _ in range(k)]
        self._take(drafts)
        return drafts


class FreeDraftRound:
    """The verify chain's draft round (`MtpRound` in `verify_chain`) with the drafting taken
    out, for `ForcedRounds(..., free_drafts=True)`: the same MTP pool layer, no pairs loaded
    from the verify step, and every round's k drafts one fixed set of random ids a row. A
    chained round then runs what `--spec mtp` serves — the verify step, the device's
    acceptance and GDN rollback, the next round's inputs, launched ahead — less the drafting:
    the verify cost curve of the device-accepted path, as `OracleDrafter` gives the host's.
    (The first round of a request still drafts through the MTP head: its drafter's own round.)"""

    def __init__(self, mtp_round, k: int, seed: int = 0) -> None:
        self.storage, self.layer, self.k = mtp_round.storage, mtp_round.layer, k
        self.step = self  # the chain calls `round.step.load_from_verify` and `.round`
        gen = torch.Generator().manual_seed(seed)
        # (the benchmark's requests ignore end tokens: no draft ends a row's acceptance)
        self.drafts = torch.randint(mtp_round.step.vocab, (mtp_round.max_batch, k),
                                    generator=gen).to(self.storage.device)

    def load_from_verify(self, verify, accepted, bonus, batch: int) -> None:
        """(No pairs: nothing drafts from them.)"""

    def round(self, batch: int, bucket: int) -> torch.Tensor:
        return self.drafts[:batch]


class ForcedRounds(_ForcedAcceptance):
    """A model drafter (`MtpDrafter`: `--spec mtp`) drafting as it serves — its head's forwards,
    its KV, the hiddens it is handed — with the number of its drafts a round takes forced as
    `OracleDrafter`'s: the round costs what a served one does at that acceptance. Everything
    but `propose_rows` is the drafter's own."""

    def __init__(self, drafter, tokens_per_round: float, k: int, seed: int = 0,
                 free_drafts: bool = False) -> None:
        super().__init__(tokens_per_round, k, seed)
        self.drafter = drafter
        if free_drafts:  # the verify chain's rounds without their drafting
            self.round = FreeDraftRound(drafter.round, k, seed)

    def __getattr__(self, name: str):
        return getattr(self.drafter, name)

    def forced_counts(self, drafts: list[list[int] | None], seqs: list) -> list[int | None]:
        """How many of each row's `drafts` its round takes, for acceptance on the device
        (`step.verify_chain`, which `forced()` does not reach; `seqs`: the rows' sequences,
        unused here); None: a round not forced. A round the chain launched from its device
        drafts (None) draws its count now."""
        return [self._draw() if d is None else self._taken.pop(id(d), (None, None))[1]
                for d in drafts]

    def propose_rows(self, seqs: list, ks: list[int]) -> list[list[int]]:
        # fewer than k (a round cut short by the output limit): plain decode, as the oracle's
        proposals = [d if len(d) == self.k else [] for d in self.drafter.propose_rows(seqs, ks)]
        for drafts in proposals:
            if drafts:
                self._take(drafts)
        return proposals
