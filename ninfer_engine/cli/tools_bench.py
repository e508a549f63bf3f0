"""`ninfer bench`: the GPU decode benchmark command and the parsers of its list-valued flags."""

from __future__ import annotations

import argparse
import json
import sys

BENCH_ARCHS = ("27b", "35b-a3b", "flash-next", "0.8b", "tiny-dense", "tiny-moe")
# the storage recipes of `convert` that a random model can be drawn in (fp32 is the CPU's)
BENCH_RECIPES = ("bf16", "fp8-row", "nvfp4", "q8", "qwen3_6_27b", "qwen3_8_27b",
                 "qwen3_6_35b_a3b")


def _fail(message: str) -> int:
    print(f"ninfer: error: {message}", file=sys.stderr)
    return 1


def _contexts(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected positive integers, e.g. 1024,8192")
    return values


def _rates(text: str) -> list[float]:
    if text.strip().lower() in ("none", ""):
        return []
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("expected numbers, e.g. 3.67,2.4") from None


def _levels(text: str) -> list[int]:
    return [] if text.strip().lower() in ("none", "0", "") else _contexts(text)


def _bench(args: argparse.Namespace) -> int:
    import torch  # torch only here: the other subcommands stay light

    from ..artifact.synth import synth_config

    if not torch.cuda.is_available():
        return _fail("ninfer bench needs a CUDA device")
    config = synth_config(args.arch, args.layers)  # bad --layers fails before any GPU work
    from ..benchmark.footprint import refusal
    from ..benchmark.report import markdown
    from ..benchmark.run import run_decode_bench

    # Flash-Next in bf16 (~160 GB) cannot fit one H200: say so before minutes of drawing
    too_big = refusal(args.arch, config["num_hidden_layers"], args.weights, args.cuda_weights,
                      torch.cuda.mem_get_info()[0])
    if too_big:
        return _fail(too_big)

    if args.prefill_chunk is None:  # the served engine's own budget: the bench measures it
        from ..serving import auto_prefill_chunk

        args.prefill_chunk = auto_prefill_chunk(torch.device("cuda"))
    if min(args.prefill, args.concurrency_context) < 0 \
            or min(args.prefill_chunk, args.peer_steps, args.peer_prompt, args.draft_tokens) < 1:
        return _fail("negative lengths, or fewer than 1 chunk/step/prompt/draft token")
    if args.lm_head_draft and (args.spec_drafter != "mtp" or args.lm_head_draft < 0):
        return _fail("--lm-head-draft takes a positive row count, with --spec-drafter mtp")
    if any(not 1 <= r <= 1 + args.draft_tokens for r in args.spec_rates):
        return _fail(f"--spec-rates must lie in [1, {1 + args.draft_tokens}] "
                     "(1 + --draft-tokens tokens a round at most)")
    if args.no_pdl:
        from ..kernels.pdl import set_pdl

        set_pdl(False)
    levels = ",".join(map(str, args.concurrency)) or "none"
    command = (f"ninfer bench --arch {args.arch}"
               + (f" --layers {args.layers}" if args.layers else "")
               + f" --context {','.join(map(str, args.context))} --weights {args.weights}"
               + (f" --cuda-weights {args.cuda_weights}" if args.weights != "bf16" else "")
               + f" --concurrency {levels} --concurrency-context {args.concurrency_context}"
               + f" --prefill {args.prefill} --prefill-chunk {args.prefill_chunk}"
               + (f" --draft-tokens {args.draft_tokens} --spec-rates "
                  f"{','.join(map(str, args.spec_rates))} --spec-batch "
                  f"{','.join(map(str, args.spec_batch)) or 'none'}"
                  f" --spec-drafter {args.spec_drafter}"
                  + (f" --lm-head-draft {args.lm_head_draft}" if args.lm_head_draft else "")
                  if args.spec_rates
                  else " --spec-rates none")
               + (f" --peer transformers --peer-prompt {args.peer_prompt}"
                  f" --peer-steps {args.peer_steps}" if args.peer == "transformers"
                  else " --no-peer")
               + (" --no-pdl" if args.no_pdl else "")
               + (f" --out {args.out}" if args.out else ""))

    def save(result: dict) -> None:
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(markdown(result))

    result = run_decode_bench(
        args.arch, args.context, args.weights, args.layers, command,
        concurrency=args.concurrency, concurrency_context=args.concurrency_context,
        prefill=args.prefill, prefill_chunk=args.prefill_chunk,
        peer=args.peer, peer_prompt=args.peer_prompt, peer_steps=args.peer_steps,
        on_partial=save, cuda_weights=args.cuda_weights, draft_tokens=args.draft_tokens,
        spec_rates=args.spec_rates, spec_batches=args.spec_batch, sampling=args.sampling,
        spec_drafter=args.spec_drafter, lm_head_draft=args.lm_head_draft)
    save(result)
    print(markdown(result), end="")
    return 0
