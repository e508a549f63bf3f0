"""The llama family's CPU decode step: one call into compiled C per step, weights as stored Q8.

`CpuDecoder` has `StaticDecoder`'s interface (`load` the rows into fixed buffers, then `step`),
so `step.decode_graphs.DecodeGraphs` drives it without capture; a `--spec` verify row is 1 + k
of its rows at consecutive positions (`DecodeGraphs.verify_rows`), and so is a short prompt
chunk (`step.ragged_rows`). A step is one call of
`kernels/cpu_decode.c`: every layer (norms, Q8 GEMVs, RoPE, the K/V written into and read from
the paged pool in place, attention, SwiGLU) and the head run inside one OpenMP region, with no
Python between layers (the eager step spent ~14 ms of a 32 ms SmolLM2-135M step on ~1,500 small
ops and their dispatch, bench/profile_cpu_decode.py).

The projections and the (tied) head multiply by the artifact's Q8 groups as stored (int8
codes, an fp16 scale per 32, rows tiled by 4 at load so a tile streams sequentially): ~1.06
bytes a weight instead of fp32's 4, and the same values the eager fp32 path multiplies by (it
dequantizes them exactly), so only the summation order differs. `activations` "int16" / "int8"
(`--cpu-activations`) quantize each GEMV input per 32 for integer dot products instead.
`cpu_decoder` builds one where the artifact stores every projection that way and the shapes
fit the C file's vector tiling, else returns why not (the engine keeps the eager step).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels import cpu_decode as kernel
from ..kv import KvStorage, PageTables
from ..codecs.kv import PlainCodec
from .attention import input_token
from .llama import LlamaModel
from .packed import load_packed

Q8 = "q8_g32_fp16"


TILE = 4  # weight rows a tile of the C step's GEMV (cpu_gemv.h)


@dataclass(frozen=True)
class Q8Matrix:
    """A `[N, K]` weight as int8 codes and fp16 scales, one per 32 codes: row-major (codes
    `[N, K]`, scales `[N, K / 32]`) or, `tiled`, as the C step reads it: each 4 rows' groups
    interleaved (codes `[N / 4, K / 32, 4, 32]`, scales `[N / 4, K / 32, 4]`) so a tile is one
    sequential stream (`tile_rows`)."""

    codes: torch.Tensor
    scales: torch.Tensor
    tiled: bool = False

    def row_major(self) -> Q8Matrix:
        if not self.tiled:
            return self
        t, g = self.codes.shape[:2]
        return Q8Matrix(self.codes.transpose(1, 2).reshape(t * TILE, g * 32),
                        self.scales.transpose(1, 2).reshape(t * TILE, g))

    def tile_rows(self) -> Q8Matrix:
        """The tiled copy (N % 4 == 0)."""
        if self.tiled:
            return self
        n, k = self.codes.shape
        codes = self.codes.view(n // TILE, TILE, k // 32, 32).transpose(1, 2).contiguous()
        scales = self.scales.view(n // TILE, TILE, k // 32).transpose(1, 2).contiguous()
        return Q8Matrix(codes, scales, tiled=True)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight it holds, row-major (tests)."""
        m = self.row_major()
        n = m.codes.shape[0]
        return (m.codes.float().view(n, -1, 32) * m.scales.float()[:, :, None]).view(n, -1)


