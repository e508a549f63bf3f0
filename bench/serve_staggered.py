"""Served load with arrivals spread in time: C client streams, stream i starting i/C of a
request's duration after stream 0, each sending its next request as soon as the last one ends.
New prompts then keep arriving while the other streams decode, so most steps carry a prompt
chunk beside decode rows (what `serve_load.py`'s lockstep levels avoid). `--burst` starts every
stream at once instead: the TTFT percentiles of C prompts arriving together (issue 18's TTFT p99
at concurrency 8 against concurrency 1).

    python bench/serve_staggered.py URL MODEL --concurrency 8 --requests 48 --max-tokens 256 \
        --prompt-chars 430 --json OUT.json --label NAME

Per request: time to first token and decode rate after it (streamed chat completions with
`stream_options.include_usage`); aggregate: completion tokens / wall time from the first
request's start to the last one's end; the gaps between streamed events after each request's
first (p50, p99, max: what arriving prompts cost the streams already decoding); the prompt
tokens the server took from its prefix cache (`cached_prompt_tokens`). Every prompt starts with
this run's nonce (`--nonce`, default random), so no prompt repeats one of an earlier run on the
same server: the c=1 and c=8 runs of `ttft_burst_device.sh` drew the same prompts, and 3 of
each c=8 run's 16 found 99.9 % of their tokens cached (2026-12-06, h200-ttft-burst-chunk.md).
Only aiohttp.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import time

import aiohttp


def _prompt(chars: int, salt: int, nonce: str) -> str:
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()
    out = [f"[{nonce}-{salt}]"]
    length = len(out[0]) + 1  # kept as it grows: re-summing the list made a 4K prompt ~10 ms
    while length < chars:
        out.append(words[(salt * 7 + len(out) * 13) % len(words)])
        length += len(out[-1]) + 1
    return " ".join(out)


async def _one(session, url, model, text, max_tokens) -> dict:
    """One streamed request; a failed one (status, dropped connection, timeout) is counted as
    such, not raised (llama-server once dropped a burst's connections and lost the whole run)."""
    try:
        return await _stream(session, url, model, text, max_tokens)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return {"error": repr(exc)[:200]}


async def _stream(session, url, model, text, max_tokens) -> dict:
    body = {"model": model, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": text}]}
    start, stamps, usage = time.perf_counter(), [], {}
    async with session.post(url, json=body) as response:
        if response.status != 200:
            return {"error": f"HTTP {response.status}"}
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            usage = event.get("usage") or usage
            deltas = [c.get("delta") or {} for c in event.get("choices") or []]
            if any(d.get("content") or d.get("reasoning_content") or d.get("reasoning")
                   for d in deltas):
                stamps.append(time.perf_counter())
    n = usage.get("completion_tokens", 0)
    first, last = (stamps[0], stamps[-1]) if stamps else (None, None)
    result = {"ttft_s": first - start if first else None, "completion_tokens": n,
              "prompt_tokens": usage.get("prompt_tokens"), "end": time.perf_counter(),
              "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
              "gaps": [b - a for a, b in zip(stamps, stamps[1:])]}
    if first and last and last > first and n > 1:
        result["decode_tok_s"] = (n - 1) / (last - first)
    return result


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _run(args) -> dict:
    url = args.base.rstrip("/") + "/v1/chat/completions"
    per_stream = -(-args.requests // args.concurrency)
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        probe = await _one(session, url, args.model, _prompt(args.prompt_chars, 10**6, args.nonce),
                           args.max_tokens)  # warm-up, and the duration to stagger by
        duration = args.max_tokens / probe.get("decode_tok_s", args.max_tokens) + (
            probe.get("ttft_s") or 0)

        stagger = 0.0 if args.burst else duration / args.concurrency

        # built before the clock starts: building one while other streams are in flight
        # blocked this loop and delayed reading their first tokens (their TTFT)
        prompts = [[_prompt(args.prompt_chars, i * per_stream + j, args.nonce)
                    for j in range(per_stream)]
                   for i in range(args.concurrency)]

        async def stream(i):
            await asyncio.sleep(i * stagger)
            return [await _one(session, url, args.model, text, args.max_tokens)
                    for text in prompts[i]]

        t0, t0_unix = time.perf_counter(), time.time()
        results = [r for rs in await asyncio.gather(*map(stream, range(args.concurrency)))
                   for r in rs]
        span_unix_ms = [round(t0_unix * 1e3), round(time.time() * 1e3)]
    ok = [r for r in results if "error" not in r]
    wall = max(r["end"] for r in ok) - t0 if ok else float("nan")
    ttfts = sorted(r["ttft_s"] for r in ok if r["ttft_s"] is not None)
    rates = [r["decode_tok_s"] for r in ok if "decode_tok_s" in r]  # none at --max-tokens 1
    # the gaps between a stream's content events after its first: what a prompt arriving
    # beside it costs the streams already decoding (one event a token, or a speculative run)
    gaps = sorted(g for r in ok for g in r["gaps"])
    if not ttfts:
        return {"label": args.label, "concurrency": args.concurrency, "requests": len(results),
                "ok": 0, "errors": sorted({r["error"] for r in results if "error" in r})}
    return {"label": args.label, "concurrency": args.concurrency, "requests": len(results),
            "ok": len(ok), "stagger_s": stagger, "wall_s": wall,
            "aggregate_tok_s": sum(r["completion_tokens"] for r in ok) / wall,
            "decode_tok_s_median": statistics.median(rates) if rates else None,
            "ttft_median_s": statistics.median(ttfts),
            "ttft_p99_s": _percentile(ttfts, 0.99),
            "gap_p50_s": _percentile(gaps, 0.5) if gaps else None,
            "gap_p99_s": _percentile(gaps, 0.99) if gaps else None,
            "gap_max_s": gaps[-1] if gaps else None,
            "prompt_tokens_median": statistics.median(r["prompt_tokens"] or 0 for r in ok),
            "nonce": args.nonce,
            # wall clock from the first request's start to the last one's end: the server's
            # request log lines of this run (`ttft_burst_table.py` reads them)
            "span_unix_ms": span_unix_ms,
            "cached_prompt_tokens": sum(r["cached_tokens"] or 0 for r in ok),
            "errors": sorted({r["error"] for r in results if "error" in r})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("model")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt-chars", type=int, default=430)
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument("--burst", action="store_true", help="every stream starts at once")
    ap.add_argument("--label", default="")
    ap.add_argument("--nonce", default=secrets.token_hex(4),
                    help="the prompts' prefix (default random: no prompt of an earlier run)")
    ap.add_argument("--json")
    args = ap.parse_args()
    result = asyncio.run(_run(args))
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
