"""The two families' eager forwards: every row of a step (decode, verify, prompt chunks) in one
model forward. `Runner` (llama family) packs the rows into one flat forward over the paged KV
pool; `HybridRunner` (Qwen3.5 family) runs each row's attention layers over its pages and its
GDN layers on its recurrent-state slot in place. The rest of a step (graphs, the chain) is
their base's, `runner._ModelRunner`.
"""
from __future__ import annotations

import torch

from ..host_copy import to_device
from ..kv import LayerKv
from ..models import Segment
from ..models.attention import plan_segments
from . import prompt_logprobs
from .runner import _ModelRunner


class Runner(_ModelRunner):
    """Owns the llama-family model; builds the flat token batch."""

    def _eager(self, work, sampled):
        tokens: list[int] = []
        positions: list[int] = []
        segments: list[Segment] = []
        logit_rows: list[int] = []
        rows = []  # (sequence, first position, logit rows, sampled?) for `prompt_logprobs.split`
        for seq, ids, verify in work:
            tokens.extend(ids)
            positions.extend(range(seq.cached, seq.cached + len(ids)))
            segments.append(Segment(seq.cache, seq.cached, len(ids)))
            end, every = len(tokens), verify or prompt_logprobs.scores_prompt(seq)
            if id(seq) in sampled or every:
                logit_rows.extend(range(end - len(ids), end) if every else [end - 1])
                rows.append((seq, seq.cached, len(ids) if every else 1, id(seq) in sampled))
        logits = self.model.forward(
            to_device(tokens, self.device),
            to_device(positions, self.device),
            segments,
            to_device(logit_rows, self.device, torch.long),
        )
        logits = prompt_logprobs.split(logits, rows)
        for seq, ids, _ in work:
            seq.cached += len(ids)
        return logits


class HybridRunner(_ModelRunner):
    """Owns the hybrid model; every row of a step in one forward, each row's attention layers
    over its paged KV and its GDN layers continuing its recurrent-state slot (a verify row
    keeping the state after each of its tokens, for `keep`)."""

    def _eager(self, work, sampled):
        tokens: list[int] = []
        states, lengths = [], []
        # several rows on CUDA: planned together, their attention is one launch a layer
        plans = plan_segments([Segment(seq.cache, seq.cached, len(ids)) for seq, ids, _ in work],
                              self.device) if len(work) > 1 and self.device.type == "cuda" else None
        for seq, ids, _ in work:
            views = [LayerKv(seq.cache, layer, seq.cached, plans)
                     for layer in range(len(self.model.attention_layers))]
            states.append(self.model.bind_state(views, seq.state.layers, seq.cached))
            tokens.extend(ids)
            lengths.append(len(ids))
        scored = frozenset(i for i, (seq, _, _) in enumerate(work)
                           if prompt_logprobs.scores_prompt(seq))
        rows = [i for i, (seq, _, _) in enumerate(work) if id(seq) in sampled or i in scored]
        verify = frozenset(i for i, (_, _, v) in enumerate(work) if v)
        sink = self.hidden_sink
        positions = media = None
        if self.vision is not None and any(seq.request.media is not None for seq, _, _ in work):
            positions, media = self.vision.step_inputs(work, self.device)
        out = self.model.forward_rows(to_device(tokens, self.device), states,
                                      lengths, rows, verify, keep_hidden=sink is not None,
                                      positions=positions, media=media, every=scored)
        logits, hidden = out if sink is not None else (out, None)
        logits = prompt_logprobs.split(logits, [
            (work[i][0], work[i][0].cached, lengths[i] if i in verify | scored else 1,
             id(work[i][0]) in sampled) for i in rows])
        start = 0
        for seq, ids, _ in work:
            if sink is not None:  # (the MTP drafter embeds media pads by their encoder rows)
                sink(seq, seq.cached, hidden[start: start + len(ids)])
            start += len(ids)
            seq.cached += len(ids)
            if getattr(seq, "media_rows", None) and seq.cached >= len(seq.prompt):
                seq.media_rows.clear()  # prefilled: the encoder rows are not needed again
        return logits

    def _rollback(self, seq, kept, q_len):
        for layer in seq.state.layers:
            if kept < q_len:
                layer.rollback(kept)
            else:
                layer.trail = None
