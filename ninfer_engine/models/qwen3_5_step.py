"""One decode step of B sequences of the hybrid family (Qwen3.5 / -MoE) on the ninfer kernels.

`HybridWeights` takes a `Qwen35Model` built over `models.fused.FusedParams` and keeps, per
layer, one matrix per decode GEMV group (GDN q|k|v|z|b|a, attention q|gate|k|v, MLP gate|up,
MoE router|shared score(|shared gate|up)) plus the stacked routed experts (bf16 or fp8
`models.experts.ExpertStack`s, holding the shared expert too where it is stored in their form):
the Triton FMA GEMV for one bf16 row, cuBLAS for several, or the fused dequant GEMVs of
`models.packed` where the weights are stored quantized.

`HybridStep` runs one decode step over static buffers: next token, position and state slot per
row (`tokens`, `pos`, `slots`), page tables (`table`), the GDN conv/SSM state pools (`conv[i]`,
`ssm[i]`: one row per slot, read and written in place at each row's slot) and, per attention
layer, a `KvLayer` (pages read in place by the paged-attention kernel, which dequantises every
KV dtype itself). Nothing in the step syncs with the host, so it is capturable in a CUDA graph.
The engine (`EngineHybridDecoder`) binds it to the shared KV pool and the running sequences'
state pool (`kv.StatePool`); the benchmark binds it to pools of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels.dequant_gemv import dequant_gemv, gated, kernel_tiles
from ..kernels.gdn_decode import gdn_decode_triton
from ..kernels.gdn_fused import gdn_gated_norm_triton, gdn_prep_triton
from ..kernels.moe_down import down_split_launch, moe_down_combine_triton
from ..kernels.moe_fused import moe_gate_up_silu_triton, route_topk_triton
from ..kernels.paged_attention import PAGE, paged_attention_triton
from ..kernels.qk_norm_rope import qk_norm_rope_triton
from ..kernels.rmsnorm import rms_norm_triton
from ..kv import KvStorage, PageTables, StatePool
from ..kv.quant import PlainCodec
from ..experts.host_jobs import HostJobs
from ..experts.routing_log import RoutingLog
from .attention import input_token
from .fused import FusedParams
from .packed import FP8_GROUPS, FP8_ROW, GEMV_MAX_ROWS, PackedMatrix, linear


class FusedLinear:
    """`x Wᵀ`: one row of a dense weight on CUDA through the Triton FMA GEMV (faster than
    cuBLAS at batch 1 on every H200 shape swept), up to `gemv_rows` through its dot path,
    more through cuBLAS, a `PackedMatrix` through its packed kernels.

    `gate`, `act`: the input is `x · act(gate)` (SwiGLU's `silu(g) · u`, the attention output
    gate), read by the GEMV itself or computed by one launch first (`dequant_gemv` picks);
    `acc`: an fp32 `[B, N]` buffer the product is added into and returned, where the GEMV is
    the dequant kernel (one bf16 row, or one fp8 block); elsewhere (cuBLAS, other packed
    formats) `acc` is left alone and the bf16 product returned (the RMSNorm after it takes
    either)."""

    def __init__(self, w: torch.Tensor | PackedMatrix, gemv_rows: int = 1):
        self.w = w
        # rows up to which a plain weight takes the Triton GEMV (`gemv_rows`) rather than cuBLAS
        self.gemv_rows = (gemv_rows if isinstance(w, torch.Tensor) and w.is_cuda
                          and kernel_tiles(w.shape[1], None) else 0)
        fp8 = (isinstance(w, PackedMatrix) and len(w.blocks) == 1
               and w.blocks[0].fmt in (FP8_ROW, FP8_GROUPS))
        self.planes = w.blocks[0].planes if fp8 else None

    def __call__(self, x, gate=None, act=None, acc=None):
        if 0 < x.shape[0] <= self.gemv_rows and x.dtype == self.w.dtype:
            return dequant_gemv(x, self.w, None, gate=gate, act=act, out=acc)
        if self.planes is not None and x.shape[0] <= GEMV_MAX_ROWS:
            return dequant_gemv(x, *self.planes, gate=gate, act=act, out=acc)
        return linear(x if gate is None else gated(x, gate, act), self.w)

    def nbytes(self):
        return self.w.nbytes


class HybridWeights:
    """The fused per-layer matrices of a `Qwen35Model` built over `FusedParams`."""

    def __init__(self, model, params: FusedParams):
        c = model.config
        self.c, self.model, self.eps = c, model, c["rms_norm_eps"]
        self.head = FusedLinear(model.head_projection.weight)  # a rank's rows at --tp 2
        self.layers = []
        for i, block in enumerate(model.blocks):
            kind = c["layer_types"][i]
            group = "gdn/" if kind == "linear_attention" else "attention/"
            prefix = f"text/layers/{i}/"
            m = block.mixer
            layer = dict(kind=kind, block=block, mixer=m,
                         w_in=FusedLinear(params.fused[prefix + group]),
                         w_out=FusedLinear(m.w_out if group == "gdn/" else m.w_o))
            if hasattr(block.ffn, "router"):
                moe = block.ffn
                shared_slot = params.shared_in_stack(prefix + "moe/")
                # one GEMV for router | shared score (| shared gate|up), `models.fused`
                layer.update(moe=moe, shared_slot=shared_slot, tier=moe.tier,
                             experts_gu=params.fused[prefix + "moe/experts/gate_up"],
                             experts_down=params.fused[prefix + "moe/experts/down"],
                             # a verify row's 4 rows of router|score (257 outputs) ran
                             # as cuBLAS's sm75 split-K GEMM, its reduce and a cast:
                             # ~13 µs a layer on the H200 (h200-verify-step.md)
                             w_gu=FusedLinear(params.fused[prefix + "moe/"],
                                              gemv_rows=GEMV_MAX_ROWS))
                if not shared_slot:
                    layer["w_down"] = FusedLinear(moe.shared.down)
            else:
                layer.update(w_gu=FusedLinear(params.fused[prefix + "mlp/"]),
                             w_down=FusedLinear(block.ffn.down))
            self.layers.append(layer)

    def weight_bytes(self) -> int:
        """Bytes of every matrix and vector a batch-1 step reads (routed experts: top_k)."""
        n = self.head.nbytes() + self.model.final_norm.numel() * 2
        for layer in self.layers:
            n += sum(layer[k].nbytes() for k in ("w_in", "w_gu", "w_down", "w_out")
                     if k in layer)
            if "moe" in layer:
                # an expert's bytes as served: 2 a weight in bf16, 1 + scales in fp8
                per_expert = layer["experts_gu"].expert_bytes + layer["experts_down"].expert_bytes
                n += (layer["moe"].top_k + layer["shared_slot"]) * per_expert
        return n


@dataclass
class KvLayer:
    """One attention layer's paged K/V as the kernel reads it, and how new rows are stored.

    `k`, `v`: bf16 rows `[pages, PAGE, kv_heads, D]`, or the tuple of a KV codec's component
    page views (`KvStorage.page_view`: any KV dtype); `k_scale`, `v_scale`: the int8 group
    scales of bare int8 codes, else None (see `kernels.paged_attention`). `rows`: where K and
    V are plain rows in the activation dtype, those rows `[slots, kv_heads, D]`: the q/k
    norm kernel then writes new K/V itself (`qk_norm_rope_triton(kv_rows=)`), not `write`."""

    k: torch.Tensor | tuple[torch.Tensor, ...]
    v: torch.Tensor | tuple[torch.Tensor, ...]
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    write: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]  # (slots, k, v)
    rows: tuple[torch.Tensor, torch.Tensor] | None = None


class HybridStep:
    """The decode step of up to `max_batch` rows of `q_len` ≤ `max_q` tokens each (a decode
    row 1, a speculative verify row 1 + k); `kv()` returns the attention layers' pools,
    `states` the GDN layers' (conv, ssm) slot pools (default: one slot per row, row i in
    slot i).

    Token rows are sequence-major (row b's token t is token row b·q_len + t) and carry their
    own position, so each attends causally over its sequence's pages up to itself. A verify
    step also keeps each GDN layer's state after every token but the last (`trail_conv`,
    `trail_ssm`: [max_q - 1, max_batch, ...]), so that `keep` can take a row back to the
    state after any prefix of its tokens."""

    def __init__(self, weights: HybridWeights, max_batch: int, max_pages: int,
                 kv: Callable[[], list[KvLayer]],
                 states: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
                 max_q: int = 1, keep_hidden: bool = False):
        self.w, self.c, self.eps = weights, weights.c, weights.eps
        self.kv, self.max_batch, self.max_q = kv, max_batch, max_q
        dev = weights.model.embedding.device
        rows = max_batch * max_q  # token rows
        # per token row: token, position, rotary shift (a media prompt's rope delta); per row:
        # state slot (one host copy loads a step)
        self.meta = torch.zeros(4, rows, dtype=torch.long, device=dev)
        self.tokens, self.pos, self.slots, self.shift = self.meta
        self.slots[:max_batch].copy_(torch.arange(max_batch))
        self.table = torch.zeros(max_batch, max_pages, dtype=torch.long, device=dev)
        self.rows = torch.arange(rows, device=dev)
        # per layer, the fp32 deltas its mixer and FFN add to the residual (`FusedLinear` acc),
        # zeroed in one launch a step instead of a fill and a cast per projection
        self.acc = torch.zeros(2 * len(weights.layers), rows, weights.c["hidden_size"],
                               device=dev)
        # the same for the router | shared-score GEMV of MoE layers whose shared expert is a
        # slot (a K split into fp32 is 1.6x faster there); the rest take bf16 (shared g|u)
        routers = [lay for lay in weights.layers if lay.get("shared_slot")]
        width = routers[0]["w_gu"].w.shape[0] if routers else 0
        self.router_acc = torch.zeros(len(routers), rows, width, device=dev)
        # each token row's final-normed hidden, for a drafter that reads it (`--spec mtp`), or
        # its tap layers' residual outputs side by side (`feature_taps`, `--spec dflash`)
        self.taps = tuple(getattr(weights.model, "feature_taps", None) or ())
        H = weights.c["hidden_size"]
        self.hidden = (torch.empty(rows, H * max(len(self.taps), 1), device=dev,
                                   dtype=weights.model.embedding.dtype) if keep_hidden else None)
        if states is None:
            states = ([], [])
            for layer in weights.layers:
                m = layer["mixer"]
                if layer["kind"] == "linear_attention":
                    states[0].append(torch.zeros(max_batch, m.taps - 1, m.conv_dim, device=dev,
                                                 dtype=torch.bfloat16))
                    states[1].append(torch.zeros(max_batch, m.nv, m.dk, m.dv, device=dev))
        self.conv, self.ssm = states  # per GDN layer, in layer order: [slots, ...]
        self.trail_conv = [t.new_empty(max_q - 1, max_batch, *t.shape[1:]) for t in self.conv]
        self.trail_ssm = [t.new_empty(max_q - 1, max_batch, *t.shape[1:]) for t in self.ssm]
        # `keep`'s per-layer views: of the trail by (row, kept), of the states by slot
        self._trail_views: dict[tuple[int, int], list[torch.Tensor]] = {}
        self._slot_views: dict[int, list[torch.Tensor]] = {}
        # offloaded layers read in place: the step's routing, for the tiers between steps
        self.routing = RoutingLog(weights.layers, rows, dev)
        # and the misses they compute on the host's cores, inside the step (`host_jobs`)
        self.host_jobs = HostJobs(weights.layers, rows, dev)

    def before_step(self) -> None:
        """Before a launch: the last step's expert routing read (`experts.in_place`), and
        any lost host job raised (`experts.host_jobs`)."""
        self.host_jobs.check()
        self.routing.take()

    def after_launch(self) -> None:
        """After a launch: its routing queued for the host, the routing taken before it to
        the expert tiers, while the GPU runs the step."""
        self.routing.record()
        self.routing.settle()

    def settle(self) -> None:
        """Every launched step's routing counted now, waiting for them (a bench's window, a
        test)."""
        self.routing.take(wait=True)
        self.routing.settle()

    def step(self, batch: int, kv_span: int, q_len: int = 1) -> torch.Tensor:
        """Logits [batch · q_len, V] of token rows 0..batch·q_len-1; `kv_span` ≥ every row's
        length after the step sizes the attention kernel's split grid. A decode step
        (q_len 1) advances `pos` of its rows by one."""
        n = batch * q_len
        self.routing.clear()
        x = F.embedding(self.tokens[:n], self.w.model.embedding)
        kv, gdn, attn, moe = self.kv(), 0, 0, 0
        ranks = self.w.model.ranks
        acc, router_acc = self.acc[:, :n], self.router_acc[:, :n]
        acc.zero_()
        router_acc.zero_()
        pos = self.pos[:n]
        seq = self.rows[:n] // q_len if q_len > 1 else self.rows[:n]
        table = self.table[seq] if q_len > 1 else self.table[:batch]
        # where each token's new K/V goes: the same for every attention layer
        slot = self.table[seq, pos // PAGE] * PAGE + pos % PAGE
        rope = pos + self.shift[:n]  # the rotary position; pages and lengths go by `pos`
        delta, h = x, None
        for j, layer in enumerate(self.w.layers):
            b = layer["block"]
            y, h = rms_norm_triton(delta, b.input_norm, self.eps, h, True)
            if layer["kind"] == "linear_attention":
                mix = self._gdn(layer, gdn, y, batch, q_len, acc[2 * j])
                gdn += 1
            else:
                mix = self._attn(layer, kv[attn], y, pos, rope, table, kv_span, slot,
                                 acc[2 * j])
                attn += 1
            mix = ranks.all_reduce(mix)  # tensor parallel: the ranks' partial sums, in place
            y, h = rms_norm_triton(mix, b.post_norm, self.eps, h, True)
            if "moe" in layer:
                logits = router_acc[moe] if layer["shared_slot"] else None
                delta = self._moe(layer, y, n, logits, acc[2 * j + 1])
                moe += layer["shared_slot"]
            else:
                gu = layer["w_gu"](y)
                g, u = gu.chunk(2, -1)
                delta = layer["w_down"](u, gate=g, act="silu", acc=acc[2 * j + 1])
            delta = ranks.all_reduce(delta)
            if self.hidden is not None and j in self.taps:  # layer j's residual output
                t = self.taps.index(j) * delta.shape[-1]
                torch.add(h, delta, out=self.hidden[:n, t: t + delta.shape[-1]])
        y, _ = rms_norm_triton(delta, self.w.model.final_norm, self.eps, h, True)
        if self.hidden is not None and not self.taps:
            self.hidden[:n].copy_(y)
        if q_len == 1:
            self.pos[:batch] += 1
        return ranks.gather_vocab(self.w.head(y), self.c["vocab_size"])

    def keep(self, row: int, kept: int, slot: int) -> None:
        """Take row `row` of the last verify step, in state slot `slot`, back to its GDN state
        after its first `kept` tokens (1 ≤ kept < q_len; kept = q_len is the state the step
        left in the slot). One multi-tensor copy over every layer's conv and SSM state: a copy
        a tensor was 60 launches and their views on the 35B-A3B, ~0.9 ms of host time in a
        verify step the GPU waited for (h200-verify-step.md)."""
        saved = self._trail_views.get((row, kept))
        if saved is None:
            saved = self._trail_views[(row, kept)] = [
                t[kept - 1, row] for t in (*self.trail_conv, *self.trail_ssm)]
        states = self._slot_views.get(slot)
        if states is None:
            states = self._slot_views[slot] = [t[slot] for t in (*self.conv, *self.ssm)]
        torch._foreach_copy_(states, saved)

    def _gdn(self, layer, i, y, B, T, acc):
        """Fused projection → conv/SiLU/gates (one kernel) → recurrence → gated norm (one);
        the conv and recurrence kernels walk a verify row's tokens in order and store the
        state after each but the last in the trail."""
        m, slots = layer["mixer"], self.slots[:B]
        trail_conv, trail_ssm = (self.trail_conv[i], self.trail_ssm[i]) if T > 1 else (None, None)
        q, k, v, g, beta, z = gdn_prep_triton(layer["w_in"](y), self.conv[i], m.conv, m.a_log,
                                              m.dt_bias, m.nk, m.dk, m.nv, m.dv, slots,
                                              trail_conv)
        o = gdn_decode_triton(q, k, v, g, beta, self.ssm[i], slots, trail_ssm)
        return layer["w_out"](gdn_gated_norm_triton(o, z, m.norm, self.eps), acc=acc)

    def _attn(self, layer, kv: KvLayer, y, pos, rope, table, kv_span, slot, acc):
        m, n = layer["mixer"], y.shape[0]
        qd, kvd = m.nq * m.d, m.nkv * m.d
        qgkv = layer["w_in"](y)
        _, gate, _, v = qgkv.split([qd, qd, kvd, kvd], -1)
        q, k = qk_norm_rope_triton(qgkv, m.nq, m.nkv, m.d, m.q_norm, m.k_norm, self.eps, rope,
                                   m.rope.rd, self.c["rope_parameters"]["rope_theta"],
                                   kv_rows=kv.rows, slots=slot)
        if kv.rows is None:
            kv.write(slot, k, v.reshape(n, m.nkv, m.d))
        # every token row attends over its sequence's pages up to its own position
        a = paged_attention_triton(q, kv.k, kv.v, table, pos + 1, kv.k_scale, kv.v_scale,
                                   max_seq_len=kv_span)
        return layer["w_out"](a.reshape(n, qd), gate=gate, act="sigmoid", acc=acc)

    def _moe(self, layer, y, B, router_acc, acc):
        """Shared expert plus top-k routed SwiGLU experts of every row. One GEMV gives the
        router logits and the shared score (and the shared gate|up where the shared expert is
        not in the stacks); the routing kernel picks the k slots (plus the shared expert's,
        weighted by sigmoid(score), where it is); then gate|up + SiLU·up over the (row, slot)
        pairs and down + the weighted sum over the slots, one launch each, the last adding
        fp32 sums into the layer's `acc` (split over slots and I at one row:
        `down_split_launch`)."""
        moe, shared_slot = layer["moe"], layer["shared_slot"]
        if shared_slot:
            out = layer["w_gu"](y, acc=router_acc)
            weights, ids = route_topk_triton(out, moe.top_k, moe.renormalise, shared=True,
                                             round_bf16=out.dtype == torch.float32,
                                             ids_out=self.routing.out(layer["tier"], B,
                                                                      moe.top_k + 1))
        else:
            out = layer["w_gu"](y)
            width = moe.shared.down.shape[1]
            logits, score, g, u = out.split([moe.n_experts, 1, width, width], -1)
            shared = layer["w_down"](u, gate=g, act="silu") * torch.sigmoid(score)
            weights, ids = route_topk_triton(logits, moe.top_k, moe.renormalise,
                                             ids_out=self.routing.out(layer["tier"], B,
                                                                      moe.top_k))
        k = ids.shape[1]
        ids = ids.view(B * k)
        gu, down = layer["experts_gu"], layer["experts_down"]  # bf16 or fp8 `ExpertStack`s
        tier, on_cpu, remap = layer["tier"], None, (None, None)
        if tier is not None:  # offloaded experts
            gu, down = tier.slot_gu, tier.slot_down  # lending resizes them
            if tier.in_place is not None:  # slots or host memory by a device table: no sync
                remap = tier.in_place.remaps()
                # its marked misses to the host's cores, while the kernels run the rest
                self.host_jobs.post(tier, y, ids.view(B, k), weights)
            else:  # slots by the map, misses resolved on the host (a sync: uncaptured)
                ids, weights, on_cpu = tier.decode(y, ids, weights, k)
        act = moe_gate_up_silu_triton(y, gu.w, ids, scale=gu.scale,  # slot s reads row s // k
                                      remap=remap[0])
        routed = moe_down_combine_triton(act, down.w, ids, weights, B, k, scale=down.scale,
                                         out=acc, remap=remap[1],
                                         **down_split_launch(B, k, down.w, down.scale))
        if on_cpu is not None:
            routed = routed + on_cpu
        if remap[0] is not None:  # the host's sum of those misses, added
            self.host_jobs.collect(tier, routed)
        return routed if shared_slot else routed + shared


class EngineHybridDecoder:
    """`HybridStep` over the engine's shared KV pool and running-state pool, for
    `decode_graphs.DecodeGraphs`: `load` writes each row's token, position, state slot and page
    table into the step's buffers; the step updates every row's state in its slot in place, so
    nothing is copied back."""

    def __init__(self, model, storage: KvStorage, states: StatePool, max_batch: int,
                 max_context: int, max_q: int = 1, keep_hidden: bool = False) -> None:
        self.storage, self.max_batch, self.max_context = storage, max_batch, max_context
        self.max_q = max_q
        self.core = HybridStep(HybridWeights(model, model.params), max_batch,
                               -(-max_context // PAGE), self._kv,
                               (states.field("conv"), states.field("ssm")), max_q, keep_hidden)
        self.tables = PageTables(self.core.table)
        self._slots: list[int] = []  # the loaded rows' state slots

    @property
    def hidden(self) -> torch.Tensor | None:
        """The last step's final-normed hidden per token row (row b · q_len + i), or with the
        model's `feature_taps` its tap layers' residual outputs side by side, or None when the
        step was built without them."""
        return self.core.hidden

    def _kv(self) -> list[KvLayer]:
        s = self.storage

        def writer(j):
            def write(slots, k, v):
                s.k_codec.write(s.k[j], slots, k)
                s.v_codec.write(s.v[j], slots, v)
            return write

        dtype = self.core.w.model.embedding.dtype
        plain = all(isinstance(c, PlainCodec) and c.dtype == dtype
                    for c in (s.k_codec, s.v_codec))
        return [KvLayer(s.page_view(k), s.page_view(v), None, None, writer(j),
                        (k[0], v[0]) if plain else None)
                for j, (k, v) in enumerate(zip(s.k, s.v))]

    def load(self, seqs, drafts: list[list[int]] | None = None) -> None:
        """Each row's tokens (its last output, then its drafts), their positions and rotary
        shift, its state slot and page table; first, the last step's expert routing read."""
        c = self.core
        c.before_step()
        rows = [[input_token(seq), *(drafts[b] if drafts else ())] for b, seq in enumerate(seqs)]
        meta = torch.zeros(4, sum(map(len, rows)), dtype=torch.long)
        meta[0] = torch.tensor([t for row in rows for t in row])
        meta[1] = torch.tensor([seq.cached + t for seq, row in zip(seqs, rows)
                                for t in range(len(row))])
        self._slots = [seq.state.index for seq in seqs]
        meta[2, : len(seqs)] = torch.tensor(self._slots)
        meta[3] = torch.tensor([seq.rope_delta for seq, row in zip(seqs, rows) for _ in row])
        # not waiting for the work queued before (a lookahead step loads behind one in flight)
        c.meta[:, : meta.shape[1]].copy_(meta, non_blocking=True)
        self.tables.fill([seq.cache for seq in seqs])

    def feed(self, tokens: torch.Tensor) -> None:
        """The loaded decode rows' input tokens from the device (the last step's picks)."""
        self.core.meta[0, : tokens.shape[0]].copy_(tokens)

    def step(self, batch: int, bucket: int, q_len: int = 1) -> torch.Tensor:
        return self.core.step(batch, bucket, q_len).float()

    def keep(self, row: int, kept: int) -> None:
        self.core.keep(row, kept, self._slots[row])

    def after_launch(self) -> None:
        """The step is queued: the expert tiers' bookkeeping runs while it computes."""
        self.core.after_launch()

    @property
    def generation(self) -> int:
        """Changes when lending reallocates the expert slot stacks (graphs read the old)."""
        tiers = getattr(self.core.w.model, "expert_tiers", None)
        return 0 if tiers is None else tiers.generation

    def save_state(self, batch: int) -> Callable[[], None]:
        """A copy of the loaded rows' GDN states; calling the result puts it back (around a
        capture's warm-up, which advances them)."""
        c = self.core
        slots = c.slots[:batch]
        pools = [*c.conv, *c.ssm]
        copies = [t[slots] for t in pools]

        def restore():
            for t, saved in zip(pools, copies):
                t.index_copy_(0, slots, saved)
        return restore
