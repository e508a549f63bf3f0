"""`benchmark.forced_drafts.FreeDraftRound` (`profile_step --drafter free`): the verify chain with
its drafting taken out still serves what the host path serves with the same drafts."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ninfer_engine.benchmark.forced_drafts import ForcedRounds, FreeDraftRound
from ninfer_engine.step.acceptance import split_verify_rows
from ninfer_engine.step.scheduler import Batch

from .test_verify_chain import K, V, _emit, _host_picks, _rig


def _serve(chained: bool, plan: list[tuple[int, int]], device):
    """Two greedy rows through rounds of `plan`'s forced counts: the first two rounds' drafts
    from the MTP head, every later round's the free round's fixed ids (the chain's round
    swapped for the free one after the first, so its second drafts the third's; or handed to
    the host path); (tokens, the drafts of every round, GDN states, the fixed ids)."""
    storage, drafter, speculator, runner, seqs = _rig(False, chained, iter(plan), (9, 40), 5,
                                                      device)
    free = FreeDraftRound(drafter.round, K, seed=2)
    proposed = []
    for n, counts in enumerate(plan):
        for seq in seqs:
            assert seq.cache.reserve(seq.cached + 2 * K + 1)
        if chained and n == 1:  # (on CUDA its graphs are captured again for the new round)
            speculator.drafter.round = free  # (the rig's forced-count wrapper)
        drafts = (speculator.draft_rows(seqs, [K, K]) if chained or n < 2
                  else free.drafts[: len(seqs)].tolist())
        proposed.append(drafts)
        batch = Batch(seqs, [], list(seqs), drafts)
        logits = runner.forward(batch)
        emitted = runner.accepted(seqs)
        if emitted is None:  # the chain's rule: j drafts, then the target's pick there
            verified = split_verify_rows(batch, logits)[1]
            emitted = [[*d[:j], _host_picks(s, d, verified[id(s)][1])[j]]
                       for s, d, j in zip(seqs, drafts, counts)]
        for seq, tokens in zip(seqs, emitted):
            _emit(seq, tokens)
        runner.keep(batch, [len(t) for t in emitted])
    return ([s.output for s in seqs], proposed,
            [t.clone() for s in seqs for t in s.state.tensors()], free.drafts[:2].tolist())


@torch.inference_mode()
def test_chained_rounds_without_drafting_serve_the_host_paths_tokens_and_states(device):
    """Rounds keeping 4 and 1, then 2 and 3, then 1 and 4 tokens: once its round is the free
    one the chain verifies the fixed ids, and its tokens and GDN states are the host path's
    given the same drafts."""
    plan = [(3, 0), (1, 2), (0, 3)]
    host = _serve(False, plan, device)
    chain = _serve(True, plan, device)
    fixed = chain[3]
    assert chain[1][2] == fixed != chain[1][1]  # the free round drafted the third's
    assert chain[1] == host[1] and chain[0] == host[0]
    assert [len(o) for o in chain[0]] == [1 + 4 + 2 + 1, 1 + 1 + 3 + 4]
    assert all(torch.equal(x, y) for x, y in zip(chain[2], host[2]))


def test_forced_rounds_with_free_drafts_hand_the_chain_the_free_round():
    """`ForcedRounds(..., free_drafts=True)` gives the chain a `FreeDraftRound` over the
    drafter's own round's pool layer (its first drafts still come from the drafter)."""
    mtp_round = SimpleNamespace(storage=SimpleNamespace(device=torch.device("cpu")), layer=1,
                                max_batch=4,
                                step=SimpleNamespace(vocab=V))
    drafter = SimpleNamespace(round=mtp_round, propose_rows=None)
    forced = ForcedRounds(drafter, 3.0, K, free_drafts=True)
    assert isinstance(forced.round, FreeDraftRound) and forced.round.step is forced.round
    assert forced.round.storage is mtp_round.storage and forced.round.layer == 1
    assert forced.round.round(2, 64).shape == (2, K)
    assert int(forced.round.drafts.max()) < V
    assert ForcedRounds(drafter, 3.0, K).round is mtp_round  # not free: the drafter's own
