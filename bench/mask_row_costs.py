"""Why a grammar mask of B rows costs more than B × one row's median (issue 21): each row's
first fill of each state timed alone, and the same rows filled in one executor call.

    python3 bench/mask_row_costs.py --batch 8 --steps 100 --torch-threads 1

Rows follow random logits (N(0, 3²), sampled at temperature 1, top_k 20) under
bench/mask_cost.py's SCHEMA with the Qwen3.5 tokenizer (the tiny synthetic artifact's). Each
step: every row's mask filled alone (`LLMatcher.unsafe_compute_mask_ptr`, timed per row, with
its allowed-token count), then the whole batch at once by the executor
(`mask.fill`) on copies of the same matchers at the same states (`deep_copy`: a second fill of
a state llguidance already filled is nearly free, so the batch call must not follow the single
ones on the same matcher). Prints the split between wide states (more than 1000 allowed tokens:
inside a free string) and narrow ones, and the per-step serial sum against the batched call.
Last, whether a fill releases the GIL: 8 wide rows filled on another thread while this one runs
a Python loop, which counts its iterations inside the fill and its longest pause.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.mask_cost import PARAMS, SCHEMA  # noqa: E402
from ninfer_engine.artifact.synth import write_synthetic  # noqa: E402
from ninfer_engine.constrained import compile_constraint, json_schema_grammar, mask  # noqa: E402
from ninfer_engine.artifact import open_artifact  # noqa: E402
from ninfer_engine.step.sampling import Sampler, sample_rows  # noqa: E402
from ninfer_engine.tokenizer import Tokenizer  # noqa: E402

WIDE = 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--torch-threads", type=int, default=0)
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    with tempfile.TemporaryDirectory() as tmp:
        with open_artifact(write_synthetic("tiny-dense", Path(tmp) / "t.ninfer")) as artifact:
            tokenizer = Tokenizer.from_artifact(artifact)
    grammar, b = json_schema_grammar(SCHEMA), args.batch
    rows = [compile_constraint(tokenizer, grammar) for _ in range(b)]
    samplers = [Sampler(PARAMS) for _ in range(b)]
    words = (rows[0].vocab + 31) // 32
    alone, together = mask.new_buffer(b, rows[0].vocab), mask.new_buffer(b, rows[0].vocab)
    gen = torch.Generator().manual_seed(0)
    singles, steps = [], []
    for step in range(args.steps):
        # copies at the same states; which goes first alternates (they may share lexer caches)
        copies = [(c.matcher.deep_copy(), i) for i, c in enumerate(rows)]
        serial = batched = 0.0
        for turn in ((0, 1) if step % 2 else (1, 0)):
            if turn == 0:
                started = time.perf_counter()
                mask.fill(copies, together)
                batched = (time.perf_counter() - started) * 1000
                continue
            for i, c in enumerate(rows):
                started = time.perf_counter()
                c.matcher.unsafe_compute_mask_ptr(alone[i].data_ptr(), words * 4)
                ms = (time.perf_counter() - started) * 1000
                allowed = int(mask.allowed(alone[i: i + 1], rows[0].vocab,
                                           torch.device("cpu")).sum())
                singles.append((ms, allowed))
                serial += ms
        assert torch.equal(alone, together)  # the same states, the same masks
        steps.append((serial, batched, any(n > WIDE for _, n in singles[-b:]), step % 2))
        logits = torch.randn((b, rows[0].vocab), generator=gen) * 3
        masked = mask.apply_constraints(logits, list(range(b)), rows, alone)
        for i, token in enumerate(sample_rows(masked, samplers)):
            rows[i].advance(token)
            if rows[i].matcher.is_stopped() or token in tokenizer.eos_token_ids:
                rows[i] = compile_constraint(tokenizer, grammar)
    wide = [ms for ms, n in singles if n > WIDE]
    narrow = [ms for ms, n in singles if n <= WIDE]
    every = [ms for ms, _ in singles]
    print(f"{len(singles)} row masks: {len(wide)} wide ({100 * len(wide) / len(singles):.0f} %)"
          f" median {statistics.median(wide):.3f} ms mean {statistics.mean(wide):.3f} ms; "
          f"narrow median {statistics.median(narrow):.3f} mean {statistics.mean(narrow):.3f}; "
          f"all median {statistics.median(every):.3f} mean {statistics.mean(every):.3f}")
    for first, name in ((0, "rows one by one first"), (1, "executor call first")):
        part = [x for x in steps if x[3] == first]
        print(f"steps of {b} rows, {name}: serial sum median "
              f"{statistics.median(x[0] for x in part):.3f} ms, one executor call median "
              f"{statistics.median(x[1] for x in part):.3f} ms")
    print(f"{100 * sum(x[2] for x in steps) / len(steps):.0f} % of steps held a wide row")
    gil_check(tokenizer, grammar)


def gil_check(tokenizer, grammar: str, reps: int = 10) -> None:
    """A Python loop here while another thread fills 8 wide rows (inside the name string)."""
    prefix = tokenizer.encode('{"name": "A')
    for _ in range(reps):
        rows = [compile_constraint(tokenizer, grammar) for _ in range(8)]
        for c in rows:
            for token in prefix:
                c.advance(token)
        bits, window = mask.new_buffer(8, rows[0].vocab), []

        def fill():
            started = time.perf_counter()
            mask.fill([(c.matcher, i) for i, c in enumerate(rows)], bits)
            window.append((started, time.perf_counter()))
        stamps = []
        worker = threading.Thread(target=fill)
        worker.start()
        while worker.is_alive():
            stamps.append(time.perf_counter())
        start, end = window[0]
        points = [start, *(t for t in stamps if start <= t <= end), end]
        pause = max(b - a for a, b in zip(points, points[1:]))
        print(f"fill {1000 * (end - start):.2f} ms on another thread: {len(points) - 2} loop "
              f"iterations here inside it, longest pause {1000 * pause:.2f} ms")


if __name__ == "__main__":
    main()
