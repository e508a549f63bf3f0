"""The runners: turn a scheduled `Batch` into model forwards and return the sampled rows' logits.

Each family's runner (`family_runners`: `Runner` for the llama family, `HybridRunner` for the
Qwen3.5 hybrids) runs every row of a step through one eager forward; its GDN layers continue
each row's recurrent-state slot in place (the same slot rows the graph step addresses by index:
nothing to hand over between them). Where `DecodeGraphs` was built (CUDA, bf16) both send a
step's decode rows through it (static buffers, Triton kernels, CUDA graphs), with them each
prompt whose last token is all it has left (a decode row fed that token; beside verify rows
a verify row without drafts), short prompt chunks
through the graphs' prompt step (one replay each, `DecodeGraphs.prefill`), and the step's other
prompt chunks, if any, through the eager forward after them: decode rows keep the graph's rate
while a prompt is prefilled. On the CPU the compiled llama step takes short prompt chunks too,
as rows at consecutive positions (`ragged_rows`).
"""
from __future__ import annotations

import logging

import torch

from ..host_copy import to_device
from . import prompt_logprobs
from .decode_graphs import DecodeGraphs, prompt_rows
from .ragged_rows import ragged_forward
from .scheduler import Batch, Chunk
from .sequence import Sequence


log = logging.getLogger("ninfer.engine")


def _work(batch: Batch) -> list[tuple[Sequence, list[int], bool]]:
    """(sequence, tokens to compute, verify row?) in row order: each decode row's last token
    and its drafts, then the prompt chunks."""
    return [(seq, [seq.output[-1], *batch.drafts_of(i)], bool(batch.drafts_of(i)))
            for i, seq in enumerate(batch.decode)] + _chunk_work(batch.chunks)


def _chunk_work(chunks: list[Chunk]) -> list[tuple[Sequence, list[int], bool]]:
    return [(c.seq, list(c.seq.prompt[c.seq.cached: c.seq.cached + c.tokens]), False)
            for c in chunks]


def _graph_tails(batch: Batch, sampled: set[int]) -> list[Sequence]:
    """The sequences of `batch`'s one-token chunks that end their prompt and sample their first
    token (a hybrid prompt's last token runs one step after the rest: `SequenceMemory.
    chunk_tokens`): the decode graph computes such a token as a decode row (its input the
    prompt's last token, `models.attention.input_token`; beside verify rows, a verify row
    without drafts), not the eager forward (~20 ms for one token on the H200's 8-layer 35B-A3B
    shape, against a graph step's 1-3 ms). Not a row whose
    prompt is scored (it wants the eager logits of every position) or that carries media."""
    return [c.seq for c in batch.chunks
            if c.tokens == 1 and c.seq.cached + 1 == len(c.seq.prompt) and id(c.seq) in sampled
            and not prompt_logprobs.scores_prompt(c.seq) and c.seq.request.media is None]


