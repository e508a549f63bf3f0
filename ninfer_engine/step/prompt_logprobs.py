"""Prompt log-probabilities: a prompt chunk's every position scored against the next prompt token.

A request with `prompt_logprobs` (Completions `echo` + `logprobs`, vLLM's `prompt_logprobs`)
has its prompt chunks' every position's logits computed (`runner._eager`); position j's
log_softmax gives prompt token j + 1 its log-probability, rank and the top alternatives. The
first prompt token has no context, so its entry has none (OpenAI's and vLLM's `null`). The
chunk's last position is also the sampled row when the chunk ends the prompt.
"""
from __future__ import annotations

from typing import Any

import torch

from ..types import TokenLogprob

BLOCK = 256  # positions per log_softmax: a [BLOCK, vocab] float32 at a time, not the chunk's


def scores_prompt(seq: Any) -> bool:
    """Does this row's sequence want its prompt chunk's every position? (The step harnesses'
    rows carry no request.)"""
    request = getattr(seq, "request", None)
    return (request is not None and request.prompt_logprobs is not None
            and seq.cached < len(seq.prompt))


def record(seq: Any, first: int, logits: torch.Tensor) -> None:
    """Append the entries of the prompt tokens after positions first .. first + len(logits) - 1
    (each position's logits predict the next token) to the request's sink."""
    request, prompt = seq.request, seq.prompt
    sink = request.prompt_logprob_sink
    if sink is None:
        return
    if first == 0:
        sink.append(TokenLogprob(prompt[0], None))
    targets = list(prompt[first + 1: first + 1 + logits.shape[0]])  # the last chunk: one fewer
    k = request.prompt_logprobs
    for start in range(0, len(targets), BLOCK):
        block = targets[start: start + BLOCK]
        logp = logits[start: start + len(block)].float().log_softmax(-1)
        index = torch.tensor(block, device=logp.device).unsqueeze(1)
        chosen = logp.gather(1, index)
        ranks = (logp > chosen).sum(-1) + 1
        top_values, top_ids = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())
        for token, value, rank, values, ids in zip(block, chosen[:, 0].tolist(), ranks.tolist(),
                                                   top_values.tolist(), top_ids.tolist()):
            sink.append(TokenLogprob(token, value, tuple(zip(ids, values)), rank))


def split(logits: torch.Tensor, rows: list[tuple[Any, int, int, bool]]) -> torch.Tensor:
    """Record the scored rows of a forward's logits; return the sampled rows' in row order.
    `rows`: (sequence, its first position, its logit rows, sampled?) per row of the output; a
    scored row has one logit row per token (its last one sampled if the row is)."""
    keep: list[int] = []
    at = 0
    for seq, first, n, sampled in rows:
        if scores_prompt(seq):
            record(seq, first, logits[at: at + n])
            if sampled:
                keep.append(at + n - 1)  # the prompt's last position samples the first token
        else:
            keep.extend(range(at, at + n))
        at += n
    return logits if len(keep) == at else logits[keep]
