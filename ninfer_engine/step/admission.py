"""The request-level checks a sequence passes at admission, before it takes a KV lease: each
failure a `RequestError` the request ends with (the protocol's 400), never the engine's."""
from __future__ import annotations

from .sequence import RequestError, Sequence


def check_admissible(seq: Sequence, max_context: int, budget_tokens: int | None,
                     vocab_size: int, tensor_parallel: bool) -> None:
    """Raise `RequestError` where `seq` cannot run: an empty prompt, one past `max_context`
    or the per-request KV budget (`--kv-budget-gib`, `budget_tokens`), prompt log-probabilities
    under tensor parallelism, or token ids outside the vocabulary."""
    prompt = seq.prompt
    if not prompt:
        raise RequestError("the prompt is empty")
    if len(prompt) + 1 > max_context:
        raise RequestError(
            f"prompt of {len(prompt)} tokens does not fit max context {max_context}",
            "context_length_exceeded")
    if budget_tokens is not None and len(prompt) + 1 > budget_tokens:
        raise RequestError(
            f"prompt of {len(prompt)} tokens does not fit the per-request KV budget of "
            f"{budget_tokens} tokens (--kv-budget-gib)", "context_length_exceeded")
    if seq.request.prompt_logprobs is not None and tensor_parallel:
        raise RequestError("prompt log-probabilities are not built for --tp > 1 "
                           "(the other ranks do not score prompt positions)")
    for what, ids in (("prompt", prompt), ("thinking close", seq.request.thinking_close_ids)):
        if ids and (max(ids) >= vocab_size or min(ids) < 0):
            raise RequestError(f"the {what} contains token ids outside the vocabulary")