class _ModelRunner:
    """The model of one family and, on CUDA, its static decode path.

    `forward(batch)` returns the logits of the sampled rows in row order: one row each, or
    1 + k for a decode row with k drafts (a verify row: the target's logits after each of its
    tokens). After a step with verify rows, `keep(batch, kept)` settles each decode row: it
    keeps its first `kept[i]` tokens (K/V and recurrent state after them) and `cached` counts
    them."""

    def __init__(self, model, graphs: DecodeGraphs | None = None, hidden_sink=None,
                 vision=None) -> None:
        self.model = model
        self.device = model.device
        self.graphs = graphs
        self.vision = vision  # `vision.tower.VisionTower` under `--vision` (hybrid family)
        # `hidden_sink(seq, position, hidden)`: each row's final-normed hiddens, from the
        # eager forward or a graph step that keeps them (`--spec mtp` drafts from them)
        self.hidden_sink = hidden_sink
        # `--spec mtp`'s acceptance and next drafts on the device (`verify_chain`), or None
        self.chain = None
        self._verified_by_graph = False

    def forward(self, batch: Batch) -> torch.Tensor:
        sampled = set(map(id, batch.sampled))
        prompted = self._prompted(batch)
        if not prompted:
            return self._forward(batch, sampled)
        # each short chunk through the prompt step's graph, the rest of the step as before
        taken = set(map(id, (c.seq for c in prompted)))
        rest = Batch(batch.decode, [c for c in batch.chunks if id(c.seq) not in taken],
                     [s for s in batch.sampled if id(s) not in taken], batch.drafts)
        out = self._forward(rest, sampled - taken) if rest.decode or rest.chunks else None
        after = self._prefill(prompted)
        # the rest's logit rows by sequence: 1 + k for a decode row with k drafts, else 1
        decode = {id(s): i for i, s in enumerate(rest.decode)}
        spans, at = {}, 0
        for s in rest.sampled:
            n = 1 + len(rest.drafts_of(decode[id(s)])) if id(s) in decode else 1
            spans[id(s)], at = (at, at + n), at + n
        rows = [after[id(s)] if id(s) in after else out[slice(*spans[id(s)])].float()
                for s in batch.sampled]
        return torch.cat(rows) if rows else next(iter(after.values()))[:0]

    def _prompted(self, batch: Batch) -> list[Chunk]:
        """The step's prompt chunks the graphs' prompt step takes (`DecodeGraphs.prefills`):
        more than one token (a prompt's last token alone is a decode row, `_graph_tails`), no
        media or scored prompt; with a hidden sink, where the prompt step keeps hiddens."""
        graphs = self.graphs
        if graphs is None or graphs.prompt is None or (self.hidden_sink is not None
                                                       and graphs.prompt.hidden is None):
            return []
        return [c for c in batch.chunks
                if c.tokens > 1 and c.seq.request.media is None
                and not prompt_logprobs.scores_prompt(c.seq) and graphs.prefills(c.seq, c.tokens)]

    def _prefill(self, chunks: list[Chunk]) -> dict[int, torch.Tensor]:
        """The chunks through the prompt step, those of one padded row count together (at
        most its `max_batch` a replay): each one's logits [1, V] by its sequence's id; the
        hidden sink gets each of their positions' hiddens, as from the eager forward."""
        graphs, sink = self.graphs, self.hidden_sink
        groups: dict[int, list[Chunk]] = {}
        for c in chunks:
            groups.setdefault(prompt_rows(c.tokens, graphs.prompt.rows), []).append(c)
        out = {}
        for rows, group in groups.items():
            for first in range(0, len(group), graphs.prompt.max_batch):
                part = group[first: first + graphs.prompt.max_batch]
                starts = [c.seq.cached for c in part]
                logits = graphs.prefill([c.seq for c in part],
                                        [ids for _, ids, _ in _chunk_work(part)])
                for b, (c, start) in enumerate(zip(part, starts)):
                    out[id(c.seq)] = logits[b: b + 1]
                    if sink is not None:  # the next replay rewrites the buffer: a copy
                        at = b * rows
                        sink(c.seq, start, graphs.prompt.hidden[at: at + c.tokens].clone())
        return out

    def _forward(self, batch: Batch, sampled: set[int]) -> torch.Tensor:
        graphs, drafts = self.graphs, [batch.drafts_of(i) for i in range(len(batch.decode))]
        longest = max(map(len, drafts), default=0)
        self._verified_by_graph = False
        sink = self.hidden_sink
        ragged = graphs is not None and getattr(graphs.decoder, "ragged", False)
        if ragged and not longest and sink is None and batch.chunks:
            logits = ragged_forward(graphs, batch, sampled,
                                    lambda chunks: self._eager(_chunk_work(chunks), sampled))
            if logits is not None:
                return logits
        tails = _graph_tails(batch, sampled) if graphs is not None and not (
            longest and ragged) else []
        if longest and tails:  # a verify row each, where its lease covers the padding
            tails = [seq for seq in tails if graphs.pads([seq])]
        rows, drafts = batch.decode + tails, drafts + [[] for _ in tails]  # the graph's rows
        if (graphs is None or not rows or not graphs.accepts(rows) or not graphs.verifies(drafts)
                or (sink is not None and getattr(graphs.decoder, "hidden", None) is None)
                or (longest and not ragged and not graphs.pads(batch.decode))):
            return self._eager(_work(batch), sampled)
        if longest and ragged:  # the CPU step: no padding
            logits = graphs.verify_rows(rows, drafts)
            self._verified_by_graph = True
        elif not longest:
            logits = graphs.forward(rows)
            if sink is not None:  # `forward` advanced `cached` past each row's token
                for i, seq in enumerate(rows):
                    sink(seq, seq.cached - 1, graphs.decoder.hidden[i: i + 1])
        else:  # every row verifies max_q tokens (one graph a batch size, captured at load);
            # padding drafts are never accepted (`keep`); a prompt's last token is a row
            # without drafts, settled here (the chain declines such a step)
            q = graphs.decoder.max_q
            out = graphs.verify(rows, [d + [0] * (q - 1 - len(d)) for d in drafts])
            # rows all of max_q tokens are the output as it lies (no copy of [B·q, V] floats)
            logits = (out.view(-1, out.shape[-1]) if all(len(d) == q - 1 for d in drafts)
                      else torch.cat([out[i, : 1 + len(d)] for i, d in enumerate(drafts)]))
            self._verified_by_graph = True
            # (a chained step's hiddens go to the drafter through the chain)
            if not self._chain(rows, drafts, out) and sink is not None:
                # `cached` waits for `keep`: the row's first position
                for i, (seq, d) in enumerate(zip(rows, drafts)):
                    sink(seq, seq.cached, graphs.decoder.hidden[i * q: i * q + 1 + len(d)])
            graphs.keep(tails, [1] * len(tails), first=len(batch.decode))
        tailed = set(map(id, tails))
        chunks = [c for c in batch.chunks if id(c.seq) not in tailed]
        if chunks:
            logits = torch.cat([logits, self._eager(_chunk_work(chunks), sampled).to(logits.dtype)])
        if not tails:  # decode rows, then the chunks': `batch.sampled`'s order
            return logits
        # each row's logit rows (1 + k for a verify row), taken in `batch.sampled`'s order
        spans, at = {}, 0
        for seq, n in zip(rows + [c.seq for c in chunks if id(c.seq) in sampled],
                          [1 + len(d) for d in drafts] + [1] * len(chunks)):
            spans[id(seq)], at = range(at, at + n), at + n
        order = [i for seq in batch.sampled for i in spans[id(seq)]]
        return logits.index_select(0, to_device(order, logits.device, torch.long))

    def continues(self, batch: Batch) -> bool:
        """This pure-decode batch's next step can replay its captured graph on the device's
        picks of this one (the engine's lookahead step): nothing in it reads the host's copy."""
        graphs = self.graphs
        return (graphs is not None and not batch.chunks and not any(batch.drafts)
                and (self.hidden_sink is None
                     or getattr(graphs.decoder, "hidden", None) is not None)
                and graphs.accepts(batch.decode) and graphs.ready(batch.decode))

    def forward_from(self, batch: Batch, tokens: torch.Tensor) -> torch.Tensor:
        """The logits of the pure-decode `batch` whose rows' input tokens are `tokens` (the
        last step's device picks, in row order); `continues(batch)` said it can. A drafter
        that reads hiddens gets them as from `forward` (its input token not yet on the host)."""
        logits = self.graphs.forward_from(batch.decode, tokens)
        if self.hidden_sink is not None:
            for i, seq in enumerate(batch.decode):
                self.hidden_sink(seq, seq.cached - 1, self.graphs.decoder.hidden[i: i + 1])
        return logits

    def _chain(self, rows: list[Sequence], drafts: list[list[int]], logits: torch.Tensor) -> bool:
        """The verify step's device tail (`verify_chain`) queued for `rows` (`logits`: the
        step's output), where it takes them; a chain that fails is logged and the host accepts
        from then on."""
        chain = self.chain
        if chain is None or not chain.takes(rows, drafts):
            return False
        try:
            chain.launch(rows, drafts, logits)
        except Exception:  # the host path is exact from here (the trail is as the step left it)
            log.exception("--spec mtp: the verify chain failed; accepting on the host from "
                          "now on")
            self.chain = None
            return False
        return True

    def forward_ahead(self, batch: Batch) -> torch.Tensor:
        """The next verify round of `batch`'s rows (every one chained last step, none settled
        yet: `ChainAhead.holds`) from the chain's device outputs; its logits as `forward`'s."""
        out = self.chain.launch_ahead(batch.decode)
        return out.view(-1, out.shape[-1])

    def accepted(self, seqs: list[Sequence]) -> list[list[int]] | None:
        """The tokens the verify rows `seqs` of the step being finished emit, where the device
        accepted them (`verify_chain`); None: the host accepts (`acceptance.accept`)."""
        chain = self.chain
        return chain.accepted(seqs) if chain is not None and chain.owns(seqs) else None

    def keep(self, batch: Batch, kept: list[int]) -> None:
        """After a step with verify rows: decode row i keeps its first `kept[i]` tokens."""
        chain = self.chain
        if chain is not None and batch.decode and chain.owns(batch.decode):
            chain.settle(batch.decode, kept)
            return
        if self._verified_by_graph:
            self.graphs.keep(batch.decode, kept)
            return
        for i, (seq, n) in enumerate(zip(batch.decode, kept)):
            q_len = 1 + len(batch.drafts_of(i))
            if q_len > 1:  # the eager forward counted every token of the row
                seq.cached -= q_len - n
                self._rollback(seq, n, q_len)

    def idle(self) -> None:
        """Between steps while nothing runs (a tensor-parallel `parallel.lockstep.Leader`
        sends its heartbeat here)."""

    def forget(self, seq: Sequence) -> None:
        """`seq` ended (a `Leader` tells the other ranks)."""

    def close(self) -> None:
        """The engine stopped (a `Leader` releases the other ranks)."""

    def _rollback(self, seq: Sequence, kept: int, q_len: int) -> None:
        """The eager forward's recurrent state of a verify row after its first `kept` tokens."""

    def _eager(self, work: list[tuple[Sequence, list[int], bool]],
               sampled: set[int]) -> torch.Tensor:
        """Logits of the rows of `work` whose sequence is in `sampled` (ids), in row order: a
        verify row's every position, another row's last."""
        raise NotImplementedError
