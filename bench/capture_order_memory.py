"""Device memory the start-up CUDA graphs reserve, by the order their batch sizes are captured
(CUDA only): the engine's largest-first order (`graph_capture.largest_first`) against batch 1
first, each in a fresh process, on the 35B-A3B fp8-row shape cut to `--layers` layers with a
random MTP head, `--spec mtp --draft-tokens 3` at 8 rows: the `start_up_capture` log lines
(decode/verify/prompt graphs, MTP rounds, verify chains: seconds and MiB reserved).

    python3 bench/capture_order_memory.py [--layers 4] [--context 4096]
    .venv/bin/python bench/capture_order_memory.py --arch tiny-moe --context 512   # CPU smoke
"""
from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ORDERS = ("largest-first", "smallest-first")


def run(order: str, arch: str, layers: int, context: int) -> None:
    """One engine built in this process, its start-up capture lines printed."""
    import torch

    from ninfer_engine.artifact.synth import build_synthetic
    from ninfer_engine.benchmark.engine_step import bench_engine
    from ninfer_engine.benchmark.footprint import packed_source
    from ninfer_engine.models.fused import FusedParams
    from ninfer_engine.models.qwen3_5 import Qwen35Model
    from ninfer_engine.step import decode_graphs, mtp_round, verify_chain

    if order == "smallest-first":  # the order before 18e711e
        for module in (decode_graphs, mtp_round, verify_chain):
            module.largest_first = lambda n: range(1, n + 1)
    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            if "start-up CUDA graphs" in record.getMessage():
                lines.append(record.getMessage())
    logging.getLogger("ninfer.engine").addHandler(Keep())
    logging.getLogger("ninfer.engine").setLevel(logging.INFO)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # (the CPU: a smoke, no graphs)
    with torch.inference_mode():
        config, source = build_synthetic(arch, device, torch.bfloat16, layers, mtp=True)
        model = Qwen35Model(config, FusedParams(config, packed_source(source, "fp8-row")))
        bench_engine(model, arch, config, 8, context, draft_tokens=3, mtp_params=source)
    for line in lines:
        print(f"{order}: {line}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="35b-a3b")
    ap.add_argument("--layers", type=int, default=4)  # one attention layer in four
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--order", choices=ORDERS, help="run this order here (else each in a child)")
    args = ap.parse_args()
    if args.order:
        return run(args.order, args.arch, args.layers, args.context)
    for order in ORDERS:
        subprocess.run([sys.executable, __file__, "--order", order, "--arch", args.arch,
                        "--layers", str(args.layers),
                        "--context", str(args.context)], check=False, timeout=300)


if __name__ == "__main__":
    main()
