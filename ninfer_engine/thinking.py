"""The thinking cap (contract §8): past a reasoning budget, the engine forces the close.

A `ThinkingCap` watches one request's output while it is still reasoning. Once `budget`
reasoning tokens were generated it queues the close ids (Qwen's closing guidance plus
`</think>`); the engine then takes those as the next tokens instead of sampling, so they are
fed through the model, streamed and counted like any output, and sampling resumes after them.
"""
from __future__ import annotations

from collections import deque

from .types import GenerationRequest


class ThinkingCap:
    """Counts reasoning tokens and holds the forced close once the budget is spent."""

    def __init__(self, budget: int, close_ids: tuple[int, ...], end_ids: tuple[int, ...]) -> None:
        self.budget = budget
        self.close_ids = close_ids
        self.end_ids = list(end_ids)
        self.spent = 0  # reasoning tokens generated so far
        self.reasoning = True
        self.forced: deque[int] = deque()
        self._check()

    @classmethod
    def for_request(cls, request: GenerationRequest) -> ThinkingCap | None:
        if request.thinking_budget is None:
            return None
        return cls(request.thinking_budget, request.thinking_close_ids, request.think_end_ids)

    def observe(self, output: list[int]) -> None:
        """After each appended output token (sampled or forced)."""
        if not self.reasoning:
            return
        if self.end_ids and output[-len(self.end_ids):] == self.end_ids:
            self.reasoning = False  # the model closed its reasoning within the budget
            return
        self.spent += 1
        self._check()

    def _check(self) -> None:
        if self.spent >= self.budget:
            self.reasoning = False
            self.forced.extend(self.close_ids)
