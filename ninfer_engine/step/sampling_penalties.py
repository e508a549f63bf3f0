"""Presence and frequency penalties of the host's sampler (`sampling`), OpenAI semantics over a
request's generated tokens: l -= frequency·count + presence·[count > 0].

`apply_penalties` is the rule on one row of logits (the reference the tests hold the batch to);
`_penalized` applies it to the rows of a step whose request has penalties and has generated
tokens, every such row's counted tokens and settings packed into two buffers and penalized in
one kernel (`kernels.penalties.penalize`), a lookahead step's picks in flight counted too.
`sample_rows` calls it before the grammar masks and the filters, and a verify row's acceptance
(`acceptance`) with each draft position's counts.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..kernels.penalties import lessen, penalize, penalty
from .sampling_paths import staged

if TYPE_CHECKING:
    from .sampling import Sampler


def apply_penalties(logits: torch.Tensor, counts: dict[int, int], presence: float,
                    frequency: float) -> torch.Tensor:
    """OpenAI semantics over generated tokens: l -= frequency·count + presence·[count > 0]."""
    if not counts or (presence == 0.0 and frequency == 0.0):
        return logits
    ids, times = sparse_counts(counts, logits.device)
    return logits.index_put((ids,), lessen(logits[ids], penalty(times, presence, frequency)))


def sparse_counts(counts: dict[int, int], device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """`counts` as (token ids, fp32 counts) on `device`."""
    return (staged(torch.tensor(list(counts), dtype=torch.long), device),
            staged(torch.tensor(list(counts.values()), dtype=torch.float32), device))


def _penalized(logits: torch.Tensor, samplers: list[Sampler],
               pending: torch.Tensor | None = None) -> torch.Tensor:
    """Penalties on the rows whose request has them and has generated tokens; others untouched.
    `pending` [B] (on the device): each row's pick of the step in flight, which its sampler
    has not recorded yet, counted as recorded (the lookahead step)."""
    rows = [i for i, s in enumerate(samplers) if (s.counts or pending is not None)
            and s.params.penalized]
    if not rows:
        return logits
    # each row's counted tokens as host arrays (`Sampler.record` keeps them), packed with the
    # rows' settings into one integer and one float buffer: two copies and one kernel a step
    parts = [_counts_of(samplers[i]) for i in rows]
    sizes = torch.tensor([0] + [len(p[0]) for p in parts], dtype=torch.long)
    count = len(rows)
    ints = staged(torch.cat([sizes.cumsum(0), torch.tensor(rows, dtype=torch.long),
                          *(p[0] for p in parts)]), logits.device)
    floats = staged(torch.cat([
        torch.tensor([samplers[i].params.presence_penalty for i in rows], dtype=torch.float32),
        torch.tensor([samplers[i].params.frequency_penalty for i in rows], dtype=torch.float32),
        *(p[1] for p in parts)]), logits.device)
    offsets, at, ids = ints[:count + 1], ints[count + 1:2 * count + 1], ints[2 * count + 1:]
    presence, frequency, times = floats[:count], floats[count:2 * count], floats[2 * count:]
    # the caller's logits stay as they were
    return penalize(logits.clone(), offsets, at, presence, frequency, ids, times, pending)


def _counts_of(sampler) -> tuple[torch.Tensor, torch.Tensor]:
    """A sampler's (token ids, fp32 counts) on the host: the `Sampler`'s own arrays; built from
    `counts` for a stand-in (a verify row's position)."""
    counted = getattr(sampler, "counted", None)
    return counted() if counted is not None else sparse_counts(sampler.counts,
                                                               torch.device("cpu"))
