"""The runner: turns a scheduled `Batch` into one model forward and returns its logits."""
from __future__ import annotations

import torch

from .models import LlamaModel, Segment
from .scheduler import Batch


class Runner:
    """Owns the model; builds the flat token batch (decode tokens first, then the prefill chunk)."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.device = model.device

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [len(batch.sampled), V]; advances each sequence's `cached` count."""
        tokens: list[int] = []
        positions: list[int] = []
        segments: list[Segment] = []
        for seq in batch.decode:
            tokens.append(seq.output[-1])
            positions.append(seq.cached)
            segments.append(Segment(seq.cache, seq.cached, 1))
        logit_rows = list(range(len(batch.decode)))
        seq, n = batch.prefill, batch.prefill_tokens
        if seq is not None:
            tokens.extend(seq.prompt[seq.cached: seq.cached + n])
            positions.extend(range(seq.cached, seq.cached + n))
            segments.append(Segment(seq.cache, seq.cached, n))
            if len(batch.sampled) > len(batch.decode):
                logit_rows.append(len(tokens) - 1)
        logits = self.model.forward(
            torch.tensor(tokens, device=self.device),
            torch.tensor(positions, device=self.device),
            segments,
            torch.tensor(logit_rows, dtype=torch.long, device=self.device),
        )
        for s in batch.decode:
            s.cached += 1
        if seq is not None:
            seq.cached += n
        return logits
