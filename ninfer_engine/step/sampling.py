"""Token sampling: penalties -> temperature -> top-k -> top-p -> min-p -> draw.

`sample_rows` picks the tokens of a whole step, one per row of logits [B, V], and copies them to
the host with a single `.tolist()` (one device->host sync per step, not one per request). Rows
are grouped by their path (`sampling_paths`: greedy rows take one `kernels.sampling.argmax`,
lowest id on ties; sampled rows draw among their path's candidates).

The penalties are `sampling_penalties`' (one kernel for the step's penalized rows); the
filtering rules and their order are `filter_logits`'s. The draw is inverse-CDF sampling, exact
categorical sampling: one uniform from the request's own seeded generator per sampled token is
located in the cumulative sum (fp64) of the filtered probabilities. A request consumes exactly one
uniform per sampled token whatever path or batch it is in, so the same seed and prompt give the
same tokens whatever else is batched with it.

A request may carry a grammar (`constrained.TokenConstraint`): its row's forbidden tokens are
set to -inf after the penalties, for every path, and each recorded token advances the grammar.
A request that asks for log-probabilities gets one `TokenLogprob` per output token, computed from
the logits as given (before penalties, masks and temperature, as vLLM's raw logprobs).
"""
from __future__ import annotations

import secrets
from array import array
from typing import Any

import torch

from ..host_copy import to_device
from ..types import GenerationRequest, SamplingParams, TokenLogprob
from .sampling_paths import CANDIDATES, path_of, staged
from .sampling_penalties import _penalized


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0,
                  min_p: float = 0.0) -> torch.Tensor:
    """Set to -inf every token that top-k, top-p (nucleus) or min-p rule out. logits: [V]."""
    if top_k <= 0 and top_p >= 1.0 and min_p <= 0.0:
        return logits  # nothing to filter: skip the full-vocabulary sort
    if top_k > 0 and top_k < logits.shape[-1]:
        # top-k first shrinks the sort that top-p needs
        values, indices = logits.topk(top_k)
    else:
        values, indices = logits.sort(descending=True)
    keep = torch.ones_like(values, dtype=torch.bool)
    if top_p < 1.0:
        probs = values.softmax(-1)
        # keep a token while the mass before it is below top_p; the first always stays
        # (top_p = 0 keeps it alone)
        keep &= (probs.cumsum(-1) - probs) < top_p
        keep[0] = True
    if min_p > 0.0:
        probs = values.softmax(-1)
        keep &= probs >= min_p * probs[0]
    out = torch.full_like(logits, float("-inf"))
    out[indices[keep]] = values[keep]
    return out


