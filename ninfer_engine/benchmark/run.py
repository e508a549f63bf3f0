"""`ninfer bench`: the serving engine's own step on a random-weight model on the GPU — decode,
aggregate decode, speculative verify and prefill, each beside its roofline — and the same shapes
through transformers as the peer.

The model is `build_synthetic(arch)` drawn directly in device memory in bf16; with a storage
recipe other than bf16 (`--weights`, the recipes of `ninfer convert`) each projection the recipe
stores packed is encoded on the GPU and served as the engine's `--cuda-weights` (auto or packed)
serves a converted artifact, routed experts included (`models.experts`). Before anything is
drawn, `ninfer bench` checks the planned bytes against free memory (`footprint.refusal`). The
model is then wrapped in the serving `Engine` (`engine_step.bench_engine`: memory plan, CUDA
graphs captured at start, scheduler, runner, sampler, stats) and every figure comes from timing
`Engine.step` calls on greedy requests with random prompts (`engine_step.run_requests`):

- `decode`: one request at each context: its prompt prefilled by the engine (`prefill_ms`, its
  time to first token), then decode steps (`step_ms`: the mean over `DECODE_STEPS` steps after
  `SKIP` warm-up steps, in which a new context bucket's graph is captured).
- `concurrency`: B requests at `concurrency_context`, decoded together; aggregate tok/s = tokens
  emitted / seconds over the steps where all B decode.
- `speculative`: the same B requests again with verify rows of 1 + `draft_tokens` tokens from
  `OracleDrafter` (a chosen number of drafts taken a round: random weights accept nothing):
  tok/s verifying every step and under the engine's speculation policy, beside plain decode at
  the same B, and the tokens per round the engine counted.
- `prefill`: one prompt of `prefill` tokens through the engine's chunks (`--prefill-chunk`),
  timed to its first token.
- `peer`: transformers' batch-1 prefill and greedy decode of the same config (`peer.run_peer`),
  built after our model is freed so both fit in device memory.

Rooflines (see `roofline`): bandwidth = tokens × copy bandwidth / bytes touched per step (weights
read once, routed experts for min(E, B·top_k) per layer, + each sequence's 2 × fp32 GDN state,
conv state and KV); compute = tokens × matmul rate / FLOPs (2 × active matmul params per token
+ attention); both rates measured in the same run; the roofline is the lower of the two.
"""

from __future__ import annotations

import gc
import platform
import sys
from datetime import datetime, timezone

import torch
import triton

from ..artifact.synth import build_synthetic
from ..models.experts import bf16_fits, free_device_bytes
from ..models.fused import FusedParams
from ..models.packed import DENSE
from ..models.qwen3_5 import Qwen35Model
from ..models.qwen3_5_step_weights import HybridWeights
from ..step.spec_policy import AlwaysSpeculate, SpecPolicy
from ..types import SamplingParams
from . import roofline as rf
from .engine_step import (MARGIN, NoDrafts, bench_engine, random_prompts, run_requests,
                          served_sampling)
from .forced_drafts import ForcedRounds, OracleDrafter
from .footprint import packed_source
from .timing import copy_bandwidth_gbps, matmul_tflops

SKIP, DECODE_STEPS = 4, 32  # warm-up steps (a new context bucket captures its graph), timed ones
ENGINE_PATH = ("the serving engine's step (`Engine.step`: schedule, forward — CUDA graphs for "
               "decode and verify rows, the batched eager forward for prompt chunks — sample, "
               "update)")


