"""A step with short prompt chunks on the CPU's compiled llama step (a `ragged` decoder, whose
rows are positions): the chunks' tokens go in as rows at consecutive positions, as a verify row's.

The eager forward streams the fp32 weights (~100-200 ms a step for SmolLM2-135M on the 2-core
box, however few its tokens); the CPU step multiplies 16 rows by the Q8 weights as stored:
8 tokens 35 against 97 ms, 32 tokens 123 against 171 (bench/results/cpu-short-prompts.md).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from . import prompt_logprobs
from .scheduler import Batch, Chunk

# the longest prompt chunk the CPU step takes (in calls of 16 rows): past it the eager forward,
# whose fixed cost is spread over enough tokens (the C step's gain falls to 1.4x at 32 on the
# 2-core box, bench/results/cpu-short-prompts.md; a run with the cap at 48 had them even there)
RAGGED_PROMPT_TOKENS = 32


def ragged_forward(graphs, batch: Batch, sampled: set[int],
                   eager_chunks: Callable[[list[Chunk]], torch.Tensor]) -> torch.Tensor | None:
    """The logits of `batch`'s sampled rows (`batch.sampled`'s order) where the CPU step
    (`graphs.decoder`) takes its prompt chunks: the decode rows, then the chunks' tokens in calls
    of at most its rows (16); chunks longer than `RAGGED_PROMPT_TOKENS` go through
    `eager_chunks` (the eager forward's logits of their sampled rows, in order) after them.
    None: no chunk goes (the caller's path)."""
    d = graphs.decoder
    if batch.decode and not graphs.accepts(batch.decode):
        return None
    # the step feeds a row its prompt token (`input_token`); not a scored prompt (it wants
    # the eager logits of every position) or one with media
    inside = [c for c in batch.chunks
              if c.tokens <= RAGGED_PROMPT_TOKENS and not c.seq.output
              and c.seq.request.media is None and not prompt_logprobs.scores_prompt(c.seq)]
    if not inside:
        return None
    # each call's rows: (sequence, tokens, a decode row?); a chunk's last piece ends it
    calls, room = [[(seq, 1, True) for seq in batch.decode]], d.max_rows - len(batch.decode)
    for c in inside:
        left = c.tokens
        while left:
            if not room:
                calls.append([])
                room = d.max_rows
            n = min(left, room)
            calls[-1].append((c.seq, n, False))
            room, left = room - n, left - n
    kept: dict[int, torch.Tensor] = {}  # each sampled sequence's logits after its last row
    for call in calls:
        seqs = [seq for seq, _, _ in call]
        d.load(seqs, [[] if decoding else list(seq.prompt[seq.cached + 1: seq.cached + n])
                      for seq, n, decoding in call])
        out = d.step(sum(n for _, n, _ in call))
        end = 0
        for seq, n, _ in call:
            end += n
            seq.cached += n
            if id(seq) in sampled:  # a chunk's last piece comes last
                kept[id(seq)] = out[end - 1].clone()
    taken = set(map(id, (c.seq for c in inside)))
    rest = [c for c in batch.chunks if id(c.seq) not in taken]
    eager = eager_chunks(rest) if rest else None
    at = {id(c.seq): i for i, c in enumerate(c for c in rest if id(c.seq) in sampled)}
    rows = [kept[id(seq)] if id(seq) in kept else eager[at[id(seq)]] for seq in batch.sampled]
    # none sampled: a step of prompts that sample nothing yet (or ever: `max_tokens` 0)
    return torch.stack(rows) if rows else out[:0]

