"""`--lm-head-draft`: MTP drafts argmax over the artifact's proposal head instead of the whole
head (ninfer-format.md §3, the text component's `proposal`).

An `indexed` proposal is a shortlist of the head: `proposal/head [rows, H]` and the token id of
each row, `proposal/token_ids [rows]`; a draft is the token of the best row, so drafting reads
rows / vocabulary of the head's bytes. Verification still uses the whole head, so outputs are
unchanged; only which tokens can be drafted narrows. A `full` proposal is the head itself.

The shortlist is read at a byte a weight, as fp8-row codes:
- where the head is served packed (fp8-row, or Q4/Q5 as fp8 groups). In bf16 the real
  artifacts' 131,072 rows (0.54 GB at H 2,048) read more bytes than the whole fp8-row head
  (248,320 rows, 0.51 GB): on the H100 such a shortlist saved nothing a round
  (h100-mtp-sampled-chain.md);
- on CUDA where the head is served in bf16/fp16 too: a draft needs only the argmax, and the
  27B's 131,072 rows read 0.67 GB a draft instead of 1.34.
On the CPU a dense head's shortlist stays dense: the CPU dequantizes a packed matrix whole
before its matmul.
"""
from __future__ import annotations

import torch

from ..models.mtp import MtpMissing
from ..kernels.dequant_gemv import quantize_fp8_row
from ..models.packed import FP8_ROW, PackedBlock, PackedMatrix
from ..models.qwen3_5_step_weights import FusedLinear

ENCODE_ROWS = 8192


class IndexedDraftHead:
    """Argmax over a shortlist of the head's rows (`weight`: dense, or a `PackedMatrix`),
    returned as token ids, on the device with no host sync (the captured draft round,
    `mtp_round`, runs it too); `dtype`: the MTP outputs' (the model's) dtype."""

    def __init__(self, weight: torch.Tensor | PackedMatrix, token_ids: torch.Tensor,
                 dtype: torch.dtype) -> None:
        self.weight, self.token_ids, self.dtype = weight, token_ids, dtype
        self.matrix = FusedLinear(weight)  # the decode step's GEMV for one row, as the head's

    def argmax(self, h: torch.Tensor) -> torch.Tensor:
        """[T, H] MTP outputs -> [T] drafted token ids."""
        return self.token_ids[self.matrix(h.to(self.dtype)).argmax(-1)]


def shortlist_form(rows: torch.Tensor, head: torch.Tensor | PackedMatrix
                   ) -> torch.Tensor | PackedMatrix:
    """The shortlist `rows` as the draft reads them: fp8-row codes where the head is packed or
    the rows are bf16/fp16 on CUDA (a proposal stored fp8-row gets its stored codes back:
    decoding and encoding again is exact), else as they are."""
    dense_cuda = rows.is_cuda and rows.dtype in (torch.bfloat16, torch.float16)
    if not isinstance(head, PackedMatrix) and not dense_cuda:
        return rows
    # a block of rows at a time: the encoder's fp32 temporaries stay small beside the weights
    parts = [quantize_fp8_row(rows[r: r + ENCODE_ROWS]) for r in range(0, len(rows), ENCODE_ROWS)]
    planes = tuple(torch.cat(plane) for plane in zip(*parts))
    return PackedMatrix([PackedBlock(FP8_ROW, rows.shape[0], rows.shape[1], planes)])


def load_draft_head(artifact, head: torch.Tensor | PackedMatrix, vocab: int,
                    device: torch.device, dtype: torch.dtype) -> IndexedDraftHead | None:
    """The proposal head of `artifact` over the model's `head` weight (None: its proposal is
    the full head); `MtpMissing` naming what is absent or out of range."""
    hidden = head.shape[1]
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
    return IndexedDraftHead(shortlist_form(weight, head), token_ids, dtype)