def stored_q8(weights, names: list[str], shapes: list[tuple[int, int]]) -> Q8Matrix | None:
    """The row concatenation of `names` (all of K columns) as stored, when every part is whole
    rows of Q8 objects and K is whole groups; None otherwise."""
    blocks = []
    for name, shape in zip(names, shapes):
        packed = load_packed(weights, name, shape, "cpu")
        if packed is None or any(b.fmt != Q8 for b in packed.blocks):
            return None
        blocks += packed.blocks
    k = shapes[0][1]
    if k % 32:
        return None
    # the stored rows' padding (K to a multiple of 128) is left behind: 10 % fewer bytes a
    # step for SmolLM2's K = 576, whose rows the GEMV streams whole
    n = sum(b.rows for b in blocks)
    codes, scales = torch.empty(n, k, dtype=torch.int8), torch.empty(n, k // 32, dtype=torch.half)
    at = 0
    for b in blocks:  # copy_ into place: torch.cat of strided int8 took ~30x longer
        codes[at: at + b.rows].copy_(b.planes[0].view(torch.int8)[:, :k])
        scales[at: at + b.rows].copy_(b.planes[2][:, : k // 32])
        at += b.rows
    return Q8Matrix(codes, scales)


class CpuDecoder:
    """One decode step of a `LlamaModel` over fixed buffers, by the compiled C step."""

    # a verify row of 1 + k tokens is 1 + k rows of the C step at consecutive positions (no
    # padding: `DecodeGraphs.verify_rows`), each row its own slot and a copy of the page table
    ragged = True

    def __init__(self, model: LlamaModel, storage: KvStorage, max_batch: int, max_context: int,
                 layers: list[dict[str, Q8Matrix]], head: Q8Matrix,
                 activations: str = "fp32", max_q: int = 1) -> None:
        self.model, self.storage = model, storage
        self.max_batch, self.max_context, self.max_q = max_batch, max_context, max_q
        # the step's rows, as far as the GEMV's tiles go: a batch of verify rows, or a short
        # prompt chunk's tokens (`step.ragged_rows`: 2.8x the eager forward's
        # speed at 8 tokens)
        self.max_rows = kernel.MAX_ROWS
        self._lib = kernel.decode_step_library()
        c = model.cfg
        H, I, D = c.hidden_size, c.intermediate_size, c.head_dim
        nq, nkv = c.num_heads, c.num_kv_heads
        page = storage.page_tokens
        R = self.max_rows
        self.meta = torch.zeros(3, R, dtype=torch.long)  # token, position, slot
        self.table = torch.zeros(R, -(-max_context // page), dtype=torch.long)
        self.tables = PageTables(self.table)
        self._keep = (layers, head)  # the pointers below point into these
        dims = dict(layers=c.num_layers, hidden=H, inter=I, nq=nq, nkv=nkv, head_dim=D,
                    vocab=c.vocab_size, page=page, table_w=self.table.shape[1],
                    scores_w=max_context, activations=kernel.ACTIVATIONS.index(activations))
        self.activations = activations
        self.dims = torch.tensor([dims[k] for k in kernel.DIMS], dtype=torch.long)
        pointers = []
        for layer, weights in zip(model.layers, layers):
            pointers += [layer.input_norm.data_ptr(), layer.post_attention_norm.data_ptr()]
            for name in ("qkv", "output", "gate_up", "down"):
                pointers += [weights[name].codes.data_ptr(), weights[name].scales.data_ptr()]
        self.layer_pointers = torch.tensor(pointers, dtype=torch.long)
        self.head = head
        B = R
        self.x = torch.zeros(B, H)
        # per thread (`_thread_buffers`): a [B, H] normed copy, the quantized GEMV input (int8
        # or int16 codes and fp32 scales of [B, max(H, I)]), and the scores of the one row's
        # head it attends at a time [max_context]
        self.h = torch.zeros(0)
        self.widest = max(H, I)
        self.xq, self.xd = torch.zeros(0, dtype=torch.int8), torch.zeros(0)
        self.scores = torch.zeros(0)
        self.qkv = torch.zeros(B, (nq + 2 * nkv) * D)
        self.attn = torch.zeros(B, nq * D)
        self.act = torch.zeros(B, I)
        self.logits = torch.zeros(B, c.vocab_size)
        self._pools: tuple | None = None

    def load(self, seqs: list, drafts: list[list[int]] | None = None) -> None:
        """Copy the rows' next token, position, slot and page table into the buffers: each
        sequence's last token, then its drafts (if any) at the positions after it."""
        page = self.storage.page_tokens
        rows, caches = [], []
        for i, seq in enumerate(seqs):
            tokens = [input_token(seq), *(drafts[i] if drafts else ())]
            if seq.cached + len(tokens) > self.max_context:  # the C step's buffers end there
                raise ValueError(f"position {seq.cached + len(tokens) - 1} is past the decode "
                                 f"step's context {self.max_context}")
            pages = seq.cache.pages
            for pos, token in enumerate(tokens, seq.cached):
                rows.append((token, pos, pages[pos // page] * page + pos % page))
                caches.append(seq.cache)
        if len(rows) > self.max_rows:
            raise ValueError(f"{len(rows)} rows: the CPU step holds {self.max_rows}")
        self.meta[:, : len(rows)].copy_(torch.tensor(rows, dtype=torch.long).t())
        self.tables.fill(caches)

    def keep_rows(self, back: list[tuple[int, int]]) -> None:
        """After a verify step: nothing to roll back (K/V past the kept tokens is overwritten
        later; no recurrent state)."""

    def feed(self, tokens: torch.Tensor) -> None:
        """The loaded rows' input tokens from the last step's picks (the engine's lookahead)."""
        self.meta[0, : tokens.shape[0]].copy_(tokens)

    def save_state(self, batch: int) -> Callable[[], None]:
        return lambda: None

    def _pool_pointers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each layer's K and V pool tensor address (re-read when an elastic pool grew)."""
        s = self.storage
        if self._pools is None or self._pools[0] is not s.k:
            self._pools = (s.k, torch.tensor([k[0].data_ptr() for k in s.k]),
                           torch.tensor([v[0].data_ptr() for v in s.v]))
        return self._pools[1], self._pools[2]

    def _thread_buffers(self, threads: int) -> tuple[torch.Tensor, ...]:
        if self.h.numel() < threads * self.x.numel():
            B = self.max_rows
            self.h = torch.zeros(threads, *self.x.shape)
            self.xq = torch.zeros(threads, B, 2 * self.widest, dtype=torch.int8)  # int16 fits
            self.xd = torch.zeros(threads, B, self.widest // 32)
            self.scores = torch.zeros(threads, self.max_context)
        return self.h, self.xq, self.xd, self.scores

    def step(self, batch: int, bucket: int = 0, q_len: int = 1) -> torch.Tensor:
        """Logits [batch, V] (fp32) of the first `batch` loaded rows (`bucket` and `q_len` are
        the CUDA graphs' and unused: the C step reads each row's own position)."""
        m = self.model
        tokens, positions, slots = self.meta
        m.rope.tables(positions[:1], int(positions[:batch].max()))  # grows the tables if needed
        k_pools, v_pools = self._pool_pointers()
        threads = torch.get_num_threads()
        c = m.cfg
        ptr = torch.Tensor.data_ptr
        h, xq, xd, scores = self._thread_buffers(threads)
        self._lib.ninfer_llama_decode_step(
            ptr(self.dims), c.rms_norm_eps, m.scale, threads, batch,
            ptr(tokens), ptr(positions), ptr(slots), ptr(self.table), ptr(m.embedding),
            ptr(m.rope.cos), ptr(m.rope.sin), ptr(self.layer_pointers), ptr(k_pools),
            ptr(v_pools), ptr(m.final_norm), ptr(self.head.codes), ptr(self.head.scales),
            ptr(self.x), ptr(h), ptr(self.qkv), ptr(self.attn), ptr(self.act),
            ptr(scores), ptr(self.logits), ptr(xq), ptr(xd))
        return self.logits[:batch]


def swiglu_blocks(gate: Q8Matrix, up: Q8Matrix) -> Q8Matrix:
    """Gate and up rows in the C step's blocks of four (gate i, gate i+1, up i, up i+1), so the
    thread that computes a block applies silu(gate) · up to it."""
    def blocks(a, b):
        out = a.new_empty(a.shape[0] // 2, 4, a.shape[1])
        out[:, :2].copy_(a.view(-1, 2, a.shape[1]))
        out[:, 2:].copy_(b.view(-1, 2, b.shape[1]))
        return out.flatten(0, 1)
    return Q8Matrix(blocks(gate.codes, up.codes), blocks(gate.scales, up.scales))


def cpu_decoder(model: LlamaModel, storage: KvStorage, max_batch: int, max_context: int,
                weights, activations: str = "fp32", max_q: int = 1) -> CpuDecoder | str:
    """The compiled CPU step over `storage` for `model` (weights read from `weights`, the
    artifact; `max_q`: the most tokens a verify row carries), or why it cannot serve this
    model here."""
    c = model.cfg
    H, I, D = c.hidden_size, c.intermediate_size, c.head_dim
    nq, nkv = c.num_heads, c.num_kv_heads
    codecs = (storage.k_codec, storage.v_codec)
    if model.dtype != torch.float32 or any(not isinstance(k, PlainCodec) for k in codecs):
        return "the compiled CPU step serves fp32 activations and unquantized KV"
    vectors = [model.embedding, model.final_norm, model.rope.cos, model.rope.sin,
               *(t for layer in model.layers
                 for t in (layer.input_norm, layer.post_attention_norm))]
    if not all(t.is_contiguous() and t.dtype == torch.float32 for t in vectors):
        return "the compiled CPU step reads the embedding, norms and RoPE tables as dense fp32"
    if any(layer.qk_norm is not None for layer in model.layers):
        return "the compiled CPU step has no per-head Q/K norm (Qwen3)"
    if (H % 32 or I % 32 or D % 8 or nq % nkv or nq * D != H or c.vocab_size % 4
            or D > kernel.MAX_HEAD_DIM or max_batch > kernel.MAX_ROWS):
        return "the model's shapes do not fit the compiled CPU step's vector tiling"
    reason = kernel.cpu_decode_unavailable()
    if reason is not None:
        return reason
    qkv_shapes = [(nq * D, H), (nkv * D, H), (nkv * D, H)]
    layers = []
    for i in range(c.num_layers):
        p = f"text/layers/{i}/"
        layer = {
            "qkv": stored_q8(weights, [p + "attention/query", p + "attention/key",
                                       p + "attention/value"], qkv_shapes),
            "output": stored_q8(weights, [p + "attention/output"], [(H, nq * D)]),
            "gate": stored_q8(weights, [p + "mlp/gate"], [(I, H)]),
            "up": stored_q8(weights, [p + "mlp/up"], [(I, H)]),
            "down": stored_q8(weights, [p + "mlp/down"], [(H, I)]),
        }
        if any(v is None for v in layer.values()):
            return "the artifact does not store every projection as Q8 groups (q8_g32_fp16)"
        layer["gate_up"] = swiglu_blocks(layer.pop("gate"), layer.pop("up"))
        layers.append({name: m.tile_rows() for name, m in layer.items()})
    head_name = "text/token_embedding" if c.tie_word_embeddings else "text/output_head"
    head = stored_q8(weights, [head_name], [(c.vocab_size, H)])
    if head is None:
        return "the artifact does not store the output head as Q8 groups (q8_g32_fp16)"
    return CpuDecoder(model, storage, max_batch, max_context, layers, head.tile_rows(),
                      activations, max_q)