class Sampler:
    """Per-request sampler state: settings, a seeded generator, counts of generated tokens, and
    optionally a grammar and a log-probability sink."""

    def __init__(self, params: SamplingParams, constraint: Any = None,
                 logprobs: int | None = None, logprob_sink: list | None = None) -> None:
        self.params = params
        self.constraint = constraint
        self.logprobs = logprobs if logprob_sink is not None else None
        self.logprob_sink = logprob_sink
        self._pending: TokenLogprob | None = None  # the sampled token's entry, until recorded
        self.seed = params.seed if params.seed is not None else secrets.randbits(63)
        # a CPU generator: one uniform per token costs no device launch and no sync
        self.generator = torch.Generator()
        self.generator.manual_seed(self.seed & ((1 << 64) - 1))
        self.counts: dict[int, int] = {}  # written by `record` only (the arrays follow it)
        # `counts` again, as arrays the penalties copy in one go (`counted`), and each token's
        # index in them
        self._ids, self._times = array("q"), array("f")
        self._slots: dict[int, int] = {}

    @classmethod
    def for_request(cls, request: GenerationRequest) -> Sampler:
        return cls(request.sampling, request.constraint, request.logprobs, request.logprob_sink)

    @property
    def constrained(self) -> bool:
        """A grammar masks this row's next token."""
        return self.constraint is not None and self.constraint.active

    def sample(self, logits: torch.Tensor) -> int:
        """Pick the next token from one row of logits [V] and record it."""
        return sample_rows(logits[None], [self])[0]

    def uniform(self) -> float:
        """The next uniform in [0, 1) of this request's stream (one per sampled token)."""
        return float(torch.rand((), generator=self.generator, dtype=torch.float64))

    def counted(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`counts` as host tensors (token ids, fp32 counts), copied from the arrays `record`
        keeps (a copy: the arrays grow while the tensors live on)."""
        if not self._ids:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float32)
        return (torch.frombuffer(self._ids, dtype=torch.long).clone(),
                torch.frombuffer(self._times, dtype=torch.float32).clone())

    def record(self, token: int) -> None:
        """Count an output token (sampled here or forced by the engine) for the penalties, the
        grammar and the log-probabilities."""
        self.counts[token] = self.counts.get(token, 0) + 1
        slot = self._slots.get(token)
        if slot is None:  # a new token: the next slot
            self._slots[token] = len(self._ids)
            self._ids.append(token)
            self._times.append(1.0)
        else:
            self._times[slot] += 1.0
        if self.constraint is not None:
            self.constraint.advance(token)
        if self.logprob_sink is not None:
            entry, self._pending = self._pending, None
            self.logprob_sink.append(entry if entry is not None and entry.token == token
                                     else TokenLogprob(token, None))


def sample_rows(logits: torch.Tensor, samplers: list[Sampler]) -> list[int]:
    """One token per row of logits [B, V], row i by samplers[i]; records each and returns them."""
    if not samplers:
        return []
    return settle_rows(logits, samplers, pick_rows(logits, samplers))


class Picked:
    """A step's tokens as picked on the logits' device [B], and their copy on its way to the
    host: `tokens` can feed the next forward before the host has read them (the engine's
    lookahead step); `values()` waits for the copy only, not for work queued after it."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens
        self._event = None
        if tokens.is_cuda:
            self._host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self._host.copy_(tokens, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = tokens

    def values(self) -> list[int]:
        """The tokens on the host (the step's one device->host wait)."""
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()


def pick_rows(logits: torch.Tensor, samplers: list[Sampler],
              pending: torch.Tensor | None = None) -> Picked:
    """The tokens of logits [B, V], row i by samplers[i], picked on the device and not read
    back: penalties, masks, filters and draws are queued behind the forward. `pending` [B]:
    the picks of the step in flight, not recorded by the samplers yet (penalties count them)."""
    logits = _constrained(_penalized(logits, samplers, pending), samplers)
    groups: dict[str, list[int]] = {path: [] for path in CANDIDATES}
    for i, s in enumerate(samplers):
        groups[path_of(s.params)].append(i)
    order, parts = [], []
    for path, rows in groups.items():
        if not rows:
            continue
        order += rows
        group = [samplers[i] for i in rows]
        probs, ids = CANDIDATES[path](_rows(logits, rows), group)
        pick = probs if path == "greedy" else _draw(probs, group)  # greedy comes back picked
        parts.append((pick if ids is None else ids.gather(1, pick))[:, 0])
    tokens = torch.cat(parts) if len(parts) > 1 else parts[0]
    if order != sorted(order):  # back to row order
        inverse = sorted(range(len(order)), key=order.__getitem__)
        tokens = tokens[staged(torch.tensor(inverse), logits.device)]
    return Picked(tokens)


def settle_rows(given: torch.Tensor, samplers: list[Sampler], picked: Picked) -> list[int]:
    """The picked tokens on the host, recorded by their samplers (log-probabilities from
    `given`, the logits as the forward returned them: read before another step overwrites)."""
    tokens = picked.values()
    _logprobs(given, samplers, tokens)
    for s, token in zip(samplers, tokens):
        s.record(token)
    return tokens


def settles_on_device(sampler: Sampler) -> bool:
    """Its next token needs nothing from the host once this one is picked: no grammar (host
    matcher), no log-probabilities (read from the step's logits). Penalties qualify: the
    next pick counts this one on the device (`pick_rows`'s `pending`)."""
    return sampler.constraint is None and sampler.logprobs is None


def _constrained(logits: torch.Tensor, samplers: list[Sampler]) -> torch.Tensor:
    """Grammar masks on the rows whose request has an active one; others untouched. The masks
    prefetched during the forward (`prefetch_masks`) are used where still current."""
    rows = [i for i, s in enumerate(samplers) if s.constrained]
    if not rows:
        return logits
    # llguidance only when a grammar is used
    from ..constrained import prefetch
    from ..constrained.mask import apply_constraints

    constraints = [samplers[i].constraint for i in rows]
    bits = prefetch.bitmasks(constraints, pin=logits.device.type == "cuda")
    return apply_constraints(logits, rows, constraints, bits)


def prefetch_masks(samplers: list[Sampler], device: torch.device) -> None:
    """Start filling the next grammar masks of the constrained ones of `samplers` (the rows
    that go on to the next step) in the background, for logits on `device`
    (`constrained.prefetch`). The engine calls it once a step, after the step's tokens are
    recorded; without a grammar in the batch it costs one pass over the samplers."""
    constraints = [s.constraint for s in samplers if s.constrained]
    if not constraints:
        return
    from ..constrained import prefetch

    prefetch.start(constraints, pin=device.type == "cuda")


def _logprobs(logits: torch.Tensor, samplers: list[Sampler], tokens: list[int]) -> None:
    """Each asking row's entry for its token: log_softmax of its row of `logits`, the token's
    value and the top alternatives (one more host copy, only when some row asks)."""
    rows = [i for i, s in enumerate(samplers) if s.logprobs is not None]
    if not rows:
        return
    index = torch.tensor(rows, device=logits.device)
    logp = logits.index_select(0, index).float().log_softmax(-1)
    chosen = logp.gather(1, torch.tensor([[tokens[i]] for i in rows], device=logits.device))
    k = max(samplers[i].logprobs for i in rows)
    top_values, top_ids = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())
    for i, value, values, ids in zip(rows, chosen[:, 0].tolist(), top_values.tolist(),
                                     top_ids.tolist()):
        n = samplers[i].logprobs
        samplers[i]._pending = TokenLogprob(tokens[i], value, tuple(zip(ids[:n], values[:n])))


def _rows(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The given rows, without a copy when they are all of them."""
    if len(rows) == logits.shape[0]:
        return logits
    return logits.index_select(0, to_device(rows, logits.device))


def _draw(probs: torch.Tensor, samplers: list[Sampler]) -> torch.Tensor:
    """Inverse CDF: per row, the first column whose cumulative mass exceeds u·total. [n, 1]."""
    cdf = probs.double().cumsum(-1)  # fp64: 250K-term sums stay exact enough for the tail
    u = staged(torch.tensor([s.uniform() for s in samplers], dtype=torch.float64), probs.device)
    # a zero-probability column never wins: its cdf equals the previous one
    pick = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)
    return pick.clamp_(max=probs.shape[-1] - 1)


