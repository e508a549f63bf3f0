"""Qwen3.5 / Qwen3.5-MoE / Qwen3-Next text model, torch reference path (model-math.md §1–§2).

`Qwen35Model(config, params)` takes the normalised text config (ninfer-format.md §3.1, see
`hf_names.text_config_from_hf`) and a parameter source `params(logical_name, shape) -> tensor`
(names per §3.2). `forward_rows(token_ids, states, lengths)` runs one step's rows together: row
i is `lengths[i]` consecutive tokens of `token_ids` (a prompt chunk or one decode token)
continuing `states[i]`; the projections, norms and MLP/MoE see every token of the step at
once, the GDN recurrence and the attention core each row against its own state.
`forward(token_ids, state)` is the one-row case; `copy.deepcopy` checkpoints and restores a
state.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..host_copy import to_device
from ..kv.slots import StatePool
from ..parallel.group import SINGLE, RankGroup
from .gated_attention import (GatedAttention, KVCache, PartialRope, add_zero_centred_rms_norm,
                              zero_centred_rms_norm)
from .gdn import GatedDeltaNet, GDNState
from .layers import Linear, warm_up_few_rows
from .moe import SparseMoE
from .packed import prefill_fp8
from .swiglu import SwiGLU

ParamSource = Callable[[str, tuple[int, ...]], torch.Tensor]


def dict_params(tensors: dict[str, torch.Tensor]) -> ParamSource:
    """A parameter source over a name → tensor dict that checks every requested shape."""

    def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        t = tensors[name]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
        return t

    return get


@dataclass
class ModelState:
    """Per-sequence state: one GDNState or KVCache per layer, and the tokens consumed so far."""

    layers: list[GDNState | KVCache]
    seen: int = 0


class _Block:
    """Pre-norm block: `x += mixer(N_in(x)); x += ffn(N_post(x))` with (1+w) norms."""

    def __init__(self, config: dict, params: ParamSource, i: int, rope: PartialRope,
                 matmul_dtype: torch.dtype | None, prefix: str | None = None,
                 reduce: Callable[[torch.Tensor], torch.Tensor] = SINGLE.all_reduce):
        self.reduce = reduce  # sums the ranks' partial mixer and FFN outputs (tensor parallel)
        # one rank: the FFN's last pass adds the residual (a rank's share must be summed first)
        self.ffn_adds_residual = reduce == SINGLE.all_reduce
        prefix = prefix or f"text/layers/{i}/"  # the MTP layer reads `mtp/layers/0/`
        h = config["hidden_size"]
        self.eps = config["rms_norm_eps"]
        self.input_norm = params(prefix + "input_norm", (h,))
        self.post_norm = params(prefix + "post_attention_norm", (h,))
        if config["layer_types"][i] == "linear_attention":
            self.mixer = GatedDeltaNet(config, params, prefix, matmul_dtype)
        else:
            self.mixer = GatedAttention(config, params, prefix, rope, matmul_dtype)
        if config.get("num_experts", 0) > 0 and i not in config.get("mlp_only_layers", []):
            self.ffn = SparseMoE(config, params, prefix, matmul_dtype)
        else:
            self.ffn = SwiGLU(params, prefix + "mlp/", h, config["intermediate_size"],
                              matmul_dtype, prefill_fp8(config))

    def __call__(self, x, layer_states, lengths, positions, verify=frozenset()):
        """x [T, H]: rows of `lengths` tokens, each continuing its entry of `layer_states`;
        `verify`: rows whose GDN state after each token is kept."""
        y = zero_centred_rms_norm(x, self.input_norm, self.eps)
        if isinstance(self.mixer, GatedDeltaNet):
            delta = self.reduce(self.mixer(y, layer_states, lengths, verify))
        else:
            delta = self.reduce(self.mixer(y, layer_states, lengths, positions))
        y, x = add_zero_centred_rms_norm(delta, x, self.post_norm, self.eps)
        if self.ffn_adds_residual:
            return self.ffn(y, residual=x)
        return x + self.reduce(self.ffn(y))


class Qwen35Model:
    """The hybrid GDN / gated-attention decoder with its embedding, final norm and head.

    `matmul_dtype` (`--cpu-matmul`, the CPU only) gives every projection and the head a
    narrower copy that few-row (decode) calls multiply by (`layers.Linear`); router, shared
    score and embedding stay exact. `ranks`: tensor parallelism; `config` and `params` are then
    this rank's share (`parallel.shard`), the blocks all-reduce their outputs and the head is
    vocab-parallel.
    """

    def __init__(self, config: dict, params: ParamSource,
                 matmul_dtype: torch.dtype | None = None, ranks: RankGroup = SINGLE):
        self.config = config
        self.ranks = ranks
        self.params = params  # a `FusedParams` source lets the static decoders fuse GEMVs
        loaded: dict[str, torch.Tensor] = {}
        source = params

        def record(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            loaded[name] = source(name, shape)
            return loaded[name]

        params = record  # counts the weight bytes the blocks keep
        h, vocab = config["hidden_size"], config["vocab_size"]
        self.eps = config["rms_norm_eps"]
        self.embedding = params("text/token_embedding", (vocab, h))
        # a tied head aliases the embedding (§3.2)
        self.head = (
            self.embedding
            if config.get("tie_word_embeddings", False)
            else params("text/output_head", (vocab, h))
        )
        lo, hi = ranks.vocab_rows(vocab)  # the vocab-parallel head: this rank's rows
        self.head_projection = Linear(self.head[lo:hi] if ranks.parallel else self.head,
                                      matmul_dtype, relayout=False)
        self.final_norm = params("text/final_norm", (h,))
        rope = PartialRope(config["head_dim"], config["rope_parameters"], self.embedding.device)
        self.blocks = [_Block(config, params, i, rope, matmul_dtype, reduce=ranks.all_reduce)
                       for i in range(config["num_hidden_layers"])]
        # a fusing source (`models.fused.FusedParams`) holds each layer's GDN q|k|v|z|b|a and
        # attention q|gate|k|v rows as one matrix: prompt chunks multiply by it once
        groups = getattr(source, "fused", {})
        for i, b in enumerate(self.blocks):
            key = f"text/layers/{i}/" + ("gdn/" if isinstance(b.mixer, GatedDeltaNet)
                                          else "attention/")
            if key in groups:
                b.mixer.bind_fused(groups[key])
            if isinstance(b.ffn, SparseMoE) and f"text/layers/{i}/moe/" in groups:
                b.ffn.bind_fused(groups[f"text/layers/{i}/moe/"])
        # every `Linear` a step multiplies by, the head first
        self.projections = [self.head_projection]
        for b in self.blocks:
            self.projections += [*b.mixer.projections, *b.ffn.projections]
        # the `--cpu-matmul` decode copies are held beside the weights they narrow
        self._weight_bytes = (sum({t.data_ptr(): t.nbytes for t in loaded.values()
                                   if not getattr(t, "is_meta", False)}.values())
                              + sum(proj.narrow_bytes for proj in self.projections))
        self.attention_layers = [i for i, b in enumerate(self.blocks)
                                 if isinstance(b.mixer, GatedAttention)]
        # layers whose residual outputs (HF `hidden_states[l+1]`), concatenated, are the
        # hiddens `forward_rows(keep_hidden=True)` returns instead of the final-normed ones:
        # set by the DFlash loader (`models.dflash`), whose drafter reads them
        self.feature_taps: tuple[int, ...] | None = None

    def warm_up_kernels(self) -> bool:
        """Compile what the engine's warm-up requests may not reach: the grouped expert
        kernels' row tiles (`SparseMoE.warm_up`), once (the layers share their variants), and
        the mixers' packed projections at few rows (`warm_up_few_rows`). False: neither runs
        a kernel (nothing to compile)."""
        projections = [p for b in self.blocks for p in getattr(b.mixer, "projections", ())]
        few_rows = warm_up_few_rows(projections, self.dtype, self.device) > 0
        return any(isinstance(b.ffn, SparseMoE) and b.ffn.warm_up(self.dtype, self.device)
                   for b in self.blocks) or few_rows

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.dtype

    def weight_bytes(self) -> int:
        """Bytes of every weight held, the `--cpu-matmul` decode copies included."""
        return self._weight_bytes

    def kv_layout(self) -> tuple[int, int, int]:
        """(attention layers, KV heads, head dim) of the paged KV pool."""
        c = self.config
        return len(self.attention_layers), c["num_key_value_heads"], c["head_dim"]

    @property
    def query_heads(self) -> int:
        """Query heads of an attention layer (this rank's under tensor parallelism)."""
        return self.config["num_attention_heads"]

    def new_recurrent_state(self) -> list[GDNState]:
        """Zero GDN states, one per linear-attention layer in layer order (one slot's worth)."""
        return [b.mixer.new_state(self.dtype, self.device) for b in self.blocks
                if isinstance(b.mixer, GatedDeltaNet)]

    def state_pool(self, total: int) -> StatePool:
        """`total` recurrent-state slots on the device, one row each (`kv.StatePool`)."""
        layout = [b.mixer.state_layout(self.dtype) for b in self.blocks
                  if isinstance(b.mixer, GatedDeltaNet)]
        return StatePool(total, layout, self.device, GDNState)

    def bind_state(self, attention: list, recurrent: list[GDNState], seen: int) -> ModelState:
        """A `ModelState` over externally held layer states: KV views for the attention layers
        and GDN states for the rest, each list in layer order."""
        kv, gdn = iter(attention), iter(recurrent)
        layers = [next(kv) if isinstance(b.mixer, GatedAttention) else next(gdn)
                  for b in self.blocks]
        return ModelState(layers=layers, seen=seen)

    def new_state(self) -> ModelState:
        """Empty state for a new sequence."""
        dtype, device = self.embedding.dtype, self.embedding.device
        return ModelState(layers=[b.mixer.new_state(dtype, device) for b in self.blocks])

    @torch.no_grad()
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids -> [T, H] embeddings."""
        return F.embedding(token_ids, self.embedding)

    @torch.no_grad()
    def hidden(self, x: torch.Tensor, states: list[ModelState], lengths: list[int],
               positions: torch.Tensor | None = None,
               verify: frozenset[int] = frozenset()) -> torch.Tensor:
        """Run the decoder over [T, H] inputs, row i (`lengths[i]` tokens, in order) continuing
        `states[i]`; returns final-normed [T, H]. Rows in `verify` keep their GDN state after
        each token, so that `rollback` can keep any prefix of them.

        `positions` defaults to each row's text positions `seen .. seen+n-1`; pass [3, T] for
        MRoPE.
        """
        return self._decode(x, states, lengths, positions, verify)[0]

    @torch.no_grad()
    def _decode(self, x, states, lengths, positions, verify):
        """`hidden`, and what a drafter reads: the final-normed hiddens again, or with
        `feature_taps` the tap layers' residual outputs concatenated in tap order [T, n·H]."""
        if positions is None:
            positions = to_device(torch.cat([torch.arange(s.seen, s.seen + n)
                                             for s, n in zip(states, lengths)]), x.device)
        taps, outputs = self.feature_taps or (), {}
        for i, block in enumerate(self.blocks):
            x = block(x, [s.layers[i] for s in states], lengths, positions, verify)
            if i in taps:
                outputs[i] = x
        for state, n in zip(states, lengths):
            state.seen += n
        h = zero_centred_rms_norm(x, self.final_norm, self.eps)
        return h, (torch.cat([outputs[i] for i in taps], -1) if taps else h)

    @torch.no_grad()
    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final-normed [T, H] -> [T, V] logits."""
        return self.ranks.gather_vocab(self.head_projection(h), self.vocab_size)

    def forward_rows(self, token_ids: torch.Tensor, states: list[ModelState],
                     lengths: list[int], sampled: list[int] | None = None,
                     verify: frozenset[int] = frozenset(), keep_hidden: bool = False,
                     positions: torch.Tensor | None = None,
                     media: tuple[torch.Tensor, torch.Tensor] | None = None,
                     every: frozenset[int] = frozenset()):
        """One step's rows (see the module docstring); logits of each row listed in `sampled`
        (default: every row), in that order: its last token's, or every token's for a row in
        `verify` (a speculative verify row: the last sampled token, then the drafts). A verify
        row keeps its GDN states for `rollback`. `keep_hidden`: (logits, the final-normed
        hidden [T, H] of every token), which the MTP head drafts from (with `feature_taps`, the
        DFlash drafter's tap features [T, n·H] instead). `positions`: [3, T]
        multimodal positions (default: each row's text positions); `media`: (token rows [k],
        embeddings [k, H]) that replace those tokens' embeddings (the vision tower's output).
        `every`: rows that also get every token's logits, without a verify row's state trail
        (prompt log-probabilities)."""
        x = self.embed(token_ids)
        if media is not None:
            x = x.index_copy(0, media[0], media[1].to(x.dtype))
        h, features = self._decode(x, states, lengths, positions, verify)
        ends = list(itertools.accumulate(lengths))
        rows: list[int] = []
        for i in range(len(lengths)) if sampled is None else sampled:
            every_token = i in verify or i in every
            rows += range(ends[i] - lengths[i], ends[i]) if every_token else [ends[i] - 1]
        logits = self.logits(h[to_device(rows, h.device, torch.long)])
        return (logits, features) if keep_hidden else logits

    def rollback(self, state: ModelState, kept: int) -> None:
        """Keep the first `kept` (≥ 1) tokens of `state`'s last verify row: each GDN layer takes
        its state after them, each attention layer drops the keys and values after them."""
        dropped = len(next(layer.trail for layer in state.layers
                           if isinstance(layer, GDNState))) - kept
        for layer in state.layers:
            if isinstance(layer, GDNState):
                layer.rollback(kept)
            else:
                layer.truncate(layer.length - dropped)
        state.seen -= dropped

    def forward(
        self,
        token_ids: torch.Tensor,
        state: ModelState,
        positions: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Consume `token_ids` [T] continuing `state`; logits [T, V] (or [1, V] if last_only)."""
        h = self.hidden(self.embed(token_ids), [state], [token_ids.shape[0]], positions)
        return self.logits(h[-1:] if last_only else h)
