"""The runners: turn a scheduled `Batch` into model forwards and return the sampled rows' logits.

`Runner` (llama family) packs every row into one flat forward over the paged KV pool.
`HybridRunner` (Qwen3.5 family) runs every row through one forward too: the attention layers
read and write each row's pages, the GDN layers continue each row's recurrent-state slot in
place (the same slot rows the graph step addresses by index: nothing to hand over between them).
Where `DecodeGraphs` was built (CUDA, bf16) both send a step's decode rows through it (static
buffers, Triton kernels, CUDA graphs), and the step's prompt chunks, if any, through the eager
forward after them: decode rows keep the graph's rate while a prompt is prefilled.
"""
from __future__ import annotations

import torch

from .decode_graphs import DecodeGraphs
from .kv import LayerKv
from .models import LlamaModel, Qwen35Model, Segment
from .scheduler import Batch, Chunk, Sequence


def _work(decode: list[Sequence], chunks: list[Chunk]) -> list[tuple[Sequence, list[int]]]:
    """(sequence, tokens to compute) in row order: decode tokens first, then the prompt chunks."""
    work = [(seq, [seq.output[-1]]) for seq in decode]
    work += [(c.seq, list(c.seq.prompt[c.seq.cached: c.seq.cached + c.tokens])) for c in chunks]
    return work


class _ModelRunner:
    """The model of one family and, on CUDA, its static decode path."""

    def __init__(self, model, graphs: DecodeGraphs | None = None) -> None:
        self.model = model
        self.device = model.device
        self.graphs = graphs

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [len(batch.sampled), V]; advances each sequence's `cached` count."""
        sampled = set(map(id, batch.sampled))
        graphs = self.graphs
        if graphs is None or not batch.decode or not graphs.accepts(batch.decode):
            return self._eager(_work(batch.decode, batch.chunks), sampled)
        logits = graphs.forward(batch.decode)
        if not batch.chunks:
            return logits
        prompts = self._eager(_work([], batch.chunks), sampled)
        return torch.cat([logits, prompts.to(logits.dtype)])

    def _eager(self, work: list[tuple[Sequence, list[int]]], sampled: set[int]) -> torch.Tensor:
        """Logits of the rows of `work` whose sequence is in `sampled` (ids), in row order."""
        raise NotImplementedError


class Runner(_ModelRunner):
    """Owns the llama-family model; builds the flat token batch."""

    def _eager(self, work, sampled):
        tokens: list[int] = []
        positions: list[int] = []
        segments: list[Segment] = []
        logit_rows: list[int] = []
        for seq, ids in work:
            tokens.extend(ids)
            positions.extend(range(seq.cached, seq.cached + len(ids)))
            segments.append(Segment(seq.cache, seq.cached, len(ids)))
            if id(seq) in sampled:
                logit_rows.append(len(tokens) - 1)
        logits = self.model.forward(
            torch.tensor(tokens, device=self.device),
            torch.tensor(positions, device=self.device),
            segments,
            torch.tensor(logit_rows, dtype=torch.long, device=self.device),
        )
        for seq, ids in work:
            seq.cached += len(ids)
        return logits


class HybridRunner(_ModelRunner):
    """Owns the hybrid model; every row of a step in one forward, each row's attention layers
    over its paged KV and its GDN layers continuing its recurrent-state slot."""

    def _eager(self, work, sampled):
        tokens: list[int] = []
        states, lengths = [], []
        for seq, ids in work:
            views = [LayerKv(seq.cache, layer, seq.cached)
                     for layer in range(len(self.model.attention_layers))]
            states.append(self.model.bind_state(views, seq.state.layers, seq.cached))
            tokens.extend(ids)
            lengths.append(len(ids))
        rows = [i for i, (seq, _) in enumerate(work) if id(seq) in sampled]
        logits = self.model.forward_rows(torch.tensor(tokens, device=self.device), states,
                                         lengths, rows)
        for seq, ids in work:
            seq.cached += len(ids)
        return logits


def make_runner(model: LlamaModel | Qwen35Model,
                graphs: DecodeGraphs | None = None) -> Runner | HybridRunner:
    family = HybridRunner if isinstance(model, Qwen35Model) else Runner
    return family(model, graphs)