def run_decode_bench(arch: str, contexts: list[int], weights: str = "bf16",
                     layers: int | None = None, command: str = "",
                     concurrency: list[int] = (), concurrency_context: int = 1024,
                     prefill: int = 0, prefill_chunk: int = 4096,
                     peer: str | None = None, peer_prompt: int = 1024,
                     peer_steps: int = 16, on_partial=None, cuda_weights: str = "auto",
                     draft_tokens: int = 3, spec_rates: list[float] = (),
                     spec_batches: list[int] = (1,), sampling: str = "greedy",
                     spec_drafter: str = "oracle", lm_head_draft: int = 0) -> dict:
    """Build the model on the GPU, serve it from an `Engine`, time every requested section;
    the JSON-able result. `sampling` "served": the decode and concurrency requests sample as a
    served request sending only `temperature: 0` does (the model preset's penalties).
    `spec_drafter` "mtp": the speculative section drafts with a random MTP head (`--spec mtp`'s
    drafting, `forced_drafts.ForcedRounds`) instead of the oracle's free random ids;
    `lm_head_draft` (rows, with "mtp"): the head's drafts take the argmax over a proposal of
    its first that many rows (`--lm-head-draft`).

    `on_partial(result)`, if given, receives our sections before the peer starts (so a run cut
    short while timing the peer still leaves them)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gbps = copy_bandwidth_gbps()
    tflops = matmul_tflops()
    _log(f"copy bandwidth {gbps:.0f} GB/s, bf16 matmul {tflops:.0f} TFLOP/s; "
         f"building synthetic {arch} on the {device}")
    result = dict(
        machine=dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                     torch=torch.__version__, triton=triton.__version__,
                     python=platform.python_version(), copy_gbps=gbps, matmul_tflops=tflops),
        command=command, date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        arch=arch, recipe=weights, cuda_weights=cuda_weights, batch=1, path=ENGINE_PATH,
        sampling=sampling, spec_drafter=spec_drafter if spec_rates else None,
        lm_head_draft=lm_head_draft if spec_rates and spec_drafter == "mtp" else 0,
        weights=f"random (synthetic, drawn on the {device})")
    plan = _Plan(contexts, list(concurrency), concurrency_context, prefill, draft_tokens,
                 list(spec_rates), [b for b in spec_batches if b in concurrency], sampling,
                 spec_drafter, lm_head_draft)
    result.update(_ours(arch, weights, cuda_weights, layers, device, plan, prefill_chunk,
                        gbps, tflops))
    gc.collect()  # every tensor of ours is gone before the peer is built
    if device == "cuda":
        torch.cuda.empty_cache()
    not_measured = dict(result.pop("failed"))
    if "prefill" not in result and "prefill" not in not_measured:
        not_measured["prefill"] = "skipped (--prefill 0)"
    if not result.get("concurrency") and "concurrency" not in not_measured:
        not_measured["concurrency"] = "skipped (no --concurrency levels)"
    if peer == "transformers":
        from .peer import run_peer

        if on_partial is not None:
            on_partial({**result, "not_measured": {
                **not_measured, "peer": "did not finish (the run stopped while timing it)"}})
        result["peer"] = p = run_peer(result["config"], peer_prompt, peer_steps)
        if "decode_tok_s" in p:
            ours = min(result["decode"], key=lambda r: abs(r["context"] - peer_prompt))
            p.update(ours_context=ours["context"], ours_decode_tok_s=ours["tok_s"],
                     ratio_decode=ours["tok_s"] / p["decode_tok_s"])
            pre = result.get("prefill")
            if pre and pre["tokens"] == peer_prompt:
                p.update(ours_prefill_tok_s=pre["tok_s"],
                         ratio_prefill=pre["tok_s"] / p["prefill_tok_s"])
        else:
            not_measured["peer"] = p.get("skipped") or p.get("error", "failed")
    else:
        not_measured["peer"] = "skipped (--no-peer)"
    result["not_measured"] = not_measured
    return result


class _Plan:
    """The requests every section sends, and the engine's sizes that follow from them."""

    def __init__(self, contexts, levels, cctx, prefill, k, rates, spec_batches, sampling,
                 drafter="oracle", lm_head_draft=0):
        self.contexts, self.levels, self.cctx, self.prefill = contexts, levels, cctx, prefill
        self.k, self.rates, self.spec_batches = k, rates, spec_batches
        self.sampling = sampling  # "greedy" or "served" (`engine_step.served_sampling`)
        self.mtp = bool(rates) and drafter == "mtp"  # the speculative section drafts with MTP
        self.lm_head_draft = lm_head_draft if self.mtp else 0  # its proposal rows (0: all)
        # output tokens a request asks for: enough for the timed steps at 1 + k tokens a step
        self.output_tokens = SKIP + (1 + k) * DECODE_STEPS + k if rates else SKIP + DECODE_STEPS
        self.max_batch = max([1, *levels])
        self.max_context = max([*contexts, cctx, prefill]) + self.output_tokens + MARGIN

    def kv_tokens(self) -> int:
        return max(self.max_context, self.max_batch * (self.cctx + self.output_tokens + MARGIN))


