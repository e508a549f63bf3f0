"""A tensor-parallel rank other than 0: it loads its share of the model the way rank 0 does
(`rank_parts.load_rank`: the same pool, the same graphs), then runs every step rank 0
broadcasts (`lockstep`) until rank 0 stops it. It serves nothing and samples nothing; under
`--spec mtp` its share of the MTP head drafts alongside rank 0's (the drafts it computes are
rank 0's, which are the ones the plans carry), and under `--vision` it takes the encoder rows
rank 0 sends.

An exception here (an injected fault, a CUDA error, a collective that failed) ends the process
with status 2; rank 0 then fails in its next collective and the engine becomes FAILED.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import torch

from ..config import EngineConfig
from ..serving import prefill_chunk_for, serving_device, serving_dtypes, weights_mode
from ..faults import Faults
from ..rank_parts import load_rank
from ..step.families import make_runner
from ..step.speculation import mtp_drafter
from .group import RankGroup, join_from_env, leave
from .lockstep import DRAFT, FORWARD, IDLE, KEEP, STOP
from .shadows import MirroredVision, Shadows

log = logging.getLogger("ninfer.engine")


class Follower:
    """Rank `ranks.rank` (> 0) of the group whose rank 0 runs the `Engine`."""

    def __init__(self, config: EngineConfig, artifact: Any, ranks: RankGroup,
                 model: Any = None) -> None:
        """`model`: this rank's share already resident (the benchmarks draw it), else built
        from the artifact."""
        self.ranks = ranks
        device = serving_device(config)
        dtype, matmul = serving_dtypes(config, device)

        def with_model(built, weights):  # this rank's share of the MTP head
            if config.spec != "mtp":
                return None
            from ..tokenizer import Tokenizer  # rank 0 drafts over the tokenizer's ids

            return mtp_drafter(weights, built, Tokenizer.from_artifact(artifact).vocab_size,
                               matmul, config.lm_head_draft)

        parts = load_rank(config, artifact, device, dtype, matmul,
                          weights_mode(config, device, dtype, artifact),
                          prefill_chunk_for(config, device),
                          ranks, model, with_model=with_model)
        self.drafter = parts.extra
        sink = None if self.drafter is None else self._observe
        self.runner = make_runner(parts.model, parts.graphs, sink,
                                  MirroredVision() if config.vision else None)
        self.shadows = Shadows(parts.memory)
        self.faults = Faults(os.environ.get("NINFER_FAULT", ""), ranks.rank)
        self.steps = 0

    def run(self) -> None:
        """Run rank 0's steps until it says stop (an error in a collective raises)."""
        batch = None
        with torch.inference_mode():
            while True:
                kind, payload = self.ranks.broadcast()
                if kind == FORWARD:
                    self.faults.check_step(self.steps)
                    self.steps += 1
                    self.shadows.end(payload.ended, self.drafter)
                    batch = self.shadows.batch(payload)
                    if payload.media:
                        self._take_media(payload.media)
                    self.runner.forward(batch)
                elif kind == KEEP:
                    self.runner.keep(batch, payload)
                elif kind == DRAFT:
                    self.shadows.end(payload.ended, self.drafter)
                    self.drafter.propose_rows(self.shadows.rows(payload.rows), list(payload.ks))
                elif kind == IDLE and payload:
                    self.shadows.end(payload, self.drafter)
                elif kind == STOP:
                    return

    def _observe(self, seq, position: int, hidden: torch.Tensor) -> None:
        if seq.observed:  # as rank 0's `Speculator.observe` decided for the row
            self.drafter.observe(seq, position, hidden)

    def _take_media(self, items: tuple) -> None:
        """The encoder rows that follow the plan (`Leader.forward`)."""
        model = self.runner.model
        rows = torch.empty(sum(n for _, _, n in items), model.config["hidden_size"],
                           dtype=model.dtype, device=model.device)
        self.shadows.media(items, self.ranks.broadcast_tensor(rows))


def follower_main(config: EngineConfig, rank: int, world: int, master_port: int,
                  artifact: Any = None) -> None:
    """A spawned follower process: join the group on `127.0.0.1:master_port`, load (`artifact`,
    default: open `config.artifact`), run; any failure exits 2 (rank 0 sees the group break)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    try:
        from ..artifact import open_artifact

        ranks = join_from_env(serving_device(config))
        Follower(config, artifact or open_artifact(config.artifact), ranks).run()
    except BaseException:
        log.exception("tensor-parallel rank %d failed", rank)
        os._exit(2)  # no teardown: rank 0's next collective fails at once
    leave()
