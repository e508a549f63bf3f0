"""`--spec mtp` drafting on CUDA reads its drafts back once a round: the k head steps are queued
back to back, none waiting on the host for the step before (each `torch.tensor(list,
device=cuda)` or `.tolist()` between them was a stream sync that left the GPU idle while the
host launched the next step's kernels)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.artifact.hf_names import (logical_params_from_hf, mtp_params_from_hf,
                                             text_config_from_hf)
from ninfer_engine.kv import KvStorage, PagePool, codecs_for
from ninfer_engine.models.mtp import MtpHead
from ninfer_engine.models.qwen3_5 import Qwen35Model, dict_params
from ninfer_engine.step.mtp_drafter import MtpDrafter
from tests.models.mtp_tiny import HfMtp
from tests.models.qwen35_tiny import hf_model

from .helpers import cuda_syncs


def _seq(storage: KvStorage, prompt: list[int], output: list[int]):
    """What the drafter reads of a sequence: its tokens, how many are computed and its pages
    (the MTP layer's K/V: the pool's last layer; no drafter rows: `keeps_rows` is false)."""
    cache = storage.new_cache()
    assert cache.reserve(len(prompt) + len(output) + 8)  # and the drafts of two rounds
    return SimpleNamespace(prompt=prompt, output=output, cached=len(prompt) + len(output) - 1,
                           cache=cache, request=SimpleNamespace(prompt_cache=False))


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
@torch.inference_mode()
def test_a_round_of_mtp_drafts_syncs_once(family, device):
    """On the CPU (where nothing syncs) the round's drafts only; on CUDA its syncs too."""
    dev = device
    # served weights are bf16 on CUDA: the MoE head's stacked experts run grouped GEMMs then
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    hf = hf_model(family)
    config = text_config_from_hf(hf.config)
    target = Qwen35Model(config, dict_params({k: t.to(dev, dtype) for k, t in
                                              logical_params_from_hf(hf.state_dict(),
                                                                     config).items()}))
    head = MtpHead(target, dict_params({k: t.to(dev, dtype) for k, t in mtp_params_from_hf(
        HfMtp(family).checkpoint(), target.config).items()}))
    drafter = MtpDrafter(head, target.vocab_size)
    layers, heads, dim = target.kv_layout()
    storage = KvStorage(PagePool(4), layers + drafter.kv_layers, heads, dim,
                        codecs_for("bf16", dtype), dtype, dev)
    gen = torch.Generator().manual_seed(2)
    seqs = [_seq(storage, torch.randint(0, target.vocab_size, (n,), generator=gen).tolist(), [7])
            for n in (9, 5)]
    for seq in seqs:  # the target computed every position but the last output's
        drafter.observe(seq, 0, torch.randn(seq.cached, target.config["hidden_size"],
                                            device=dev, dtype=dtype))
    drafter.propose_rows(seqs, [3, 3])  # the kernels' first launches, outside the count
    for seq, token in zip(seqs, (11, 12)):  # the target verified one more position
        seq.output.append(token)
        seq.cached += 1
        drafter.observe(seq, seq.cached - 1,
                        torch.randn(1, config["hidden_size"], device=dev, dtype=dtype))
    if dev.type != "cuda":
        assert [len(d) for d in drafter.propose_rows(seqs, [3, 2])] == [3, 2]
        return
    torch.cuda.synchronize()
    with cuda_syncs() as syncs:
        drafts = drafter.propose_rows(seqs, [3, 2])
    assert [len(d) for d in drafts] == [3, 2]
    assert len(syncs) == 1, syncs  # the round's drafts, read back together
