"""DFlash2's two additions to the DFlash block (model-math.md §3.3; layout and arithmetic as vLLM's
`qwen3_dflash2.py` serves the published checkpoints, whose draft tokens its speculator's
`_selector_walk_kernel` picks).

`GroupedConv`: a grouped dynamic causal convolution over the rows of one proposal block
([anchor, MASK×k]), one before and one after each attention and MLP. From a block row's normed
input x_t the layer's `kernel_projection` gives, per side (before, after), tap and group of
`group` channels, a coefficient d; side s's output row t is Σ_tap (base[s, tap] + d[s, tap]) ·
x[t − tap], channel by channel (a group's channels share d), rows before the block's first
counting as zeros. `prepare` convolves the input with side 0 and keeps side 1's coefficients
for `finish`, which convolves the attention's (or MLP's) output with them.

`CandidateSelector`: draft tokens from the block's final-normed mask rows h_1..h_k. Row l's
unary logits are the target head's over h_l, its candidates their `top_k` largest (each value
times `output_multiplier`, softcapped where the config asks). The walk goes left to right
from the anchor: the score of candidate c after predecessor p is unary(c) +
(P[p] ⊙ W h_l) · S[c] (P, S: the predecessor and successor codebooks [V, rank], W:
`hidden_projection` [rank, H]); the greedy walk takes the best (the first of equals), which is
then row l + 1's predecessor. A sampled row's walk draws each step's pick from softmax(scores /
its temperature) over the candidates (vLLM's sampled walk, with the request's own uniforms by
inverse CDF instead of Gumbel noise) and keeps that proposal distribution q, which the
verification's rejection test divides by (`step.acceptance.accept_sampled`).

Both compute in fp32 and round once where the block's activations are stored.
"""
from __future__ import annotations

import itertools

import torch

from ..host_copy import to_device
from .layers import Linear


