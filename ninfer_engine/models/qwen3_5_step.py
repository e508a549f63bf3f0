"""One decode step of B sequences of the hybrid family (Qwen3.5 / -MoE) on the ninfer kernels.

The weights it reads are `qwen3_5_step_weights.HybridWeights`.

`HybridStep` runs one decode step over static buffers: next token, position and state slot per
row (`tokens`, `pos`, `slots`), page tables (`table`), the GDN conv/SSM state pools (`conv[i]`,
`ssm[i]`: one row per slot, read and written in place at each row's slot) and, per attention
layer, a `KvLayer` (pages read in place by the paged-attention kernel, which dequantises every
KV dtype itself). Nothing in the step syncs with the host, so it is capturable in a CUDA graph.
The engine (`qwen3_5_engine_step.EngineHybridDecoder`) binds it to the shared KV pool and the
running sequences' state pool (`kv.StatePool`); the benchmark binds it to pools of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..kernels.gdn_decode import gdn_decode_triton
from ..kernels.gdn_fused import gdn_gated_norm_triton, gdn_prep_triton
from ..kernels.moe_down import down_split_launch, moe_down_combine_triton
from ..kernels.moe_fused import moe_gate_up_silu_triton, route_topk_triton
from ..kernels.paged_attention import PAGE, paged_attention_triton
from ..kernels.qk_norm_rope import qk_norm_rope_triton
from ..kernels.rmsnorm import rms_norm_triton
from ..kernels.state_rollback import state_rollback_triton
from ..experts.host_jobs import HostJobs
from ..experts.routing_log import RoutingLog
from .qwen3_5_step_weights import HybridWeights, KvLayer


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
                 max_q: int = 1, keep_hidden: bool = False, trail: bool = True,
                 acc_rows: int | None = None):
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
        # zeroed in one launch a step instead of a fill and a cast per projection (`acc_rows`:
        # fewer, where only the GEMVs of that many rows take it, not the MoE's down kernel)
        acc_rows = rows if acc_rows is None else min(rows, acc_rows)
        self.acc = torch.zeros(2 * len(weights.layers), acc_rows, weights.c["hidden_size"],
                               device=dev)
        # the same for the router | shared-score GEMV of MoE layers whose shared expert is a
        # slot (a K split into fp32 is 1.6x faster there); the rest take bf16 (shared g|u)
        routers = [lay for lay in weights.layers if lay.get("shared_slot")]
        width = routers[0]["w_gu"].w.shape[0] if routers else 0
        self.router_acc = torch.zeros(len(routers), acc_rows, width, device=dev)
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
        # (`trail`: False for a step whose rows are never rolled back, a prompt's)
        trail_rows = max_q - 1 if trail else 0
        # each field's trail one [layers, max_q - 1, max_batch, ...] tensor (the GDN kernels
        # take a layer's view of it), so a rollback by device index is one op a field
        self.trails = tuple(ts[0].new_empty(len(ts), trail_rows, max_batch, *ts[0].shape[1:])
                            if ts else None for ts in (self.conv, self.ssm))
        self.trail_conv, self.trail_ssm = (list(t) if t is not None else []
                                           for t in self.trails)
        # the same pools as [layers, slots, ...] stacks, where a rollback by device index
        # takes them (`keep_on_device`; `EngineHybridDecoder` sets them)
        self.state_stacks: tuple[torch.Tensor, torch.Tensor] | None = None
        # each row's real-token count where rows carry padding (`PromptStep`), else None
        self.valid: torch.Tensor | None = None
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
        pos = self.pos[:n]
        seq = self.rows[:n] // q_len if q_len > 1 else self.rows[:n]
        table = self.table[seq] if q_len > 1 else self.table[:batch]
        # where each token's new K/V goes: the same for every attention layer
        slot = self.table[seq, pos // PAGE] * PAGE + pos % PAGE
        y = self.layers(n, batch, q_len, table, kv_span, slot)
        if q_len == 1:
            self.pos[:batch] += 1
        return self.w.model.ranks.gather_vocab(self.w.head(y), self.c["vocab_size"])

    def layers(self, n, batch, q_len, table, kv_span, slot) -> torch.Tensor:
        """Token rows 0..n-1 (`batch` rows of `q_len`) through every layer and the final norm:
        [n, H]; `table`, `kv_span` and `slot` as the attention layers read them (`_attn`)."""
        x = F.embedding(self.tokens[:n], self.w.model.embedding)
        return self.blocks(x, n, batch, q_len, table, kv_span, slot, self.w.model.final_norm)

    def blocks(self, x, n, batch, q_len, table, kv_span, slot, final_norm,
               keep: torch.Tensor | None = None) -> torch.Tensor:
        """`layers` from the first layer's input `x` [n, H] on, normed by `final_norm`; with
        `keep` (device row indices, no taps) only those rows go on past the last layer's mixer
        (its K/V are every row's) and the result is [len(keep), H]."""
        kv, gdn, attn, moe = self.kv(), 0, 0, 0
        last = len(self.w.layers) - 1
        ranks = self.w.model.ranks
        acc, router_acc = self.acc[:, :n], self.router_acc[:, :n]
        acc.zero_()
        router_acc.zero_()
        pos = self.pos[:n]
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
            if keep is not None and j == last:  # the rest reads only the kept rows' outputs
                y, h, n = y[keep], h[keep], keep.shape[0]
            if "moe" in layer:
                logits = router_acc[moe, :n] if layer["shared_slot"] else None
                delta = self._moe(layer, y, n, logits, acc[2 * j + 1, :n])
                moe += layer["shared_slot"]
            else:
                gu = layer["w_gu"](y)
                g, u = gu.chunk(2, -1)
                delta = layer["w_down"](u, gate=g, act="silu", acc=acc[2 * j + 1, :n])
            delta = ranks.all_reduce(delta)
            if self.hidden is not None and j in self.taps:  # layer j's residual output
                t = self.taps.index(j) * delta.shape[-1]
                torch.add(h, delta, out=self.hidden[:n, t: t + delta.shape[-1]])
        y, _ = rms_norm_triton(delta, final_norm, self.eps, h, True)
        if self.hidden is not None and not self.taps:
            self.hidden[:n].copy_(y)
        return y

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

    def keep_on_device(self, kept: torch.Tensor, batch: int) -> None:
        """`keep` for rows 0..batch-1 of the last verify step (of `max_q` tokens) at once, by
        device counts `kept` [batch] (1 ≤ kept ≤ max_q): each row's slot takes its state
        after its first kept tokens, every layer in one launch a field (`state_stacks`: the
        slot pools as [layers, slots, ...] stacks), copying only rows that roll back
        (`kernels.state_rollback`). No host value is read: a graph can hold it."""
        rows, slots = self.rows[:batch], self.slots[:batch]
        for state, trail in zip(self.state_stacks, self.trails):
            state_rollback_triton(state, trail, kept, rows, slots, self.max_q - 1)

    def _gdn(self, layer, i, y, B, T, acc):
        """Fused projection → conv/SiLU/gates (one kernel) → recurrence → gated norm (one);
        the conv and recurrence kernels walk a verify row's tokens in order and store the
        state after each but the last in the trail."""
        m, slots = layer["mixer"], self.slots[:B]
        kept = T > 1 and self.trail_conv[i].shape[0] > 0  # a verify row's (not a prompt's)
        trail_conv, trail_ssm = (self.trail_conv[i], self.trail_ssm[i]) if kept else (None, None)
        q, k, v, g, beta, z = gdn_prep_triton(layer["w_in"](y), self.conv[i], m.conv, m.a_log,
                                              m.dt_bias, m.nk, m.dk, m.nv, m.dv, slots,
                                              trail_conv, valid=self.valid)
        o = gdn_decode_triton(q, k, v, g, beta, self.ssm[i], slots, trail_ssm,
                              valid=self.valid)
        return layer["w_out"](gdn_gated_norm_triton(o, z, m.norm, self.eps), acc=acc)

    def _attn(self, layer, kv: KvLayer, y, pos, rope, table, kv_span, slot, acc):
        """Projection, q/k norms and rotary (the rows' new K/V stored at their pool slots
        `slot`), the attention core (`_attend`), the gated output projection."""
        m, n = layer["mixer"], y.shape[0]
        qd, kvd = m.nq * m.d, m.nkv * m.d
        qgkv = layer["w_in"](y)
        _, gate, _, v = qgkv.split([qd, qd, kvd, kvd], -1)
        q, k = qk_norm_rope_triton(qgkv, m.nq, m.nkv, m.d, m.q_norm, m.k_norm, self.eps, rope,
                                   m.rope.rd, self.c["rope_parameters"]["rope_theta"],
                                   kv_rows=kv.rows, slots=slot)
        if kv.rows is None:
            kv.write(slot, k, v.reshape(n, m.nkv, m.d))
        a = self._attend(q, kv, pos, table, kv_span)
        return layer["w_out"](a.reshape(n, qd), gate=gate, act="sigmoid", acc=acc)

    def _attend(self, q, kv: KvLayer, pos, table, kv_span):
        """Every token row attends over its sequence's pages up to its own position."""
        return paged_attention_triton(q, kv.k, kv.v, table, pos + 1, kv.k_scale, kv.v_scale,
                                      max_seq_len=kv_span)

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