def _ours(arch, weights, mode, layers, device, plan, chunk, gbps, tflops):
    """Every section measured on our model; its tensors are freed when this returns."""
    # bf16 on the GPU; the CPU (the orchestration test) runs the engine's exact fp32 path
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config, source = build_synthetic(arch, device, dtype, layers, mtp=plan.mtp)
    fits = bf16_fits(config, free_device_bytes(device))
    params = FusedParams(config, packed_source(source, weights, mode, fits))
    model = Qwen35Model(config, params)
    fused = HybridWeights(model, params)
    out = dict(layers=config["num_hidden_layers"], config=config,
               active_params=rf.active_params(config),
               weight_bytes_per_step=rf.step_weight_bytes(fused, 1))
    forms = {layer[f].fmt for layer in fused.layers if "moe" in layer
             for f in ("experts_gu", "experts_down")}
    if forms:  # how the routed experts were served: dense (bf16) and/or the fp8 forms
        out["routed_experts"] = "+".join(sorted(forms))
    engine = bench_engine(model, arch, config, plan.max_batch, plan.max_context,
                          plan.k if plan.rates else 0, mode, chunk, plan.kv_tokens(),
                          mtp_params=source if plan.mtp else None,
                          lm_head_draft=plan.lm_head_draft)
    # the MTP head drafts in the speculative section only (its graphs keep every row's
    # hidden throughout, as a `--spec mtp` server's)
    head = engine.speculator.drafter if plan.mtp else None
    if head is not None:
        engine.speculator.drafter = NoDrafts()
    out["graphs"] = engine.runner.graphs is not None
    vocab = config["vocab_size"]
    failed = {}
    try:
        out["decode"] = [_decode_row(engine, fused, config, ctx, plan, gbps, tflops, seed)
                         for seed, ctx in enumerate(plan.contexts)]
        if plan.levels:
            rows, spec = [], []
            for B in plan.levels:
                prompts = random_prompts(B, plan.cctx, vocab, seed=100 + B)
                run = run_requests(engine, prompts, plan.output_tokens, _sampling(engine, plan))
                rows.append(_concurrency_row(run, fused, config, B, plan.cctx, gbps, tflops))
                if B in plan.spec_batches:
                    spec += _speculative(engine, prompts, rows[-1], plan, vocab, head)
            out["concurrency"] = rows
            if spec:
                out["speculative"] = spec
        if plan.prefill:
            out["prefill"] = _prefill(engine, config, plan.prefill, chunk, tflops, vocab)
            if forms - {DENSE}:
                out["prefill"]["path"] += ("; fp8 routed experts decoded to bf16 per chunk "
                                           "before the grouped matmuls")
    except Exception as error:  # e.g. out of memory: keep the sections measured so far
        failed["engine"] = f"failed: {error!r}"[:500]
        _log(f"engine {failed['engine']}")
    finally:
        engine.stop()
    out["failed"] = failed
    return out


def _decode_row(engine, fused, config, ctx, plan, gbps, tflops, seed) -> dict:
    prompt = random_prompts(1, ctx, config["vocab_size"], seed=seed)
    run = run_requests(engine, prompt, SKIP + DECODE_STEPS + 1, _sampling(engine, plan))
    tokens, seconds = run.decode_window(SKIP)
    step = 1e3 * seconds / tokens
    nbytes = rf.step_weight_bytes(fused, 1) + rf.state_bytes(fused, 1, ctx)
    roof = gbps * 1e9 / nbytes
    row = dict(context=ctx, step_ms=step, tok_s=1e3 / step, steps=tokens,
               prefill_ms=1e3 * run.first_token_s[0], bytes_per_step=nbytes, roofline_tok_s=roof,
               fraction_of_roofline=1e3 / step / roof,
               flop_roofline_tok_s=rf.tok_s(1, rf.decode_flops(config, ctx), tflops * 1e12))
    _log(f"context {ctx}: {row['tok_s']:.1f} tok/s (roofline {roof:.0f}); "
         f"first token after {row['prefill_ms']:.0f} ms")
    return row


def _sampling(engine, plan) -> SamplingParams:
    return served_sampling(engine) if plan.sampling == "served" else SamplingParams(temperature=0.0)


