"""The host's bookkeeping of the captured expert step (`InPlaceReads.settle`: counts, the slot
policy, admissions, the table), per decode step, on the Flash-Next layer shape: 16 MoE layers,
top-10 of 512 experts, 256 resident. This runs on the engine's thread while the GPU computes
the next step; where it nears the step time, the host bounds the rate (issue 20's 25 % skewed
row: 1.07 ms of a 1.63 ms step on the H200).

    python3 bench/expert_settle.py [--out bench/results/cpu-expert-settle]
    PYTHONPATH=<an older tree> python3 -P bench/expert_settle.py   # the same on other code

Host tensors (the copies an admission queues are CPU copies here, CUDA launches there), small
experts (the bookkeeping does not depend on their size), routing drawn with popularity
∝ rank^-s (s = 0: uniform), 200 warm-up steps, then 400 timed.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from ninfer_engine.experts.in_place import InPlaceReads, Tables
from ninfer_engine.experts.slot_cache import LfuAgingPolicy
from ninfer_engine.experts.tier import LayerTier
from ninfer_engine.models.experts import ExpertStack

E, I, H, L, S, K = 512, 64, 128, 16, 256, 10
WARM, TIMED = 200, 400


def settle_ms(skew: float) -> tuple[float, float]:
    """(ms a step, admissions a step) over the timed steps."""
    rng = np.random.default_rng(0)
    w = np.arange(1, E + 1, dtype=float) ** -skew
    rng.shuffle(w)
    p = w / w.sum()
    traces = [[rng.choice(E, K, replace=False, p=p).tolist() for _ in range(L)]
              for _ in range(WARM + TIMED)]
    tables = Tables(L, E, torch.device("cpu"))
    reads = []
    for layer in range(L):
        host = (ExpertStack(torch.randn(E, 2 * I, H).to(torch.bfloat16)),
                ExpertStack(torch.randn(E, H, I).to(torch.bfloat16)))
        tier = LayerTier(host, S, I, "cpu", LfuAgingPolicy(E), "read")
        reads.append(InPlaceReads(tier, tables, layer))
    for step in traces[:WARM]:
        for r, ids in zip(reads, step):
            r.settle(ids)
    admitted = sum(r.admitted for r in reads)
    start = time.perf_counter()
    for step in traces[WARM:]:
        for r, ids in zip(reads, step):
            r.settle(ids)
        tables.push()
    seconds = time.perf_counter() - start
    return 1e3 * seconds / TIMED, (sum(r.admitted for r in reads) - admitted) / TIMED


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for skew in (0.0, 0.8):
        ms, admissions = settle_ms(skew)
        rows.append(dict(popularity=f"rank^-{skew}", settle_ms_per_step=ms,
                         admissions_per_step=admissions))
        print(f"rank^-{skew}: {ms:.3f} ms a step, {admissions:.2f} admissions a step")
    tree = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=Path(__file__).parent).stdout.strip()
    result = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  command=" ".join(sys.argv), machine=platform.processor() or platform.machine(),
                  python=platform.python_version(), tree=tree, rows=rows)
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
