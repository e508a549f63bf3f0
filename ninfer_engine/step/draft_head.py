"""`--lm-head-draft`: MTP drafts argmax over the artifact's proposal head instead of the whole
head (ninfer-format.md §3, the text component's `proposal`).

An `indexed` proposal is a shortlist of the head: `proposal/head [rows, H]` and the token id of
each row, `proposal/token_ids [rows]`; a draft is the token of the best row, so drafting reads
rows / vocabulary of the head's bytes. Verification still uses the whole head, so outputs are
unchanged; only which tokens can be drafted narrows. A `full` proposal is the head itself.
"""
from __future__ import annotations

import torch

from ..models.mtp import MtpMissing
from ..models.qwen3_5_step_weights import FusedLinear


class IndexedDraftHead:
    """Argmax over a shortlist of the head's rows, returned as token ids, on the device with
    no host sync (the captured draft round, `mtp_round`, runs it too)."""

    def __init__(self, weight: torch.Tensor, token_ids: torch.Tensor) -> None:
        self.weight, self.token_ids = weight, token_ids
        self.matrix = FusedLinear(weight)  # the decode step's GEMV for one row, as the head's

    def argmax(self, h: torch.Tensor) -> torch.Tensor:
        """[T, H] MTP outputs -> [T] drafted token ids."""
        return self.token_ids[self.matrix(h.to(self.weight.dtype)).argmax(-1)]


def load_draft_head(artifact, hidden: int, vocab: int, device: torch.device,
                    dtype: torch.dtype) -> IndexedDraftHead | None:
    """The proposal head of `artifact` (None: its proposal is the full head); `MtpMissing`
    naming what is absent or out of range."""
    where = getattr(artifact, "path", None) or getattr(artifact, "name", None) or "the artifact"
    components = getattr(artifact, "components", None) or {}
    proposal = components.get("text", {}).get("proposal")
    if proposal is None:
        raise MtpMissing(f"--lm-head-draft needs the artifact's proposal head (the text "
                         f"component's `proposal`, written by converting with --proposal); "
                         f"{where} has none")
    if proposal["domain"] == "full":
        return None
    rows = proposal["rows"]
    for name in ("proposal/head", "proposal/token_ids"):
        if not artifact.has_parameter(name):
            raise MtpMissing(f'the indexed proposal of {where} lacks "{name}"')
    weight = artifact.parameter("proposal/head", (rows, hidden)).to(device, dtype)
    token_ids = artifact.parameter("proposal/token_ids", (rows,), torch.int64).to(device)
    if int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab:
        raise MtpMissing(f"the proposal of {where} names token ids outside the vocabulary "
                         f"(0..{vocab - 1})")
    return IndexedDraftHead(weight, token_ids)