def _concurrency_row(run, fused, config, B, ctx, gbps, tflops) -> dict:
    tokens, seconds = run.decode_window(SKIP)
    nbytes = rf.step_weight_bytes(fused, B) + rf.state_bytes(fused, B, ctx)
    roof = rf.roofline(B, nbytes, B * rf.decode_flops(config, ctx), gbps, tflops)
    tok_s = tokens / seconds
    row = dict(concurrency=B, context=ctx, step_ms=1e3 * seconds * B / tokens, tok_s=tok_s,
               per_sequence_tok_s=tok_s / B, **roof,
               fraction_of_roofline=tok_s / roof["roofline_tok_s"],
               ttft_ms_max=1e3 * max(run.first_token_s))
    if "num_experts" in config:
        row["experts_read_per_layer"], row["experts_expected_per_layer"] = \
            rf.experts_read(config, B)
    _log(f"concurrency {B}: {tok_s:.1f} tok/s aggregate "
         f"(roofline {roof['roofline_tok_s']:.0f}, {roof['bound']})")
    return row


def _speculative(engine, prompts, plain_row, plan, vocab, head=None) -> list[dict]:
    """The same requests with verify rows of k oracle drafts (or, with `head`, the MTP
    drafter's, their count forced) at each tokens-per-round: every step verifying (the verify
    cost curve), then under the engine's policy (`spec_policy`: what serves, never meant to
    lose to plain decode)."""
    speculator, rows = engine.speculator, []
    for rate in plan.rates:
        row = dict(concurrency=len(prompts), context=plan.cctx, draft_tokens=plan.k,
                   target_tokens_per_round=rate, plain_tok_s=plain_row["tok_s"])
        for policy, key in ((AlwaysSpeculate(), "tok_s"), (SpecPolicy(), "policy_tok_s")):
            oracle = (ForcedRounds(head, rate, plan.k) if head is not None
                      else OracleDrafter(rate, plan.k, vocab))
            before = speculator.stats()
            speculator.drafter, speculator.policy = oracle, policy
            try:
                with oracle.forced():
                    run = run_requests(engine, prompts, plan.output_tokens)
            finally:
                speculator.drafter, speculator.policy = NoDrafts(), SpecPolicy()
            tokens, seconds = run.decode_window(SKIP)
            row[key] = tokens / seconds
            if key == "tok_s":  # the rounds of the always-verifying run
                after = speculator.stats()
                rounds = after.rounds - before.rounds
                accepted = after.accepted - before.accepted
                row.update(tokens_per_round=1 + accepted / rounds if rounds else 1.0,
                           acceptance=accepted / (after.drafted - before.drafted or 1))
        row.update(speedup=row["tok_s"] / row["plain_tok_s"],
                   policy_speedup=row["policy_tok_s"] / row["plain_tok_s"])
        rows.append(row)
        _log(f"speculative B={len(prompts)} at {rate} tokens/round: {row['tok_s']:.1f} tok/s "
             f"verifying every step ({row['speedup']:.2f}x plain; measured "
             f"{row['tokens_per_round']:.2f} tokens/round), {row['policy_tok_s']:.1f} under "
             f"the policy ({row['policy_speedup']:.2f}x)")
    return rows


def _prefill(engine, config, tokens, chunk, tflops, vocab) -> dict:
    run = run_requests(engine, random_prompts(1, tokens, vocab, seed=7), 1)
    ms = 1e3 * run.first_token_s[0]
    n_chunks = -(-tokens // chunk)
    flops = rf.prefill_flops(config, tokens, n_chunks)
    roof = rf.tok_s(tokens, flops, tflops * 1e12)
    tok_s = tokens * 1e3 / ms
    achieved = flops / ms / 1e9
    _log(f"prefill {tokens}: {tok_s:.0f} tok/s ({achieved:.0f} TFLOP/s, roofline {roof:.0f})")
    return dict(tokens=tokens, chunk=chunk, chunks=n_chunks, path=ENGINE_PATH, ms=ms,
                tok_s=tok_s, flops=flops, flops_per_token=flops / tokens,
                achieved_tflops=achieved, roofline_tok_s=roof, fraction_of_roofline=tok_s / roof,
                fraction_of_matmul_rate=achieved / tflops)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
