"""A prompt step's dense projections of fp8-row weights on one GPU: the codes decoded to bf16,
then cuBLAS bf16 (`PackedMatrix.linear` past `GEMV_MAX_ROWS` under `--prefill-activations bf16`)
against the served path, e4m3 activations (`act_quant.quantize_rows`, one power-of-two scale a
row) times the codes in the fp8 tensor cores (`kernels.fp8_rows_matmul`: `torch._scaled_mm`,
row-wise scales), and the same with cuBLAS's fast accumulation, at the real shapes and prompt
sizes.

    python3 bench/fp8_dense_bench.py [--tokens 955,4096,7632] [--json PATH]
    python3 bench/fp8_dense_bench.py --render RUN.json --out bench/results/NAME [--note MD]
        (RUN.json's table as bench/results/NAME.{json,md}, through bench/report.write_report)

Each variant: CUDA-event mean of 20 calls after one warm-up, its TFLOP/s, and its largest error
against a float64 product of the same operands (the activations as given, the weights as their
codes times scales), over the RMS of that product: the bf16 path's error is its output
rounding, the fp8 path's adds the activations' e4m3 rounding (each element within 2⁻⁴ of
itself).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ninfer_engine.benchmark.timing import time_ms  # noqa: E402
from report import write_report  # noqa: E402
from ninfer_engine.kernels.act_quant import MAX_COLUMNS, quantize_rows  # noqa: E402
from ninfer_engine.kernels.dequant_gemv import quantize_fp8_row  # noqa: E402
from ninfer_engine.kernels.fp8_dequant import fp8_dequant  # noqa: E402
from ninfer_engine.kernels.fp8_rows_matmul import fp8_rows_matmul  # noqa: E402

# (model, projection, N, K): the fp8-row projections a prompt step multiplies
SHAPES = (("35b-a3b", "gdn in_proj (qkv|z|b|a)", 12352, 2048),
          ("35b-a3b", "gdn out_proj", 2048, 4096),
          ("35b-a3b", "attention q|gate", 8192, 2048),
          ("27b", "gdn in_proj (qkv|z|b|a)", 16480, 5120),
          ("27b", "gdn out_proj", 5120, 6144),
          ("27b", "mlp gate|up", 34816, 5120),
          ("27b", "mlp down", 5120, 17408))


def fp8_row_weight(n: int, k: int, gen) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_fp8_row(torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5)


def variants(codes, scale):
    wscale = scale.float()[None, :]

    def dequant_bf16(x):
        return torch.nn.functional.linear(x, fp8_dequant(codes, scale, torch.bfloat16))

    def fast_accum(x):  # the same with cuBLAS's fast fp8 accumulation (not served)
        q, s = quantize_rows(x)
        return torch._scaled_mm(q, codes.t(), scale_a=s[:, None], scale_b=wscale,
                                out_dtype=torch.bfloat16, use_fast_accum=True)

    if codes.shape[1] > MAX_COLUMNS:  # the row quantizer's limit: the serving path keeps bf16
        return {"dequant+bf16": dequant_bf16}
    return {"dequant+bf16": dequant_bf16,
            "fp8 scaled_mm": lambda x: fp8_rows_matmul(x, codes, wscale),  # the served path
            "fp8 scaled_mm fast-accum": fast_accum}


LABELS = ("dequant+bf16", "fp8 scaled_mm", "fp8 scaled_mm fast-accum")


def markdown(result: dict) -> str:
    lines = [f"# {result['title']}", "", f"- machine: {result['device']}, torch {result['torch']}",
             f"- date: {result['date']}", f"- tree: {result['tree']}",
             f"- command: `{result['command']}`", "",
             "| model | projection | N × K | tokens | " + " | ".join(
                 f"{label} µs (TFLOP/s; max err / RMS)" for label in LABELS)
             + " | bf16 path / fp8 |", "|---" * (5 + len(LABELS)) + "|"]
    for r in result["rows"]:
        cells = [f"{r[k]['us']:.1f} ({r[k]['tflops']:.0f}; {r[k]['max_err_over_rms']:.4f})"
                 if k in r else "not taken (K > the quantizer's 16,384)" for k in LABELS]
        ratio = f"{r[LABELS[0]]['us'] / r[LABELS[1]]['us']:.2f}×" if LABELS[1] in r else "—"
        lines.append(f"| {r['model']} | {r['projection']} | {r['n']} × {r['k']} | {r['tokens']} "
                     f"| {' | '.join(cells)} | {ratio} |")
    if result.get("note"):
        lines += ["", result["note"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="955,4096,7632")
    ap.add_argument("--json")
    ap.add_argument("--render", type=Path, help="a run's JSON to write as a results table")
    ap.add_argument("--out", type=Path, help="--render's results path (no suffix)")
    ap.add_argument("--tree", default="", help="--render: the commit the run measured")
    ap.add_argument("--date", default="", help="--render: the run's date")
    ap.add_argument("--note", type=Path, help="--render: a markdown file of what it shows")
    args = ap.parse_args()
    if args.render:
        result = json.loads(args.render.read_text())
        result.update(title="A prompt step's fp8-row projections: dequantized to bf16 for "
                      "cuBLAS, or e4m3 rows times the codes in `torch._scaled_mm`",
                      command="python3 bench/fp8_dense_bench.py --json RUN.json",
                      tree=args.tree, date=args.date,
                      note=args.note.read_text().strip() if args.note else None)
        write_report(args.out, result, markdown)
        return 0
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for model, name, n, k in SHAPES:
        codes, scale = fp8_row_weight(n, k, gen)
        exact_w = codes.double() * scale.double()[:, None]
        for t in map(int, args.tokens.split(",")):
            x = torch.randn(t, k, generator=gen, device="cuda").bfloat16()
            exact = x.double() @ exact_w.T
            rms = exact.pow(2).mean().sqrt().item()
            row = dict(model=model, projection=name, n=n, k=k, tokens=t)
            for label, fn in variants(codes, scale).items():  # LABELS, in order
                ms = time_ms(lambda: fn(x), 20)
                err = (fn(x).double() - exact).abs().max().item() / rms
                row[label] = dict(us=round(ms * 1e3, 1),
                                  tflops=round(2 * t * n * k / ms / 1e9, 1),
                                  max_err_over_rms=round(err, 5))
            rows.append(row)
            print(f"{model:8s} {name:26s} T={t:5d} " + "  ".join(
                f"{label} {row[label]['us']:8.1f} us {row[label]['tflops']:6.1f} TF/s "
                f"err {row[label]['max_err_over_rms']:.4f}" for label in LABELS if label in row),
                flush=True)
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
