"""A sampled row's path, and the candidates it draws among (`sampling.sample_rows` draws them;
the verify step's acceptance, `acceptance` and `chain_accept`, tests drafts against them).

`path_of(params)` depends on the row's own settings only, so its draws do not depend on the
batch: greedy (temperature 0); top_k (1 <= top_k <= `TOPK_CAP`, among the
`kernels.sampling.topk` candidates: the chunked Triton kernel on CUDA reads the vocabulary once,
no full sort); sorted (other rows that filter: top-p, min-p, a larger top-k, the exact
full-vocabulary sort); plain (no filter: the softmax over the vocabulary, unsorted).
`CANDIDATES[path](logits, samplers)` gives (probabilities, ids) of a group of rows on one path,
`filter_logits`' rules applied (`samplers`: `sampling.Sampler`s, whose `params` it reads).
"""
from __future__ import annotations

import torch

from ..kernels import sampling as kernels
from ..types import SamplingParams

# The top-k kernel takes k max-and-mask rounds over each 4096-column chunk and then sorts
# n_chunks·k candidates per row: past a few hundred rounds that costs about a full sort, while
# real presets use top_k 20–100. Larger top_k keeps the exact full-vocabulary path.
TOPK_CAP = 256


def staged(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on `device` without waiting for the work queued there (a pageable
    source is staged at once, so the temporary may go)."""
    return host.to(device, non_blocking=True)


def path_of(p: SamplingParams) -> str:
    """A row's path depends on its own settings only, so its draws do not depend on the batch."""
    if p.greedy:
        return "greedy"
    if 0 < p.top_k <= TOPK_CAP:
        return "top_k"
    return "sorted" if p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0 else "plain"


def _columns(samplers: list, device: torch.device) -> list[torch.Tensor]:
    """Per-row temperature, top_k (0 = all), top_p, min_p as fp32 [n, 1] columns (one copy);
    fp32 because torch applies `filter_logits`' Python scalars to its fp32 logits in fp32."""
    table = [[s.params.temperature, s.params.top_k, s.params.top_p, s.params.min_p]
             for s in samplers]
    return list(staged(torch.tensor(table, dtype=torch.float32), device).unsqueeze(-1).unbind(1))


def _filter_sorted(values: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   min_p: torch.Tensor) -> torch.Tensor:
    """`filter_logits` on rows sorted descending [n, N]: the probabilities of the kept
    tokens (renormalised implicitly by the draw), 0 elsewhere."""
    pos = torch.arange(values.shape[-1], device=values.device)
    in_k = (pos < top_k) | (top_k <= 0)
    # top-p and min-p see the softmax over the top-k survivors, as in filter_logits
    probs = values.masked_fill(~in_k, float("-inf")).softmax(-1)
    # top_p = 1 must keep everything even where the fp32 cumsum rounds past 1; the likeliest
    # token always stays (top_p = 0 keeps it alone, not nothing)
    keep = in_k & (((probs.cumsum(-1) - probs) < top_p) | (top_p >= 1.0) | (pos == 0))
    keep &= probs >= min_p * probs[:, :1]
    return probs.masked_fill(~keep, 0.0)


def _greedy(logits: torch.Tensor, samplers: list) -> tuple[torch.Tensor, None]:
    """Greedy rows: the argmax [n, 1] (lowest id on ties), no draw."""
    return kernels.argmax(logits)[:, None], None


def _top_k_candidates(logits: torch.Tensor,
                      samplers: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with 1 <= top_k <= TOPK_CAP: (filtered probs, ids) of the top-k candidates [n, k]."""
    k = candidate_count(max(s.params.top_k for s in samplers), logits.shape[-1])
    return top_k_candidates(logits, k, *_columns(samplers, logits.device))


def candidate_count(top_k: int, vocab: int) -> int:
    """The candidates the top-k path takes for rows of at most `top_k`: a power of two bounds
    how many kernel variants (k is a constexpr) ever compile."""
    return min(1 << (top_k - 1).bit_length(), vocab)


def top_k_candidates(logits: torch.Tensor, k: int, temperature: torch.Tensor,
                     top_k: torch.Tensor, top_p: torch.Tensor,
                     min_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(filtered probs, ids) [n, k] of rows of `logits` [n, V] whose top_k ≤ k, their settings
    as fp32 [n, 1] columns on the device (a captured graph's buffers: no host work)."""
    values, ids = kernels.topk(logits, k)  # fp32, descending; temperature keeps the order
    # ties by lowest id (Triton does so already; torch.topk does not promise an order), so a
    # row's candidate order does not depend on the batch's k
    ids, by_id = ids.sort(dim=-1, stable=True)
    values, by_value = values.gather(1, by_id).sort(dim=-1, descending=True, stable=True)
    ids = ids.gather(1, by_value)
    return _filter_sorted(values / temperature, top_k, top_p, min_p), ids


def _sorted_candidates(logits: torch.Tensor,
                       samplers: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact full-vocabulary path for rows that filter: (filtered probs, ids) [n, V]."""
    temperature, top_k, top_p, min_p = _columns(samplers, logits.device)
    # stable: ties in id order whatever the batch, so the same uniform picks the same token
    values, ids = (logits.float() / temperature).sort(dim=-1, descending=True, stable=True)
    return _filter_sorted(values, top_k, top_p, min_p), ids


def _plain_candidates(logits: torch.Tensor, samplers: list) -> tuple[torch.Tensor, None]:
    """Rows that do not filter: the softmax over the vocabulary in id order, no sort."""
    temperature = _columns(samplers, logits.device)[0]
    return (logits.float() / temperature).softmax(-1), None


CANDIDATES = {"greedy": _greedy, "top_k": _top_k_candidates, "sorted": _sorted_candidates,
               "plain": _plain_candidates}
