"""A debugging aid: with this folder first on PYTHONPATH every Python process (the engine's
spawned process too) logs, at INFO on `ninfer.engine`, each step's rows as the runner gets them
(decode rows' draft counts; chunks as (tokens, cached, prompt length)) and each eager forward's
rows ((tokens, verify?)). `TRACE=1 bash bench/start_capture_device.sh` serves with it, to find
which step a `Triton compiled … while serving` line came from and whether the warm-up ran it."""
import logging

from ninfer_engine.step import family_runners, runner

log = logging.getLogger("ninfer.engine")
_forward, _eager = runner._ModelRunner._forward, family_runners.HybridRunner._eager


def _traced_forward(self, batch, sampled):
    log.info("trace step: decode drafts %s, chunks %s",
             [len(batch.drafts_of(i)) for i in range(len(batch.decode))],
             [(c.tokens, c.seq.cached, len(c.seq.prompt)) for c in batch.chunks])
    return _forward(self, batch, sampled)


def _traced_eager(self, work, sampled):
    log.info("trace eager: rows %s", [(len(ids), bool(verify)) for _, ids, verify in work])
    return _eager(self, work, sampled)


runner._ModelRunner._forward = _traced_forward
family_runners.HybridRunner._eager = _traced_eager
