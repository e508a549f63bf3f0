"""What a `--spec mtp` pair (h_t, x_{t+1}) takes from its sequence besides the hidden h_t
(`mtp_drafter`): the tokens x_{t+1} (`_tokens`, the prompt followed by the output), whether a
position's token can be embedded yet (`_embeddable`: text, or a media pad whose item is encoded),
and the vision rows that embed the pairs whose token is a media placeholder (`_pair_media`).
"""
from __future__ import annotations

import torch

from .mtp_round import media_of


def _pair_media(work: list, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(pair rows, vision rows) of the pairs of `work` ((seq, row, n): its next `n` pairs)
    whose token x_{t+1} is a media placeholder, or None. The rows are the request's encoded
    items (`seq.media_rows`), at hand while its prompt's chunks run."""
    rows, embeds, at = [], [], 0
    for seq, row, n in work:
        media = media_of(seq)
        for span, lo, hi in media.spans_in(row.done + 1, n) if media is not None else ():
            encoded = seq.media_rows.get(span.item)
            if encoded is not None:  # (always, for a prompt's pairs: `observe`)
                first = span.row + lo - span.start
                rows.append(torch.arange(at + lo - row.done - 1, at + hi - row.done - 1))
                embeds.append(encoded[first: first + hi - lo])
        at += n
    if not rows:
        return None
    return torch.cat(rows).to(device), torch.cat(embeds).to(device)


def _embeddable(seq, position: int) -> bool:
    """Whether the token at `position` of `seq` can be embedded now: text, or a media pad
    whose item's encoder rows are at hand (`seq.media_rows`, kept while the prompt runs)."""
    media = media_of(seq)
    spans = media.spans_in(position, 1) if media is not None else ()
    return all(span.item in seq.media_rows for span, _, _ in spans)


def _tokens(seq, begin: int, end: int) -> list[int]:
    """The tokens at positions begin .. end-1 of `seq`'s prompt followed by its output."""
    p = len(seq.prompt)
    return [*seq.prompt[begin:end], *seq.output[max(begin - p, 0): max(end - p, 0)]]
