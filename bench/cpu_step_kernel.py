"""Time the compiled CPU decode step alone (no scheduler, no sampling): batch-1 steps of the default
model at the README prompt's context, for iterating on `kernels/cpu_decode.c`.

    .venv/bin/python bench/cpu_step_kernel.py [--context 105] [--steps 128] [--repeat 5]

Loads the engine (not started), prefills `--context` tokens through the eager forward, then times
`--steps` consecutive `CpuDecoder.step` calls (positions context..context+steps), `--repeat`
times, and prints each repeat's ms/step, the best and median, and the CPU other processes used
(`ForeignLoad`): on the shared 2-core box a busy neighbour halves the 2-thread speed. The full
side-by-side figure against llama.cpp is `bench/cpu_default_model.py --peer`; this one isolates
the C call.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import ForeignLoad  # noqa: E402
from ninfer_engine.cli.flags import default_artifact  # noqa: E402
from ninfer_engine.config import EngineConfig  # noqa: E402
from ninfer_engine.kernels.cpu_decode import ACTIVATIONS, DIMS as kernel_dims  # noqa: E402
from ninfer_engine.models import Segment  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", type=Path, default=default_artifact())
    ap.add_argument("--context", type=int, default=105)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="0: torch's count")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from ninfer_engine.engine import Engine

    engine = Engine(EngineConfig(artifact=args.artifact, max_context=2048, cpu_step="compiled"))
    decoder = engine.runner.graphs.decoder
    storage = engine.memory.storage
    cache = storage.new_cache()
    assert cache.reserve(args.context + args.steps + 1)
    page = storage.page_tokens
    ids = list(range(1000, 1000 + args.context))
    with torch.inference_mode():
        engine.model.forward(torch.tensor(ids), torch.arange(len(ids)),
                             [Segment(cache, 0, len(ids))], torch.tensor([len(ids) - 1]))
        decoder.tables.fill([cache])

        def run() -> float:
            # one thread: its CPU time, which a neighbour's load does not stretch (it still
            # shares caches and memory bandwidth); more threads: wall time
            clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter
            start = clock()
            for pos in range(args.context, args.context + args.steps):
                slot = cache.pages[pos // page] * page + pos % page
                decoder.meta[:, 0] = torch.tensor([17, pos, slot])
                decoder.step(1)
            return (clock() - start) / args.steps * 1e3

        modes = {f"{name} activations": i for i, name in enumerate(ACTIVATIONS)}
        at = kernel_dims.index("activations")
        times: dict[str, list[float]] = {m: [] for m in modes}
        with ForeignLoad() as load:
            for i in range(args.repeat + 1):  # the first round warms up (page faults)
                for mode, flag in modes.items():  # in turn: the box's load hits both alike
                    decoder.dims[at] = flag
                    took = run()
                    if i:
                        times[mode].append(took)
    for mode, ts in times.items():
        best, median = min(ts), statistics.median(ts)
        print(f"{mode}: ms/step per repeat " + " ".join(f"{t:.2f}" for t in ts) +
              f"; best {best:.2f} ms ({1e3 / best:.1f} tok/s), median {median:.2f} ms "
              f"({1e3 / median:.1f} tok/s)")
    print(f"threads {torch.get_num_threads()}, other processes' CPU {load.cores or 0.0:.2f} cores")


if __name__ == "__main__":
    main()