class GroupedConv:
    """One branch's convolution pair (`dflash2/layers/i/{attention,mlp}_conv/`)."""

    def __init__(self, params, p: str, hidden: int, taps: int, group: int,
                 matmul_dtype=None) -> None:
        self.taps, self.groups = taps, hidden // group
        self.base = params(p + "base_kernel", (2, taps, hidden))
        self.projection = Linear(params(p + "kernel_projection", (2 * taps * self.groups, hidden)),
                                 matmul_dtype, relayout=False)

    def prepare(self, x: torch.Tensor, at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows x [T, H], row t at place at[t] of its block (`block_positions`), convolved with
        side 0; side 1's coefficients."""
        d = self.projection(x).float().view(x.shape[0], 2, self.taps, self.groups)
        return self._convolve(x, d[:, 0], self.base[0], at), d[:, 1]

    def finish(self, y: torch.Tensor, after: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        return self._convolve(y, after, self.base[1], at)

    def _convolve(self, x: torch.Tensor, d: torch.Tensor, base: torch.Tensor,
                  at: torch.Tensor) -> torch.Tensor:
        T, H = x.shape
        rows = x.float().view(T, self.groups, H // self.groups)
        weight = base.float().view(1, self.taps, self.groups, -1) + d[..., None]
        out = weight[:, 0] * rows
        for tap in range(1, self.taps):
            shifted = torch.cat([rows.new_zeros(tap, *rows.shape[1:]), rows[:-tap]])
            out = out + weight[:, tap] * shifted * (at >= tap).view(-1, 1, 1)
        return out.view(T, H).to(x.dtype)


def block_positions(sizes: list[int], device: torch.device) -> torch.Tensor:
    """Each row's place in its block, for blocks of `sizes` rows (taps reaching before a
    block's first row read zeros): once a proposal, for every convolution of it."""
    return to_device([i for n in sizes for i in range(n)], device, torch.long)


def conv_in(conv: GroupedConv | None, y: torch.Tensor, at: torch.Tensor | None):
    """A branch's input through its convolution (as it is without one: DFlash), and the
    coefficients of the convolution after the branch."""
    return (y, None) if conv is None else conv.prepare(y, at)


def conv_out(conv: GroupedConv | None, y: torch.Tensor, after, at: torch.Tensor | None):
    return y if conv is None else conv.finish(y, after, at)


class CandidateSelector:
    """`dflash2/candidate_selector/`: the walk (greedy, or sampled) over each row's
    candidates."""

    def __init__(self, params, hidden: int, vocab: int, rank: int, top_k: int,
                 scale: float, softcap: float | None) -> None:
        self.top_k, self.scale, self.softcap = top_k, scale, softcap
        self.projection = params("dflash2/candidate_selector/hidden_projection", (rank, hidden))
        self.before = params("dflash2/candidate_selector/predecessor_codebook", (vocab, rank))
        self.after = params("dflash2/candidate_selector/successor_codebook", (vocab, rank))

    def candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, unary values) [T, top_k] of logits [T, V], best first."""
        values, ids = torch.topk(logits.float(), self.top_k, dim=-1)
        values = values * self.scale
        if self.softcap is not None:
            values = torch.tanh(values / self.softcap) * self.softcap
        return ids, values

    def walk(self, logits: torch.Tensor, hidden: torch.Tensor, anchors: list[int],
             sizes: list[int], draws: list | None = None) -> tuple[list[int], list]:
        """The drafts of rows of `sizes` mask rows each (their logits [T, V] and final-normed
        hiddens [T, H], rows in order), each row's walk from its anchor token, and each row's
        proposal distributions: None for a greedy walk, else a (candidate ids [K], q [K]) host
        pair a step. `draws[r]`: None (greedy), or row r's (temperature, uniforms a step)."""
        dev = logits.device
        ids, unary = self.candidates(logits)
        context = hidden.float() @ self.projection.float().t()  # [T, rank]
        starts = list(itertools.accumulate(sizes[:-1], initial=0))
        previous = to_device(anchors, dev, torch.long)
        chosen = torch.empty(hidden.shape[0], dtype=torch.long, device=dev)
        draws = draws or [None] * len(sizes)
        sampled = [r for r, d in enumerate(draws) if d is not None]
        if sampled:  # each row's temperature and uniforms (greedy rows: unused placeholders)
            temperature = to_device([d[0] if d else 1.0 for d in draws], dev, torch.float64)
            uniforms = to_device([list(d[1]) + [0.0] * (max(sizes) - len(d[1])) if d
                                  else [0.0] * max(sizes) for d in draws], dev, torch.float64)
            walking = to_device([d is not None for d in draws], dev, torch.bool)
        kept = []  # (step, live rows, their q) of the sampled walks
        for step in range(max(sizes)):
            live = [r for r, n in enumerate(sizes) if n > step]
            rows = to_device(live, dev, torch.long)  # (one copy a step, for every index below)
            at = to_device([starts[r] + step for r in live], dev, torch.long)
            scores = unary[at] + torch.einsum(
                "br,bkr->bk", self.before[previous[rows]].float() * context[at],
                self.after[ids[at]].float())
            index = scores.argmax(-1)
            if sampled:
                q = torch.softmax(scores.double() / temperature[rows, None], -1)
                cdf = q.cumsum(-1)
                draw = torch.searchsorted(cdf, (uniforms[rows, step] * cdf[:, -1])[:, None],
                                          right=True)[:, 0].clamp(max=q.shape[1] - 1)
                index = torch.where(walking[rows], draw, index)
                kept.append((step, live, q))
            pick = ids[at].gather(1, index[:, None])[:, 0]
            chosen[at] = pick
            previous[rows] = pick
        proposals: list = [None] * len(sizes)
        host_ids = ids.cpu() if sampled else None
        for r in sampled:
            proposals[r] = []
        for step, live, q in kept:
            q = q.cpu()
            for j, r in enumerate(live):
                if draws[r] is not None:
                    proposals[r].append((host_ids[starts[r] + step], q[j]))
        return chosen.tolist(), proposals
