"""Grammar-aware drafting (issues 19 and 21): constrained rows draft too, as vLLM and SGLang do
with xgrammar / llguidance.

Before the forward, `cut` shortens each constrained row's drafts (from any drafter) to the
longest prefix its grammar accepts (`TokenConstraint.draftable`: llguidance's
`validate_tokens`, which leaves the matcher where it was) and computes, in one executor call for
all those rows, the k + 1 masks its verify row needs: position j's mask is the grammar's after
drafts 0..j-1 (`unsafe_compute_mask_ptr_with_draft_token` consumes the drafts and rolls them
back). A draft that stops the grammar (its end-of-sequence token) leaves an empty mask after
it, so it is cut too: the next position would have nothing to pick. The masks wait on the
constraint (`TokenConstraint.verify`, per-row state beside its version and drafts) until the
acceptance applies them (`masked`) after the penalties, as `sampling.pick_rows` does, so each
position's greedy choice, or the distribution rejection sampling tests a draft against, is
exactly plain constrained decoding's there. Acceptance then records the emitted tokens one by
one (`Sampler.record`), which advances the matcher by exactly those.

The masks are computed on the engine thread when the step drafts (not in the background): the
next-step prefetch (`constrained.prefetch`) fills position 0 only and cannot know the drafts,
so a verify row leaves its prefetched mask unused (stale once the row's tokens are recorded).
"""
from __future__ import annotations

import logging

import torch

from ..constrained import mask

log = logging.getLogger("ninfer.engine")


def cut(seqs: list, proposals: list[list[int]]) -> list[list[int]]:
    """`proposals` (a step's drafts by row) with each constrained row's cut to what its
    grammar accepts, and that row's verify masks computed and kept on its constraint."""
    out = list(proposals)
    rows = []
    for i, (seq, drafts) in enumerate(zip(seqs, proposals)):
        constraint = seq.sampler.constraint
        if constraint is None or not drafts:
            continue
        constraint.verify = None
        out[i] = drafts[: constraint.draftable(drafts)]
        if out[i] and constraint.active:
            rows.append(i)
    if not rows:
        return out
    try:
        bits = _fill([(seqs[i].sampler.constraint, out[i]) for i in rows])
    except Exception:  # these rows decode plainly, where sampling reports a broken grammar
        log.exception("grammar masks of verify rows failed; decoding those rows plainly")
        return [[] if i in rows else d for i, d in enumerate(out)]
    at = 0
    for i in rows:
        n = len(out[i])
        allowed = bits[at + 1: at + n + 1].ne(0).any(dim=1).tolist()
        kept = allowed.index(False) if False in allowed else n  # a draft that stopped it
        constraint = seqs[i].sampler.constraint
        out[i] = out[i][:kept]
        if kept:
            constraint.verify = (constraint.version, tuple(out[i]), bits[at: at + kept + 1])
        at += n + 1
    return out


def masked(sampler, drafts: list[int], logits: torch.Tensor) -> torch.Tensor:
    """A verify row's logits [1 + k, V] (penalties applied) with each position's grammar mask;
    unchanged without an active grammar. The masks `cut` kept for this state and these drafts,
    else computed now (a caller that did not draft through `cut`)."""
    constraint = sampler.constraint
    if constraint is None or not constraint.active:
        return logits  # `draftable` ends the drafts before a token that would start it
    held, constraint.verify = constraint.verify, None
    if held is not None and held[:2] == (constraint.version, tuple(drafts)):
        bits = held[2]
    else:
        bits = _fresh(constraint, drafts)
    return mask.masked_logits(logits, bits, list(range(logits.shape[0])))


def _fresh(constraint, drafts: list[int]) -> torch.Tensor:
    """The masks of `drafts`' positions computed now; positions past the first draft the
    grammar refuses repeat the mask before it (that draft is never taken, so they are never
    read for an emitted token)."""
    constraint.check()
    valid = constraint.draftable(drafts)
    bits = _fill([(constraint, drafts[:valid])])
    if valid < len(drafts):
        bits = torch.cat([bits, bits[-1:].expand(len(drafts) - valid, -1)])
    return bits


def _fill(rows: list) -> torch.Tensor:
    """int32 bits [sum(k_i + 1), W]: for each (constraint, its k_i drafts), the masks after
    0..k_i of its drafts (`mask.fill_drafts`)."""
    bits = mask.new_buffer(sum(len(d) + 1 for _, d in rows), rows[0][0].vocab)
    pairs, at = [], 0
    for constraint, drafts in rows:
        pairs.append((constraint.matcher, at, list(drafts)))
        at += len(drafts) + 1
    mask.fill_drafts(pairs, bits)
    return bits
