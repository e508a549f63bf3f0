"""Markdown tables for the kernel sweeps' JSON (written on the GPU machine, rendered anywhere).

    python3 bench/kernel_tables.py bench/results/h200-quant-gemv.json   # -> .md beside it
    python3 bench/kernel_tables.py bench/results/h200-gdn-chunk.json
    python3 bench/kernel_tables.py bench/results/h200-paged-prefill.json
    python3 bench/kernel_tables.py bench/results/h200-fp8-gemv.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def quant_gemv(result: dict) -> str:
    """Best launch per (format, shape, batch) of `quant_gemv_sweep.py` beside cuBLAS bf16."""
    meta = result.get("meta", {"device": result.get("device", "?")})
    best, cublas = {}, {}
    for r in result["rows"]:
        key = (r["fmt"], tuple(r["shape"]), r.get("B"))
        if r["kind"] == "cublas_bf16":
            cublas[key] = r["us"]
        elif r["kind"] == "gemv" and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    lines = [f"# Fused dequant GEMV sweep ({meta['device']})", "",
             f"- command: `{meta.get('command', 'python3 bench/quant_gemv_sweep.py')}`"
             f"{', ' + meta['date'] if 'date' in meta else ''}",
             "- best launch of the grid per row; the reference is cuBLAS bf16 `F.linear` on the "
             "same shape in the same run (weights rotated past L2)", "",
             "| format | [N, K] | B | µs | GB/s | % of 4.8 TB/s | cuBLAS bf16 µs | speed vs cuBLAS |",
             "|---|---|---|---|---|---|---|---|"]
    for (fmt, shape, b), r in sorted(best.items()):
        ref = cublas.get((fmt, shape, b), float("nan"))
        lines.append(f"| {fmt} | {list(shape)} | {b} | {r['us']:.1f} | {r['gbps']:.0f} | "
                     f"{100 * r['hbm_frac']:.0f} % | {ref:.1f} | {ref / r['us']:.2f}× |")
    return "\n".join(lines) + "\n"


def gdn_chunk(result: dict) -> str:
    """`gdn_chunk_bench.py`: torch chunked rule against the Triton kernel, per layer."""
    m = result["meta"]
    lines = [f"# Chunked GDN prefill, one layer ({m['device']}, torch {m['torch']}, Triton "
             f"{m['triton']})", "", f"- command: `{m['command']}`, {m['date']}",
             f"- {m['timing']}; {m['note']}", "",
             "| shape | T | torch ms | Triton IEEE ms | Triton TF32 ms | precompute: torch ms "
             "| precompute: Triton TF32 ms | TF32 vs torch | TF32 rel. error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        prep = f"{r['prep_triton_ms']:.2f}" if "prep_triton_ms" in r else "—"
        lines.append(f"| {r['shape']} | {r['T']} | {r['torch_ms']:.2f} | {r['ieee_ms']:.2f} | "
                     f"{r['tf32_ms']:.2f} | {r['prep_ms']:.2f} | {prep} | "
                     f"{r['speedup_tf32']:.1f}× | {r['tf32_out']['rel_err']:.1e} |")
    return "\n".join(lines) + "\n"


def paged_prefill(result: dict) -> str:
    """`paged_prefill_bench.py`: the kernel over pages in place against gather + SDPA (1024-
    token chunks), and split against one run of pages (short chunks over a long context)."""
    m = result["meta"]
    lines = [f"# Paged prefill attention, one layer ({m['device']}, torch {m['torch']}, Triton "
             f"{m['triton']})", "", f"- command: `{m['command']}`, {m['date']}",
             "- reference, same run: for 1024-token chunks, gather the pages + "
             "`F.scaled_dot_product_attention` (the path the kernel replaced); for short chunks, "
             "the kernel with one run of pages (`splits=1`, before the split); error against the "
             "fp32 reference", "",
             "| shape | chunk | start | KV | kernel ms | reference ms | speed-up | TFLOP/s | "
             "rel. error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        ref, gain = "—", "—"
        for key in ("gather_sdpa_ms", "one_run_ms"):
            if key in r:
                ref, gain = f"{r[key]:.3f}", f"{r['speedup']:.2f}×"
        lines.append(f"| {r['shape']} | {r.get('chunk', 1024)} | {r['start']} | {r['kv']} | "
                     f"{r['kernel_ms']:.3f} | {ref} | {gain} | {r['tflops']:.0f} | "
                     f"{r['rel_err']:.1e} |")
    return "\n".join(lines) + "\n"


def fp8_gemv(result: dict) -> str:
    """`fp8_gemv_sweep.py`: best variant and launch per (shape, B, format), beside the engine's
    previous default launch and cuBLAS bf16, all in the same run."""
    m = result["meta"]
    f16u = any(r["variant"] == "f16u" for r in result["best"])
    lines = [f"# Dequant GEMV variants ({m['device']}, torch {m['torch']}, Triton "
             f"{m['triton']})", "", f"- command: `{m['command']}`, {m['date']}",
             f"- {m['timing']}; copy bandwidth measured in the run: {m['copy_gbps']:.0f} GB/s",
             "- default = the dot path at BN 64, BK 256 / one group (the engine's launch "
             "before the first sweep)"
             + ("; `f16u` casts x to fp16 unguarded (unsafe above 65504)" if f16u else ""), "",
             "| shape | [N, K] | B | format | best variant | launch | µs | % of copy | × default "
             "| × cuBLAS bf16 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["best"]:
        launch = ", ".join(f"{k}={v}" for k, v in r["kwargs"].items() if k != "fma")
        lines.append(f"| {r['shape_name']} | {r['shape']} | {r['B']} | {r['fmt']} | "
                     f"{r['variant']} | {launch} | {r['us']:.1f} | "
                     f"{100 * r['copy_frac']:.0f} % | {r['vs_default']:.2f} | "
                     f"{r['vs_cublas']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    for name in sys.argv[1:]:
        path = Path(name)
        result = json.loads(path.read_text())
        rows = result["rows"]
        render = (fp8_gemv if "best" in result else
                  paged_prefill if rows and "kernel_ms" in rows[0] else
                  gdn_chunk if "sweep" in result else quant_gemv)
        path.with_suffix(".md").write_text(render(result))
        print(path.with_suffix(".md"))


if __name__ == "__main__":
    main()
