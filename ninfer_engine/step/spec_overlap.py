"""`prompt_ngram_overlap` (`--log-speculation-detail`): how much of an output repeats its prompt,
the drafter-independent measure of what prompt lookup could have drafted."""
from __future__ import annotations

from collections.abc import Sequence

# a 3-gram is a 2-token context (the n-gram drafter's shortest match) plus the token it predicts
OVERLAP_NGRAM = 3


def prompt_ngram_overlap(prompt: Sequence[int], output: Sequence[int],
                         n: int = OVERLAP_NGRAM) -> float:
    """The share of `output`'s tokens that end an n-gram (over prompt + output) occurring in
    `prompt`; 0.0 for an empty output."""
    if not output:
        return 0.0
    seen = {tuple(prompt[i: i + n]) for i in range(len(prompt) - n + 1)}
    tokens = [*prompt, *output]
    start = len(prompt)
    hits = sum(1 for j in range(start, len(tokens))
               if j >= n - 1 and tuple(tokens[j - n + 1: j + 1]) in seen)
    return hits / len(output)
