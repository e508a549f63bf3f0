"""A verify row's acceptance on the host: which of its drafts the target keeps, and the token
after them.

`split_verify_rows` separates a step's verify rows' logits (every position) from the plainly
sampled rows'. `accept_greedy` takes the longest prefix of drafts the target's own greedy choice
agrees with, plus the target's token after it, through the request's penalties and grammar, so
the output is exactly what plain greedy decoding would give; `accept_sampled` does rejection
sampling for sampled rows, so their tokens keep the request's sampling distribution. The
captured verify chain (`verify_chain`, `chain_accept`) does the same on the device.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ..host_copy import to_device
from ..kernels import sampling as kernels
from .grammar_drafts import masked
from .sampling import Sampler
from .sampling_paths import CANDIDATES, path_of
from .sampling_penalties import _penalized


def split_verify_rows(batch, logits: torch.Tensor):
    """(logits with one row per sampled sequence, {id(seq): (drafts, its [1 + k, V] rows)}
    for the verify rows) of a step's forward (`runner.forward`: a verify row's every position,
    another row's last); a verify row's entry in the first is its first row (unused), and the
    first is None when every sampled row verifies (no row samples plainly)."""
    if not batch.drafts or not any(batch.drafts):
        return logits, {}
    drafts = {id(seq): d for seq, d in zip(batch.decode, batch.drafts) if d}
    firsts, verified, row = [], {}, 0
    for seq in batch.sampled:
        n = 1 + len(drafts.get(id(seq), ()))
        firsts.append(row)
        if n > 1:
            verified[id(seq)] = (drafts[id(seq)], logits[row: row + n])
        row += n
    if len(verified) == len(firsts):
        return None, verified
    # an index from page-locked memory: a list index copies it blocking, a stream sync
    return logits.index_select(0, to_device(firsts, logits.device)), verified


def accept(rows: list[tuple]) -> list[list[int]]:
    """The tokens each verify row emits (its sampler, its k drafts, its logits [1 + k, V], and
    optionally its drafts' proposal distributions, `accept_sampled`): greedy rows by
    `accept_greedy`, sampled rows by `accept_sampled`, in row order."""
    greedy = [i for i, (sampler, *_) in enumerate(rows) if sampler.params.greedy]
    sampled = [i for i in range(len(rows)) if i not in set(greedy)]
    out: list[list[int]] = [[] for _ in rows]
    for i, tokens in zip(greedy, accept_greedy([rows[i][:3] for i in greedy])):
        out[i] = tokens
    for i, tokens in zip(sampled, accept_sampled([rows[i] for i in sampled])):
        out[i] = tokens
    return out


def _position_views(sampler: Sampler, drafts: list[int], positions: int) -> list:
    """Stand-ins for `sampler` at each position of a verify row, as the sampler's filters read
    them: the same settings, counts that include the drafts before that position. Without
    presence or frequency penalties nothing reads the counts: the sampler itself (a copy of its
    counts a position was ~4 dict copies of every distinct token so far, each round, a row)."""
    if not sampler.params.penalized:
        return [sampler] * positions
    views, counts = [], dict(sampler.counts)
    for i in range(positions):
        views.append(SimpleNamespace(params=sampler.params, counts=dict(counts)))
        if i < len(drafts):
            counts[drafts[i]] = counts.get(drafts[i], 0) + 1
    return views


def accept_sampled(rows: list[tuple]) -> list[list[int]]:
    """Speculative sampling (Leviathan et al.): position i takes draft d_i with probability
    min(1, p_i(d_i) / q_i(d_i)), where p_i is the request's sampling distribution there
    (temperature, top-k/p, min-p, penalties counting the drafts before it, its grammar's mask
    after them) and q_i the draft's own; at the first rejection the token is drawn from
    max(0, p_i − q_i), renormalised; with every draft taken, one more token is drawn from p_k.
    Each emitted token is distributed exactly as plain sampling's. A row is (sampler, drafts,
    logits[, proposal]): without a proposal the drafts are point masses (q_i = δ(d_i): taken
    with probability p_i(d_i), the rejection's draw from p_i without d_i; vLLM's rejection
    sampler for n-gram drafts), else `proposal[i]` = (candidate ids [K], q_i over them) (a
    DFlash2 walk's). The uniforms come from the request's seeded generator, k + 1 a round
    whatever the round takes (`round_uniforms`: the test of draft i reads the i-th, the draw
    the last), so a seed reproduces its run and a round accepted on the device draws the same
    ones."""
    out = []
    for sampler, drafts, logits, *extra in rows:
        proposal = extra[0] if extra else None
        views = _position_views(sampler, drafts, logits.shape[0])
        logits = masked(sampler, drafts, _penalized(logits, views))
        probs, ids = CANDIDATES[path_of(sampler.params)](logits, views)
        probs, ids = probs.double().cpu(), None if ids is None else ids.cpu()
        u = round_uniforms(sampler, len(drafts))
        tokens: list[int] = []
        for i in range(logits.shape[0]):
            p = probs[i] / probs[i].sum()
            if i == len(drafts):  # every draft taken: the next token from p_k
                tokens.append(_inverse_cdf(p, ids, i, u[-1]))
                break
            column = _column(ids, i, drafts[i])
            q = _proposed(proposal[i], ids, i, p.shape[0]) if proposal else None
            if column is None:
                taken = False
            elif q is None:
                taken = u[i] < float(p[column])
            else:  # u < p(d) / q(d), without the division
                taken = u[i] * float(q[column]) < float(p[column])
            if taken:
                tokens.append(drafts[i])
                continue
            if q is not None:
                residual = (p - q).clamp(min=0.0)
                p = residual if float(residual.sum()) > 0 else p  # p ≤ q: no rejection mass
            elif column is not None:
                p = p.clone()
                p[column] = 0.0
            tokens.append(_inverse_cdf(p, ids, i, u[-1]))
            break
        out.append(tokens)
    return out


def round_uniforms(sampler: Sampler, k: int) -> list[float]:
    """A verify round's uniforms from the request's stream: one per draft's test, then the
    draw's."""
    return [sampler.uniform() for _ in range(k + 1)]


def _column(ids: torch.Tensor | None, row: int, token: int) -> int | None:
    """Where `token` is among row `row`'s candidates (ids None: the vocabulary in id order)."""
    if ids is None:
        return token
    hit = (ids[row] == token).nonzero()
    return int(hit[0, 0]) if hit.numel() else None


def _proposed(proposal: tuple[torch.Tensor, torch.Tensor], ids: torch.Tensor | None, row: int,
              width: int) -> torch.Tensor:
    """A draft's proposal distribution (candidate ids, q) over row `row`'s columns of p (ids
    None: the vocabulary in id order); mass on tokens p gives nothing is dropped (it only
    ever lowers p - q, which is clamped at zero there)."""
    q = torch.zeros(width, dtype=torch.float64)
    for token, mass in zip(proposal[0].tolist(), proposal[1].double().tolist()):
        column = _column(ids, row, token)
        if column is not None:
            q[column] += mass
    return q


def _inverse_cdf(p: torch.Tensor, ids: torch.Tensor | None, row: int, u: float) -> int:
    """The first candidate whose cumulative mass exceeds u·total (as the sampler's draw)."""
    cdf = p.cumsum(-1)
    pick = min(int(torch.searchsorted(cdf, u * cdf[-1:], right=True)), p.shape[0] - 1)
    return pick if ids is None else int(ids[row, pick])


def accept_greedy(rows: list[tuple[Sampler, list[int], torch.Tensor]]) -> list[list[int]]:
    """For each verify row (its sampler, its k drafts, its logits [1 + k, V]), the tokens it
    emits: the drafts the target's greedy choice agrees with, then the target's token after the
    last of them. Position i's choice sees the request's penalties with drafts 1..i counted, as
    plain decoding would have; one argmax launch and one host copy for every row."""
    # the sampler's own penalty and grammar steps, position by position (`_position_views`)
    picks = [masked(sampler, drafts,
                    _penalized(logits, _position_views(sampler, drafts, logits.shape[0])))
             for sampler, drafts, logits in rows]
    if not picks:
        return []
    best = kernels.argmax(torch.cat(picks) if len(picks) > 1 else picks[0]).tolist()
    out, start = [], 0
    for (_, drafts, logits), n in zip(rows, [p.shape[0] for p in picks]):
        choice = best[start: start + n]
        start += n
        taken = 0
        while taken < len(drafts) and drafts[taken] == choice[taken]:
            taken += 1
        out.append([*drafts[:taken], choice[taken]])
    return out
