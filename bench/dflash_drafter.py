"""The DFlash drafter's own cost per round (issue 19), beside `ninfer bench`'s verify cost curve
(its oracle drafter costs nothing): the published 35B-A3B drafter's shape (6 layers, 5 sliding
window 4096 + 1 full, width 2048, 8 taps) with random bf16 weights over a stand-in target (the
35B's embedding and head, [248320, 2048] each), per batch size B and context length C:

- `propose_ms`: one proposal round at k drafts (default 7): the forward over [anchor, MASK×k]
  of each row against its context, the target head over the k mask rows, the argmax (with
  `--dflash2`: the published 27B DFlash2 drafter's shape, 5 sliding layers of width 5120 with
  its convolutions, over a 27B stand-in, and its candidate selector's walk);
- `extend_ms`: absorbing k + 1 committed positions' tap features into each row's context (what
  follows a fully accepted verify row);
- `prefill_extend_ms_per_1k`: building a context from a prompt's features, per 1024 tokens.

Times are medians of `--reps` CUDA-synchronised calls after `--warmup` ones (on the CPU, of
wall time). On CUDA each row also has one call's kernels from torch.profiler (`*_kernels`,
`*_kernel_ms`: their count and summed device time): a call whose kernels take far less than
its time is bound by the host's launches, which a CUDA graph would remove. H200:
    python bench/dflash_drafter.py --out bench/results/h200-dflash-drafter
CPU smoke (a small drafter over a small stand-in target):
    .venv/bin/python bench/dflash_drafter.py --small [--dflash2] --contexts 64 --batches 1,2 \
        --reps 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.artifact import dflash_names  # noqa: E402
from ninfer_engine.artifact.synth import synthetic_blocks  # noqa: E402
from ninfer_engine.models.dflash import DFlashConfig, DFlashContext, DFlashModel  # noqa: E402


class StandIn:
    """The target's part the drafter reads: embedding and head (random), device and dtype."""

    def __init__(self, vocab: int, hidden: int, device, dtype) -> None:
        gen = torch.Generator(device).manual_seed(0)
        self.embedding = torch.randn(vocab, hidden, generator=gen, device=device).to(dtype) * 0.02
        self.head = torch.randn(vocab, hidden, generator=gen, device=device).to(dtype) * 0.02
        self.device, self.dtype = torch.device(device), dtype
        self.vocab_size = vocab

    def embed(self, ids):
        return F.embedding(ids, self.embedding)

    def logits(self, h):
        return F.linear(h, self.head)


def build(small: bool, device, dtype, dflash2: bool = False):
    target_config = ({"num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 512} if small
                     else {"num_hidden_layers": 64, "hidden_size": 5120, "vocab_size": 248320}
                     if dflash2 else
                     {"num_hidden_layers": 40, "hidden_size": 2048, "vocab_size": 248320})
    config = dflash_names.synth_config(target_config, not small, dflash2)
    shapes = dflash_names.parameter_shapes(config, target_config["vocab_size"])

    def params(name, shape):
        assert shapes[name] == tuple(shape), name
        blocks = [b.to(dtype) for b in synthetic_blocks(name, shape, 0, device)]
        return torch.cat(blocks).reshape(shape)

    target = StandIn(target_config["vocab_size"], target_config["hidden_size"], device, dtype)
    cfg = DFlashConfig.from_component(config, target_config, "the bench")
    return DFlashModel(target, cfg, params), len(cfg.taps) * cfg.hidden


def timed(fn, reps: int, warmup: int, device) -> float:
    """Median milliseconds of `fn()`."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - start) * 1e3)
    return statistics.median(out)


def kernel_profile(fn, device) -> tuple[int, float] | tuple[None, None]:
    """One call's CUDA kernels (torch.profiler): their count and summed device time in ms;
    (None, None) off CUDA."""
    if device.type != "cuda":
        return None, None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    return len(kernels), round(sum(e.time_range.end - e.time_range.start
                                   for e in kernels) / 1e3, 3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="a small drafter (CPU smoke)")
    p.add_argument("--dflash2", action="store_true", help="a DFlash2 drafter")
    p.add_argument("--k", type=int, default=7)
    p.add_argument("--contexts", default="1024,8192,32768")
    p.add_argument("--batches", default="1,4,8")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, width = build(args.small, device, dtype, args.dflash2)
    vocab = model.target.vocab_size - 1  # below the mask row
    gen = torch.Generator(device).manual_seed(1)
    rows = []
    with torch.inference_mode():
        for C in map(int, args.contexts.split(",")):
            feats = torch.randn(C, width, generator=gen, device=device).to(dtype)
            chunk = min(C, 1024)

            def prefill():
                ctx = DFlashContext(model, 0)
                for s in range(0, C, chunk):
                    model.extend(ctx, feats[s: s + chunk])
                return ctx

            prefill_ms = timed(prefill, max(1, args.reps // 4), 1, device)
            for B in map(int, args.batches.split(",")):
                ctxs = [prefill() for _ in range(B)]

                def propose():
                    return model.drafts(model.propose([5] * B, ctxs, [args.k] * B), [5] * B,
                                        vocab)

                def extend():  # k + 1 positions a row, then back to C (the next call's start)
                    for ctx in ctxs:
                        model.extend(ctx, feats[: args.k + 1])
                        ctx.rewind(C)

                rows.append(dict(context=C, batch=B, k=args.k,
                                 propose_ms=round(timed(propose, args.reps, args.warmup,
                                                        device), 3),
                                 extend_ms=round(timed(extend, args.reps, args.warmup,
                                                       device), 3),
                                 prefill_extend_ms_per_1k=round(prefill_ms * 1024 / C, 3)))
                for name, fn in (("propose", propose), ("extend", extend)):
                    count, ms = kernel_profile(fn, device)
                    rows[-1].update({f"{name}_kernels": count, f"{name}_kernel_ms": ms})
                print(rows[-1], flush=True)
    report = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                  dtype=str(dtype),
                  drafter=(("small DFlash2" if args.dflash2 else "small") if args.small
                           else "27B DFlash2 shape" if args.dflash2 else "35B-A3B DFlash shape"),
                  torch=torch.__version__, rows=rows)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=1))
        lines = ["| C | B | k | propose ms | its kernels (ms of them) | extend ms | its kernels "
                 "(ms of them) | prefill extend ms / 1K |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['context']} | {r['batch']} | {r['k']} | {r['propose_ms']} | "
                  f"{r['propose_kernels']} ({r['propose_kernel_ms']}) | {r['extend_ms']} | "
                  f"{r['extend_kernels']} ({r['extend_kernel_ms']}) | "
                  f"{r['prefill_extend_ms_per_1k']} |" for r in rows]
        out.with_suffix(".md").write_text(
            f"DFlash drafter cost ({report['drafter']}, {report['device']}, {report['dtype']})"
            "\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
