"""`ninfer bench`'s result as a markdown report: one table per measured section."""

from __future__ import annotations


def markdown(result: dict) -> str:
    """The result as a markdown report: one table per measured section."""
    m = result["machine"]
    rate = f", bf16 matmul {m['matmul_tflops']:.0f} TFLOP/s" if "matmul_tflops" in m else ""
    lines = [
        f"# ninfer bench: {result['arch']} ({result['layers']} layers), "
        f"{result.get('recipe') or result['dtype']}"
        + (f" served as --cuda-weights {result['cuda_weights']}"
           if result.get("recipe", "bf16") != "bf16" and "cuda_weights" in result else ""),
        "",
        f"- machine: {m['device']}, torch {m['torch']}, Triton {m['triton']}, "
        f"Python {m['python']}; copy bandwidth {m['copy_gbps']:.0f} GB/s{rate}",
        f"- command: `{result['command']}`, {result['date']}",
        f"- weights: {result['weights']}; "
        + (f"routed experts {result['routed_experts']}; " if "routed_experts" in result else "")
        + f"{result['weight_bytes_per_step'] / 1e9:.2f} GB read "
        "per batch-1 step",
        "",
        f"- measured: {result.get('path', 'the engine step')}"
        + ("; requests sampled as served ones sending only temperature 0 (the model preset's "
           "penalties)" if result.get("sampling") == "served" else ""),
        "",
        "## Batch-1 decode",
        "",
        "| context | tok/s | step ms | first token ms (prefill) | bytes/step | roofline tok/s "
        "| % of roofline |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["decode"]:
        lines.append(
            f"| {r['context']} | {r['tok_s']:.1f} | {r['step_ms']:.2f} | {r['prefill_ms']:.0f} "
            f"| {r['bytes_per_step'] / 1e9:.2f} GB "
            f"| {r['roofline_tok_s']:.0f} | {100 * r['fraction_of_roofline']:.0f} % |")
    if result.get("concurrency"):
        moe = "experts_read_per_layer" in result["concurrency"][0]
        lines += ["", "## Aggregate decode at concurrency B (B requests decoding together)",
                  "", "| B | context | aggregate tok/s | per sequence | step ms "
                  + ("| experts read / layer " if moe else "")
                  + "| bytes/step | bandwidth roofline | FLOP roofline | % of roofline |",
                  "|---" * (9 + moe) + "|"]
        for r in result["concurrency"]:
            experts = (f"| {r['experts_read_per_layer']} (≈{r['experts_expected_per_layer']:.0f}"
                       " expected) " if moe else "")
            lines.append(
                f"| {r['concurrency']} | {r['context']} | {r['tok_s']:.1f} "
                f"| {r['per_sequence_tok_s']:.1f} | {r['step_ms']:.2f} {experts}"
                f"| {r['bytes_per_step'] / 1e9:.2f} GB | {r['bandwidth_roofline_tok_s']:.0f} "
                f"| {r['flop_roofline_tok_s']:.0f} | {100 * r['fraction_of_roofline']:.0f} % |")
        lines += ["", "Roofline = the lower of bandwidth (weights read once per step"
                  + (", routed experts for min(E, B·top_k) per layer" if moe else "")
                  + ", plus every sequence's GDN state and KV) and FLOPs (2 × active params × B "
                  "+ attention) over the measured matmul rate."]
    if result.get("speculative"):
        mtp = result.get("spec_drafter") == "mtp"
        lines += ["", "## Speculative decoding: verify rows with "
                  + ("the MTP head's drafts" if mtp else "the oracle drafter")
                  + (f" (`--lm-head-draft`: the argmax over its first {result['lm_head_draft']}"
                     " rows)" if result.get("lm_head_draft") else ""), "",
                  "| B | context | k | tokens/round (target → measured) | acceptance "
                  "| tok/s, verifying every step | plain tok/s | speed-up | tok/s under the "
                  "policy | speed-up |", "|---" * 10 + "|"]
        for r in result["speculative"]:
            lines.append(
                f"| {r['concurrency']} | {r['context']} | {r['draft_tokens']} "
                f"| {r['target_tokens_per_round']:.2f} → {r['tokens_per_round']:.2f} "
                f"| {100 * r['acceptance']:.0f} % | {r['tok_s']:.1f} | {r['plain_tok_s']:.1f} "
                f"| {r['speedup']:.2f}× | {r['policy_tok_s']:.1f} | {r['policy_speedup']:.2f}× |")
        lines += ["", "Random weights accept nothing, so " + (
                  "the rounds take a chosen number of the random MTP head's drafts "
                  "(`forced_drafts.ForcedRounds`): the drafting is `--spec mtp`'s own, and the "
                  "plain rows keep each row's hidden for it, as a `--spec mtp` server does; "
                  if mtp else "the oracle drafter's rounds take a chosen number of drafts "
                  "(`forced_drafts.OracleDrafter`: random ids, drafting costs nothing); ")
                  + "the verify forward, "
                  "the acceptance pass and the GDN/KV rollback are the engine's own. Under the "
                  "policy (`step/spec_policy.py`) a step verifies while verify steps of its "
                  "batch size have emitted tokens faster than plain ones."]
    p = result.get("prefill")
    if p:
        lines += ["", f"## Prefill of a {p['tokens']}-token prompt", "",
                  "| tokens | chunk | ms | tok/s | GFLOP/token | TFLOP/s achieved "
                  "| roofline tok/s | % of roofline (= of matmul rate) |",
                  "|---|---|---|---|---|---|---|---|",
                  f"| {p['tokens']} | {p['chunk']} | {p['ms']:.0f} | {p['tok_s']:.0f} "
                  f"| {p['flops_per_token'] / 1e9:.1f} | {p['achieved_tflops']:.0f} "
                  f"| {p['roofline_tok_s']:.0f} | {100 * p['fraction_of_roofline']:.0f} % |",
                  "", f"Path: {p['path']}, timed to the first token. FLOPs: 2 × non-head "
                  "params per token, the head once per chunk, causal attention; the GDN "
                  "recurrence is not counted."]
    peer = result.get("peer")
    if peer and "decode_tok_s" in peer:
        impl = ", ".join(f"{k} {peer[k]}" for k in ("attn_implementation", "experts_implementation",
                                                     "fla", "causal_conv1d") if k in peer)
        lines += ["", "## Peer: transformers on the same shapes, same GPU, same run", "",
                  "| | prompt | prefill tok/s | decode tok/s (batch 1) | ninfer decode tok/s "
                  "| ninfer / peer |", "|---|---|---|---|---|---|",
                  f"| transformers {peer['version']} | {peer['prompt_tokens']} "
                  f"| {peer['prefill_tok_s']:.0f} | {peer['decode_tok_s']:.2f} "
                  f"| {peer['ours_decode_tok_s']:.1f} ({peer['ours_context']} context) "
                  f"| {peer['ratio_decode']:.1f}× |",
                  "", f"Peer: {impl}; decode timed over {peer['decode_steps']} greedy steps "
                  "with its own cache after the prompt."]
        if "ratio_prefill" in peer:
            lines.append(f"Prefill at the same length: ninfer {peer['ours_prefill_tok_s']:.0f} "
                         f"tok/s, {peer['ratio_prefill']:.2f}× the peer.")
    nm = result.get("not_measured") or {}
    if nm:
        lines += ["", "Not measured: " + "; ".join(f"{k}: {v}" for k, v in nm.items()) + "."]
    return "\n".join(lines) + "\n"
