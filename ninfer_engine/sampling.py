"""Token sampling: penalties -> temperature -> top-k -> top-p -> min-p -> draw.

One `Sampler` per request holds its seeded generator and output-token counts, so the same
seed and prompt give the same tokens whatever else is batched with it.
"""
from __future__ import annotations

import secrets

import torch

from .types import SamplingParams


def apply_penalties(logits: torch.Tensor, counts: dict[int, int], presence: float,
                    frequency: float) -> torch.Tensor:
    """OpenAI semantics over generated tokens: l -= frequency·count + presence·[count > 0]."""
    if not counts or (presence == 0.0 and frequency == 0.0):
        return logits
    ids = torch.tensor(list(counts), device=logits.device)
    n = torch.tensor(list(counts.values()), dtype=logits.dtype, device=logits.device)
    logits = logits.clone()
    logits[ids] -= frequency * n + presence
    return logits


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0,
                  min_p: float = 0.0) -> torch.Tensor:
    """Set to -inf every token that top-k, top-p (nucleus) or min-p rule out. logits: [V]."""
    if top_k <= 0 and top_p >= 1.0 and min_p <= 0.0:
        return logits  # nothing to filter: skip the full-vocabulary sort
    if top_k > 0 and top_k < logits.shape[-1]:
        # top-k first shrinks the sort that top-p needs
        values, indices = logits.topk(top_k)
    else:
        values, indices = logits.sort(descending=True)
    keep = torch.ones_like(values, dtype=torch.bool)
    if top_p < 1.0:
        probs = values.softmax(-1)
        # keep a token while the mass before it is below top_p (the first always stays)
        keep &= (probs.cumsum(-1) - probs) < top_p
    if min_p > 0.0:
        probs = values.softmax(-1)
        keep &= probs >= min_p * probs[0]
    out = torch.full_like(logits, float("-inf"))
    out[indices[keep]] = values[keep]
    return out


class Sampler:
    """Per-request sampler state: settings, a seeded generator, counts of generated tokens."""

    def __init__(self, params: SamplingParams, device: torch.device | str = "cpu") -> None:
        self.params = params
        self.seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(self.seed & ((1 << 64) - 1))
        self.counts: dict[int, int] = {}

    def sample(self, logits: torch.Tensor) -> int:
        """Pick the next token from one row of logits [V] and record it."""
        p = self.params
        logits = apply_penalties(logits, self.counts, p.presence_penalty, p.frequency_penalty)
        if p.greedy:
            token = int(logits.argmax())
        else:
            logits = filter_logits(logits.float() / p.temperature, p.top_k, p.top_p, p.min_p)
            probs = logits.softmax(-1)
            token = int(torch.multinomial(probs, 1, generator=self.generator))
        self.record(token)
        return token

    def record(self, token: int) -> None:
        """Count an output token (sampled here or forced by the engine) for the penalties."""
        self.counts[token] = self.counts.get(token, 0) + 1
