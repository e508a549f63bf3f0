"""Pure-decode steps over static buffers, replayed as CUDA graphs.

A pure-decode step (one new token for each of B running sequences, no prefill chunk) reads its
inputs from fixed device buffers: token, position, KV slot and length per row, and the rows'
page tables. Every layer writes its K/V into the shared paged pool in place and attends with the
Triton paged-attention kernel (`kernels.paged_attention`, every KV dtype dequantized inside it), so
the whole step is one fixed sequence of kernels: `DecodeGraphs` captures it once per (batch
size, context bucket) and replays it, which removes the Python and launch cost of ~10 kernels
per layer. The family's step lives with its forward in `models`: `llama_step.StaticDecoder`
(off CUDA it runs eagerly through the kernels' torch references, which is how the CPU tests
check it against the model's forward) and `qwen3_5_engine_step.EngineHybridDecoder`;
`families.build_decode_graphs` picks the one the model's family has.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace

import torch

from ..kv import KV_DTYPES
from ..kv.slots import StateSlot
from ..models.llama_prompt_step import LlamaPrompt
from ..models.llama_step import StaticDecoder
from ..models.qwen3_5_engine_step import EngineHybridDecoder, EngineHybridPrompt
from .graph_capture import record_graph
from .sequence import Sequence

log = logging.getLogger("ninfer.engine")

GRAPH_CODECS = KV_DTYPES  # the KV layouts the paged-attention kernel reads in place: all
MIN_BUCKET = 1024  # smallest context bucket (tokens); buckets double up to the max context
# the logits the start-up graphs past the first bucket may keep: they live in the
# `--vram-headroom-mib` (default 1024), which the KV sizing leaves (a bucket's at batch 1..8 are
# ~34 MiB for a 248K vocabulary, ~170 with 3-draft verify rows)
START_LOGITS_BYTES = 256 * 2**20
# the padded lengths of a short prompt chunk's step (`prefill`): an agent's turn over its
# cached prefix, the tail of a longer prompt; past the last, the eager forward's fixed cost is
# spread over enough tokens
PROMPT_ROWS = (16, 32, 64)


class DecodeGraphs:
    """Runs pure-decode batches through a static decoder (`load` → `step`), as CUDA graphs
    when `capture`.

    One graph per (batch size, context bucket), captured at load for every bucket up to the
    max context (`capture_at_start`); one dropped since (below) is captured again the first
    time its shape runs, on the step's real inputs. The warm-up before a capture runs the step
    once, which advances the rows' recurrent state in their slots: `_record` saves that state
    first and puts it back (`save_state`), so the replay computes the step exactly once; its
    K/V writes land where the replay's do. Graphs read the pool tensors they were captured
    with; when an elastic pool grows into new tensors, every graph is dropped and recaptured
    on demand.

    With a `prompt` step (the family's: `EngineHybridPrompt`, `llama_prompt_step.LlamaPrompt`),
    a step's short prompt chunks run as one more graph (`prefill`), one per (chunks, padded
    row count of `PROMPT_ROWS`), whatever their contexts: the host's launch work of an eager
    forward (an agent turn's ~18 ms on the H200's 8-layer 35B-A3B shape, for ~5 ms of
    kernels) becomes one replay.
    """

    def __init__(self, decoder: StaticDecoder | EngineHybridDecoder, capture: bool,
                 prompt: EngineHybridPrompt | LlamaPrompt | None = None) -> None:
        self.decoder = decoder
        self.capture = capture
        # the short-prompt step (`prefill`), where the family has one and the model's layers
        # run it without a host sync
        self.prompt = prompt
        self._graphs: dict[tuple[int, ...], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._prompt_graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._bound_k = (decoder.storage.k, getattr(decoder, "generation", 0))
        self._q_len = 1  # tokens a row in the last step
        self._replayed: torch.cuda.CUDAGraph | None = None  # the last step's (`last_replayed`)
        # the context buckets `capture_at_start` captured: the MTP round and the verify chain
        # capture theirs at load for the same ones
        self.start_buckets: tuple[int, ...] = ()

    def accepts(self, seqs: list[Sequence]) -> bool:
        return 0 < len(seqs) <= self.decoder.max_batch

    def forward(self, seqs: list[Sequence]) -> torch.Tensor:
        """Logits [len(seqs), V] for each sequence's next token; advances `cached`."""
        logits = self._run(seqs, None, 1)
        for seq in seqs:
            seq.cached += 1
        return logits

    def forward_from(self, seqs: list[Sequence], tokens: torch.Tensor) -> torch.Tensor:
        """`forward` whose rows' input tokens are `tokens` (device [len(seqs)]: the last step's
        picks, not yet read by the host) instead of each sequence's last output."""
        logits = self._run(seqs, None, 1, lambda: self.decoder.feed(tokens))
        for seq in seqs:
            seq.cached += 1
        return logits

    def ready(self, seqs: list[Sequence]) -> bool:
        """The decode graph of these rows' next step is captured and current: replaying it
        needs no capture (which must not run behind a step still in flight)."""
        d = self.decoder
        key = (len(seqs), context_bucket(max(seq.cached + 1 for seq in seqs), d.max_context), 1,
               getattr(d, "graph_form", 0))
        return not self.capture or (key in self._graphs and d.storage.k is self._bound_k[0]
                                    and getattr(d, "generation", 0) == self._bound_k[1])

    def verify(self, seqs: list[Sequence], drafts: list[list[int]]) -> torch.Tensor:
        """Logits [len(seqs), 1 + k, V] of each sequence's last token and its k drafts (the
        same k for every row, 1 + k ≤ the decoder's `max_q`): the target's token after each.
        Leaves `cached` alone: `keep` settles each row once its accepted length is known."""
        q_len = 1 + len(drafts[0])
        assert all(len(d) == q_len - 1 for d in drafts) and q_len <= self.decoder.max_q
        return self._run(seqs, drafts, q_len).view(len(seqs), q_len, -1)

    def verify_fed(self, seqs: list[Sequence], q_len: int, feed: Callable[[], None],
                   ahead: int) -> torch.Tensor:
        """`verify` of rows whose tokens and positions `feed()` writes into the loaded buffers
        on the device (a verify chain's next round: `verify_chain`), each row up to `ahead`
        positions past its `cached` (the round in flight the host has not settled)."""
        return self._run(seqs, [[0] * (q_len - 1)] * len(seqs), q_len, feed, ahead).view(
            len(seqs), q_len, -1)

    def verifies(self, drafts: list[list[int]]) -> bool:
        """Whether a step of rows with these drafts runs here: each row within `max_q`, and
        for a decoder whose rows are positions (`ragged`: the CPU step) all within its rows."""
        d = self.decoder
        if 1 + max(map(len, drafts), default=0) > d.max_q:
            return False
        return not getattr(d, "ragged", False) or sum(map(len, drafts)) + len(drafts) <= d.max_rows

    def draft_cap(self, batch: int) -> int | None:
        """The most drafts a row of a `batch`-row step may carry for a `ragged` decoder to
        verify the step (each row an equal share of its rows); None: no cap (elsewhere a step
        the graphs cannot verify runs eagerly, at its own measured cost)."""
        d = self.decoder
        if not getattr(d, "ragged", False) or batch > d.max_batch:
            return None
        return min(d.max_q, d.max_rows // batch) - 1

    def verify_rows(self, seqs: list[Sequence], drafts: list[list[int]]) -> torch.Tensor:
        """`verify` for a `ragged` decoder, each row as long as its drafts (none: a decode row):
        logits [Σ (1 + k_i), V] in row order. Uncaptured: leaves `cached` to `keep`."""
        d = self.decoder
        d.load(seqs, drafts)
        self._q_len = 1 + max(map(len, drafts))
        return d.step(sum(map(len, drafts)) + len(drafts))

    def pads(self, seqs: list[Sequence]) -> bool:
        """Whether `verify` may pad these rows to `max_q` tokens: each lease covers the
        padding's positions (past it, a page table entry is stale: another sequence's page)."""
        return all(seq.cache.capacity >= seq.cached + self.decoder.max_q for seq in seqs)

    def keep(self, seqs: list[Sequence], kept: list[int], first: int = 0) -> None:
        """After `verify`: row `first` + i, `seqs[i]`, keeps its first `kept[i]` tokens (1 ≤
        kept ≤ 1 + k, the last sampled token included): its GDN state goes back to the state
        after them, its K/V past them is left to be overwritten, and `cached` advances by
        `kept`."""
        back = [(row, n) for row, n in enumerate(kept, first) if n < self._q_len]
        if back:
            self.decoder.keep_rows(back)
        for seq, n in zip(seqs, kept):
            seq.cached += n

    def prefills(self, seq: Sequence, tokens: int) -> bool:
        """Whether `prefill` takes `tokens` of `seq`'s prompt: a prompt step is built, the
        chunk fits its rows, and `seq`'s lease covers the padded rows' positions."""
        p = self.prompt
        return (p is not None and 0 < tokens <= p.rows
                and seq.cache.capacity >= seq.cached + prompt_rows(tokens, p.rows))

    def prefill(self, seqs: list[Sequence], tokens: list[list[int]]) -> torch.Tensor:
        """Logits [len(seqs), V] after `tokens[b]`, sequence b's prompt from its `cached` on
        (`prefills` said so for each), through the prompt step: at most its `max_batch`
        chunks, each padded to the row count of the longest (one graph per (chunks, row
        count)); advances each `cached`."""
        p, batch = self.prompt, len(seqs)
        rows = prompt_rows(max(map(len, tokens)), p.rows)
        p.load(seqs, tokens, rows)
        if not self.capture:
            logits = p.step(batch, rows)
        else:
            self._check_bound()
            key = (batch, rows)
            if key not in self._prompt_graphs:  # the warm-up leaves the buffers as loaded
                self._prompt_graphs[key] = self._record(lambda: p.step(batch, rows),
                                                        p.save_state(batch))
                log.info("captured the prompt-step CUDA graph for %d chunk(s) of %d rows",
                         batch, rows)
            graph, logits = self._prompt_graphs[key]
            graph.replay()
            logits = logits.clone()  # the next step of this shape replays into it
        for seq, ids in zip(seqs, tokens):
            seq.cached += len(ids)
        return logits

    def _check_bound(self) -> None:
        """Drop every graph if the pool grew into new tensors, or lending moved the expert
        slots, since they were captured."""
        d = self.decoder
        bound = (d.storage.k, getattr(d, "generation", 0))
        if bound[0] is not self._bound_k[0] or bound[1] != self._bound_k[1]:
            self._graphs.clear()
            self._prompt_graphs.clear()
            self._replayed = None
            self._bound_k = bound
            # a fresh private pool: capturing into the one whose graphs were just freed trips
            # an internal assert of the caching allocator (torch 2.11, seen on the H200)
            self._pool = torch.cuda.graph_pool_handle()

    def _run(self, seqs, drafts, q_len: int, feed: Callable[[], None] | None = None,
             ahead: int = 0) -> torch.Tensor:
        """The step of `seqs` loaded (then `feed()`: inputs from the device), replayed;
        `ahead`: positions the rows may be past their `cached` (the context bucket's)."""
        d = self.decoder

        def load():
            d.load(seqs, drafts)
            if feed is not None:
                feed()
        load()
        batch, self._q_len = len(seqs), q_len
        bucket = context_bucket(max(seq.cached + ahead + q_len for seq in seqs), d.max_context)
        after = getattr(d, "after_launch", lambda: None)  # host work while the step runs
        if not self.capture:
            logits = d.step(batch, bucket, q_len)
            after()
            return logits
        self._check_bound()
        key = (batch, bucket, q_len, getattr(d, "graph_form", 0))  # (a form: the step's ops)
        if key not in self._graphs:
            self._graphs[key] = self._record(lambda: d.step(batch, bucket, q_len),
                                             d.save_state(batch))
            log.info("captured the decode CUDA graph for batch %d, %d token(s) a row, "
                     "context ≤ %d%s", batch, q_len, bucket,
                     ", without the expert hand-off" if key[3] else "")
            load()  # the warm-up moved the positions in the buffers
        graph, logits = self._graphs[key]
        graph.replay()
        self._replayed = graph
        after()
        return logits

    def _record(self, step: Callable[[], torch.Tensor],
                saved: Callable[[], None]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """`step` captured on its loaded inputs, after one warm-up run (compiles its kernels)
        whose state changes `saved()` undoes."""
        graph, logits = record_graph(step, self._pool)
        saved()
        return graph, logits

    def last_replayed(self) -> torch.cuda.CUDAGraph | None:
        """The decode or verify graph a step replayed last (a benchmark replays it alone),
        None before any step replayed one (the start-up captures do not count)."""
        return self._replayed

    def capture_at_start(self) -> None:
        """Capture the context buckets up to the decoder's max context for every batch size
        now (decode, and verify rows of `max_q` tokens where the decoder has them), on scratch
        sequences in state slots 0.. (nobody holds a slot yet; a slot is zeroed when acquired)
        all on one pool page, which goes back after (their K/V writes are garbage nobody
        reads, and an elastic pool does not grow for them). A step reaches a bucket through
        `ahead` alone, its rows staying at the page's first positions. So traffic replays
        graphs instead of compiling kernels and capturing: a capture in traffic holds every
        stream (~5 s at batch 8 on the H200 before the kernels warmed up at load; with the
        first bucket alone captured, the H100's 8-layer 35B-A3B burst after the first
        contexts past 1K waited 21 ms in the queue, median, against 7 a round later). Each
        graph keeps its logits, outside the KV sizing: past the first bucket, buckets are
        captured while their logits fit `START_LOGITS_BYTES`; larger ones on first use."""
        cache = self.decoder.storage.new_cache()
        try:
            if not cache.reserve(self.decoder.max_q):
                return
            scratch = [SimpleNamespace(cache=cache, cached=0, output=[0],
                                       state=StateSlot(i, []), rope_delta=0)
                       for i in range(self.decoder.max_batch)]
            verify = self.decoder.max_q - 1  # drafts a verify row carries (0: decode only)

            def capture(bucket: int) -> int:
                """The bucket's graphs at every batch size; the bytes of logits they keep."""
                held = 0
                for batch in range(1, len(scratch) + 1):
                    rows = scratch[:batch]
                    outs = [self._run(rows, None, 1, ahead=bucket - 1)]
                    if verify:
                        outs.append(self._run(rows, [[0] * verify] * batch, 1 + verify,
                                              ahead=bucket - 1 - verify))
                    held += sum(out.numel() * out.element_size() for out in outs)
                return held
            first, *rest = context_buckets(self.decoder.max_context)
            each = capture(first)
            rest = rest[: START_LOGITS_BYTES // max(each, 1)]
            for bucket in rest:
                capture(bucket)
            self.start_buckets = (first, *rest)
            self._replayed = None  # a scratch step's, not one a benchmark times
            if verify:  # the host-accepted rollback's kernels (conv, SSM) compile now, not in
                # traffic (1-2 ms each on the H100's first rollback); keeping all moves nothing
                self.decoder.keep_rows([(0, self.decoder.max_q)])
            if self.prompt is not None and cache.reserve(self.prompt.rows):
                for rows in PROMPT_ROWS:  # one chunk; more in one step capture when they come
                    if rows <= self.prompt.rows:
                        self.prefill(scratch[:1], [[0] * rows])
                        scratch[0].cached = 0
        finally:
            cache.release()


def prompt_rows(tokens: int, most: int) -> int:
    """The padded row count of a `tokens`-token prompt chunk: the least of `PROMPT_ROWS` that
    holds it (one captured graph each), at most `most`."""
    return min(next((r for r in PROMPT_ROWS if r >= tokens), most), most)


def context_buckets(max_context: int) -> list[int]:
    """Every bucket a step of at most `max_context` tokens a row falls in (`context_bucket`)."""
    out, length = [], 1
    while not out or out[-1] < max_context:
        out.append(context_bucket(length, max_context))
        length = out[-1] + 1
    return out


def context_bucket(length: int, max_context: int) -> int:
    """The graph bucket of a step whose longest row is `length` tokens: powers of two from
    `MIN_BUCKET`, capped at the pool's context (or the length itself, if longer)."""
    bucket = MIN_BUCKET
    while bucket < length:
        bucket *= 2
    return min(bucket, max(max_context, length))
