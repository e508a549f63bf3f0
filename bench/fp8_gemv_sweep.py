"""Variant and tile sweep of the dequant GEMV (kernels/dequant_gemv.py), CUDA only.

    python3 bench/fp8_gemv_sweep.py --out bench/results/h200-fp8-gemv.json
    python3 bench/fp8_gemv_sweep.py --formats bf16 --batches 1 --budget 180 \
        --out bench/results/h200-bf16-gemv.json  # Triton on plain bf16 vs cuBLAS, batch 1
    python3 bench/fp8_gemv_sweep.py --smoke --out /tmp/fp8-smoke.json  # CPU interpreter, plumbing

Cases: shapes × B in {1, 8} × formats. fp8 formats (row-scaled; group-scaled G = 32, 128)
default to the 27B decode shapes (MLP up [17408,5120], down [5120,17408], fused gate+up
[34816,5120], [6144,5120], attention o [5120,6144], lm_head [248320,5120]); `bf16` (plain
weights, `scale=None`) to every distinct GEMV of one bf16 decode step of the 35B-A3B and the
27B (`decode_shapes`: the fused groups of models/fused.py, the other projections, router, head;
routed experts run moe_gemv and are not here). Three passes, every kernel compiled first by a
pool of processes (`--jobs`) that fills Triton's disk cache:
  1. every kernel variant (`VARIANTS`: the dot path, `fma`) at one tile, BN 64, BK 256,
     4 warps, 3 stages (for group scales BK is `group_k`), plus the engine's default call;
  2. the `--top` fastest variants per (format, B) (geometric mean over shapes of the time over
     the engine default's), over the tile grid: fp8 BN {32,64,128} × BK {128,256,512} × warps
     {4,8} (3 stages; BN 32 with 8 warps and BN 128 / BK 512 / 4 warps left out); bf16
     `BF16_TILE_GRID`, a smaller one;
  3. per case, the best so far with 2 and 4 stages, and with other K splits, with and without
     the atomic split-K reduction.
Each time is µs per call in a CUDA graph of back-to-back calls rotating over weight copies that
exceed the L2 (as bench/quant_gemv_sweep.py; at least one call per copy), next to cuBLAS bf16
`F.linear` on the same shape timed the same way, and the copy bandwidth measured first in the
run (a 2 GiB device copy). Every row records its error against the fp32 reference (`rel_err`
‖·‖, `max_err` max|Δ| over max|ref|); rows with rel_err > 1e-2 are marked wrong and never
picked. Past `--budget` seconds the remaining timings are skipped (counted in meta). Writes all
rows to `--out` as JSON and prints the best variant+tile per (shape, B, format) with its % of
the copy bandwidth and cuBLAS's time.

The variants the H200 run of bench/results/h200-fp8-gemv.json also swept (bf16/fp16/bit-trick
decodes, fp16 guard, swapped dot operands) are gone from the kernel: its module docstring.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import multiprocessing as mp
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if "--smoke" in sys.argv:  # before triton.jit runs: it picks the interpreter at decoration
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from ninfer_engine.benchmark.timing import copy_bandwidth_gbps, graph_of, time_ms  # noqa: E402
from ninfer_engine.artifact.synth import parameter_shapes, synth_config  # noqa: E402
from ninfer_engine.kernels import dequant_gemv as dg  # noqa: E402
from ninfer_engine.kernels import dequant_gemv_kernels as dgk  # noqa: E402
from ninfer_engine.models.fused import FUSED  # noqa: E402


def decode_shapes(arch, tag):
    """{f"{tag}.name": (N, K)}: the GEMVs one decode step of `arch` (artifact/synth.py ARCHS)
    runs on bf16 weights, one per distinct shape: each fused group of models/fused.py
    (`gdn_in` q|k|v|z|b|a, `attention_in` q|gate|k|v, `mlp_in` / `moe_shared_in` gate|up),
    the other projections (the attention output shares the GDN output's shape), the router and
    the head."""
    config = synth_config(arch, layers=4)  # layers 0-2 GDN, 3 full attention
    shapes, out = parameter_shapes(config), {}
    for i in (0, 3):
        p = f"text/layers/{i}/"
        for group, members in FUSED.items():
            if p + group + members[0] in shapes:
                rows = sum(shapes[p + group + m][0] for m in members)
                out[group.rstrip("/").replace("/", "_") + "_in"] = (rows, config["hidden_size"])
        for name in ("gdn/output", "attention/output", "mlp/down", "moe/shared/down",
                     "moe/router"):
            if p + name in shapes:
                out[name.replace("/", "_").replace("_output", "_out")] = shapes[p + name]
    out["lm_head"] = shapes["text/output_head"]
    seen = set()
    return {f"{tag}.{k}": v for k, v in out.items() if not (v in seen or seen.add(v))}


FP8_SHAPES = {"mlp_up": (17408, 5120), "mlp_down": (5120, 17408), "mlp_gate_up": (34816, 5120),
              "n6144_k5120": (6144, 5120), "attn_o": (5120, 6144), "lm_head": (248320, 5120)}
BF16_SHAPES = {**decode_shapes("35b-a3b", "a3b"), **decode_shapes("27b", "27b")}
SHAPES = {**FP8_SHAPES, **BF16_SHAPES}
SMOKE_SHAPES = {"t_up": (40, 256), "t_down": (24, 512)}
# name -> group: None row scales, 0 plain weights (scale None), else the group size
FORMATS = {"fp8_row": None, "fp8_g32": 32, "fp8_g128": 128,
           "fp8_g64": 64,  # the group the engine's Q4/Q5 -> fp8 repack has; not swept by default
           "bf16": 0}
DEFAULT_FORMATS = "fp8_row,fp8_g32,fp8_g128"
VARIANTS = {
    "base": {},  # codes -> fp32 -> bf16 (plain: the weight as it is), bf16 dot
    "fma": dict(fma=True),  # B = 1: no tl.dot, fp32 products summed per row
}
SCREEN_TILE = (64, 256, 4, 3)  # (BN, BK, warps, stages)
TILE_GRID = [(bn, bk, w, 3)
             for bn, bk, w in itertools.product((32, 64, 128), (128, 256, 512), (4, 8))
             if not (bn == 32 and w == 8) and not (bn == 128 and bk == 512 and w == 4)]
# plain bf16 at B = 1: twice fp8's bytes per K, so BK 128-512 spans fp8's 256-1024 bytes a
# row; BN 16 for the small-N shapes (router, shared expert); no BN 128 (fp8's best at B = 1
# was BN 32-64), and BN 64 × BK 512 on 4 warps (256 elements a thread). 13 + the screen tile
BF16_TILE_GRID = [(bn, bk, w, 3)
                  for bn, bk, w in itertools.product((16, 32, 64), (128, 256, 512), (4, 8))
                  if not (bn == 16 and w == 8) and not (bn == 64 and bk == 512 and w == 4)]
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
L2_DEFEAT_BYTES = 256 << 20
CALLS_PER_GRAPH = 20
WRONG = 1e-2
print = functools.partial(print, flush=True)  # noqa: A001 (progress survives a timeout)
DEV = "cpu" if "--smoke" in sys.argv else "cuda"  # module level: the compile workers see it too


class Budget:
    def __init__(self, seconds):
        self.t0, self.seconds, self.skipped = time.perf_counter(), seconds, 0

    def elapsed(self):
        return time.perf_counter() - self.t0

    def over(self):
        return self.elapsed() > self.seconds


# -- cases and launches --------------------------------------------------------------------------

def grouped(fmt):
    return bool(FORMATS[fmt])


def call_kwargs(fmt, variant, tile, **extra):
    """`dequant_gemv_triton` keyword arguments; tile None: the engine's default call."""
    kw = dict(VARIANTS[variant])
    if tile is not None:
        bn, bk, warps, stages = tile
        kw.update(block_n=bn, num_warps=warps, num_stages=stages)
        kw["group_k" if grouped(fmt) else "block_k"] = bk
    kw.update(extra)
    return kw


def applies(variant, fmt, B):
    return not (VARIANTS[variant].get("fma") and B != 1)


def tile_grid(fmt):
    return BF16_TILE_GRID if FORMATS[fmt] == 0 else TILE_GRID


def launch(n, k, fmt, kw):
    """(programs along N, K split, atomic) of the call, as dequant_gemv_triton computes them."""
    group = FORMATS[fmt]
    scale = torch.empty(0, k // group) if group else None if group == 0 else torch.empty(0)
    bk, _ = dgk._tiles(k, scale, kw.get("block_k", 256), kw.get("group_k"))
    n_blocks = triton.cdiv(n, kw.get("block_n", 64))
    split = kw.get("split") or dgk.split_k(n_blocks, k, bk)
    return n_blocks, split, bool(kw.get("atomic")) and split > 1


def compile_key(n, k, B, fmt, kw):
    """What makes Triton compile anew: constexprs, launch options, B == 1, the output dtype."""
    _, split, atomic = launch(n, k, fmt, kw)
    body = {a: b for a, b in kw.items() if a != "split"}
    return (B == 1, fmt, json.dumps(body, sort_keys=True), split > 1, atomic)


def make_weights(n, k, fmt, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    w = torch.randn(n, k, device=DEV, generator=gen) * 0.02
    group = FORMATS[fmt]
    if group == 0:  # plain bf16: the weight is the "codes", no scale
        return w, w.bfloat16(), None
    codes, scale = dg.quantize_fp8_row(w) if group is None else dg.quantize_fp8_groups(w, group)
    return w, codes, scale


def empty_weights(n, k, fmt):
    """Uninitialised (codes, scale) of the real shapes and dtypes (for compiling)."""
    group = FORMATS[fmt]
    if group == 0:
        return torch.empty(n, k, device=DEV, dtype=torch.bfloat16), None
    codes = torch.empty(n, k, device=DEV, dtype=torch.uint8).view(torch.float8_e4m3fn)
    scale = (torch.ones(n, device=DEV, dtype=torch.bfloat16) if group is None else
             torch.ones(n, k // group, device=DEV, dtype=torch.float16))
    return codes, scale


# -- the compile pool ----------------------------------------------------------------------------

def _compile_chunk(tasks):
    """Worker: run each (n, k, B, fmt, kw) once on uninitialised inputs of the real shapes, so
    Triton compiles it into its disk cache; returns {index: error} for the calls that fail."""
    failed, held = {}, (None, None)
    for idx, (n, k, B, fmt, kw) in tasks:
        if held[0] != (n, k, B, fmt):
            held = (None, None)
            if DEV == "cuda":
                torch.cuda.empty_cache()
            x = torch.zeros(B, k, device=DEV, dtype=torch.bfloat16)
            held = ((n, k, B, fmt), (x, *empty_weights(n, k, fmt)))
        try:
            dgk.dequant_gemv_triton(*held[1], **kw)
            if DEV == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 (reported by the timing pass)
            failed[idx] = repr(exc)[:300]
    return failed


def precompile(pool, jobs, tasks, budget):
    """Compile the distinct kernels among `tasks` [(n, k, B, fmt, kw)] in the pool; stops
    waiting once past the budget (the timing pass then skips, or compiles what it runs)."""
    if pool is None or not tasks or budget.over():
        return 0.0
    t0 = time.perf_counter()
    seen, todo = set(), []
    for n, k, B, fmt, kw in tasks:
        key = compile_key(n, k, B, fmt, kw)
        if key not in seen:
            seen.add(key)
            todo.append((n, k, B, fmt, kw))
    todo.sort(key=lambda t: (t[0], t[1], t[2], t[3]))  # a worker's tasks share inputs
    per = max(1, min(4, math.ceil(len(todo) / (2 * jobs))))  # small: the budget check waits less
    chunks = [list(enumerate(todo))[i:i + per] for i in range(0, len(todo), per)]
    failed = {}
    for part in pool.imap_unordered(_compile_chunk, chunks):
        failed.update(part)
        if budget.over():
            break
    dt = time.perf_counter() - t0
    print(f"  compiled {len(todo)} kernels in {dt:.0f} s ({len(failed)} failed)")
    return dt


# -- timing --------------------------------------------------------------------------------------

def time_us(fns):
    """µs per call of `fns` called round-robin, each at least once a graph (small weights:
    more than CALLS_PER_GRAPH copies); on the CPU (smoke) one wall-clock call."""
    if DEV != "cuda":
        t0 = time.perf_counter()
        fns[0]()
        return (time.perf_counter() - t0) * 1e6
    calls = max(CALLS_PER_GRAPH, len(fns))

    def body():
        for i in range(calls):
            fns[i % len(fns)]()
    graph = graph_of(body)
    return time_ms(graph.replay, 5) / calls * 1e3


def copies_of(tensors, nbytes):
    if DEV != "cuda":
        return [tensors]
    count = max(2, -(-L2_DEFEAT_BYTES // nbytes))
    return [tensors] + [tuple(t if t is None else t.clone() for t in tensors)
                        for _ in range(count - 1)]


class Case:
    """One (shape, format) with its weight copies; `run` times one call configuration."""

    def __init__(self, shape_name, fmt, batches, copy_gbps):
        self.shape_name, self.fmt, self.copy_gbps = shape_name, fmt, copy_gbps
        self.n, self.k = n, k = SHAPES[shape_name]
        w, codes, scale = make_weights(n, k, fmt)
        self.wbytes = sum(t.numel() * t.element_size() for t in (codes, scale) if t is not None)
        self.copies = copies_of((codes, scale), self.wbytes)
        deq = dg.dequantize(codes, scale)
        gen = torch.Generator(device=DEV).manual_seed(1)
        self.x = {B: torch.randn(B, k, device=DEV, generator=gen).bfloat16() for B in batches}
        self.ref = {B: x.float() @ deq.t() for B, x in self.x.items()}
        del w, deq

    def bytes(self, B):
        return self.wbytes + B * self.k * 2 + B * self.n * 2

    def run(self, B, variant, tile, budget, phase, **extra):
        kw = call_kwargs(self.fmt, variant, tile, **extra)
        n_blocks, split, atomic = launch(self.n, self.k, self.fmt, kw)
        row = dict(phase=phase, shape=[self.n, self.k], shape_name=self.shape_name, B=B,
                   fmt=self.fmt, variant=variant, tile=None if tile is None else list(tile),
                   kwargs=kw, programs=n_blocks * split, split=split, atomic=atomic)
        if budget.over():
            budget.skipped += 1
            return None
        x = self.x[B]
        try:
            t0 = time.perf_counter()
            out = dgk.dequant_gemv_triton(x, *self.copies[0], **kw).float()
            wall_us = (time.perf_counter() - t0) * 1e6
            ref = self.ref[B]
            row["rel_err"] = ((out - ref).norm() / ref.norm()).item()
            row["max_err"] = ((out - ref).abs().max() / ref.abs().max()).item()
            row["wrong"] = not (row["rel_err"] <= WRONG)  # NaN counts as wrong
            row["us"] = wall_us if DEV != "cuda" else time_us(
                [lambda c=c: dgk.dequant_gemv_triton(x, *c, **kw) for c in self.copies])
        except Exception as exc:  # noqa: BLE001 (a configuration that does not compile or run)
            row["error"] = repr(exc)[:300]
            return row
        gbps = self.bytes(B) / row["us"] / 1e3
        row["gbps"] = gbps
        row["copy_frac"] = gbps / self.copy_gbps if self.copy_gbps else None
        return row


def cublas_us(n, k, batches):
    """cuBLAS bf16 F.linear µs on the same shape, rotating dense copies, per B."""
    gen = torch.Generator(device=DEV).manual_seed(2)
    dense = [(torch.randn(n, k, device=DEV, generator=gen) * 0.02).bfloat16()]
    if DEV == "cuda":
        dense += [d.clone() for d in dense * (max(2, -(-L2_DEFEAT_BYTES // (n * k * 2))) - 1)]
    out = {}
    for B in batches:
        x = torch.randn(B, k, device=DEV, generator=gen).bfloat16()
        out[B] = time_us([lambda d=d: F.linear(x, d) for d in dense])
    return out


# -- report --------------------------------------------------------------------------------------

def good(r):
    return r is not None and "us" in r and not r["wrong"]


def best_rows(rows, variant=None):
    """Fastest correct row per (shape, B, format), among `variant`'s rows if given."""
    best = {}
    for r in filter(good, rows):
        key = (r["shape_name"], r["B"], r["fmt"])
        if (variant is None or r["variant"] == variant) and \
                (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    return best


def write(path, rows, meta, cublas, default_us):
    best, fma = best_rows(rows), best_rows(rows, "fma")
    summary = []
    for (shape_name, B, fmt), r in best.items():
        cub, dflt = cublas.get((shape_name, B)), default_us.get((shape_name, B, fmt))
        f = fma.get((shape_name, B, fmt))
        n, k = r["shape"]
        summary.append(dict(shape_name=shape_name, shape=r["shape"], B=B, fmt=fmt,
                            variant=r["variant"], kwargs=r["kwargs"], us=r["us"], gbps=r["gbps"],
                            copy_frac=r["copy_frac"], rel_err=r["rel_err"], max_err=r["max_err"],
                            cublas_bf16_us=cub, vs_cublas=cub / r["us"] if cub else None,
                            cublas_copy_frac=(2 * (n * k + B * (n + k)) / cub / 1e3
                                              / meta["copy_gbps"]
                                              if cub and meta.get("copy_gbps") else None),
                            fma_us=f and f["us"], fma_kwargs=f and f["kwargs"],
                            fma_vs_cublas=cub / f["us"] if f and cub else None,
                            default_us=dflt, vs_default=dflt / r["us"] if dflt else None))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(dict(
        meta=meta, best=summary,
        cublas_bf16=[dict(shape_name=s, B=B, us=us) for (s, B), us in cublas.items()],
        rows=[r for r in rows if r is not None]), indent=1))
    return summary


def print_table(summary, shape_order):
    print("\nbest per (shape, B, format); % of the measured copy bandwidth; x = speed-up "
          "(over cuBLAS bf16 F.linear, same shape, same run; fma: the best fma row's)")
    print(f"{'shape':18}{'B':>3} {'format':9}{'variant':9}{'tile':40}{'µs':>8}{'GB/s':>7}"
          f"{'%copy':>6}{'cuBLAS':>8}{'%copy':>6}{'x cuBLAS':>9}{'fma x':>7}{'x default':>10}"
          f"{'rel.err':>9}")
    order = {s: i for i, s in enumerate(shape_order)}

    def num(v, fmt, width):
        return f"{v:{width}{fmt}}" if v is not None else f"{'-':>{width}}"
    for r in sorted(summary, key=lambda r: (order[r["shape_name"]], r["B"], r["fmt"])):
        pct = num(r["copy_frac"] and r["copy_frac"] * 100, ".0f", 6)
        cpct = num(r["cublas_copy_frac"] and r["cublas_copy_frac"] * 100, ".0f", 6)
        print(f"{r['shape_name']:18}{r['B']:3d} {r['fmt']:9}{r['variant']:9}"
              f"{_tile_text(r['kwargs']):40}{r['us']:8.1f}{r['gbps']:7.0f}{pct}"
              f"{num(r['cublas_bf16_us'], '.1f', 8)}{cpct}{num(r['vs_cublas'], '.2f', 9)}"
              f"{num(r['fma_vs_cublas'], '.2f', 7)}{num(r['vs_default'], '.2f', 10)}"
              f"{r['rel_err']:9.1e}")


def _tile_text(kw):
    if "block_n" not in kw:
        return "engine default"
    bk = kw.get("group_k", kw.get("block_k"))
    text = f"BN={kw['block_n']} BK={bk} w={kw['num_warps']} s={kw['num_stages']}"
    if kw.get("split"):
        text += f" split={kw['split']}" + (" atomic" if kw.get("atomic") else "")
    return text


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("inf")


# -- main ----------------------------------------------------------------------------------------

def main():
    global DEV, SHAPES, SCREEN_TILE, TILE_GRID, BF16_TILE_GRID, SPLITS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--shapes", default=None, help="comma-separated names of SHAPES")
    ap.add_argument("--formats", default=None,
                    help=f"of {', '.join(FORMATS)} (default {DEFAULT_FORMATS}; smoke: +bf16)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--variants", default=None, help="comma-separated names of VARIANTS")
    ap.add_argument("--top", type=int, default=2, help="variants per (format, B) in pass 2")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds before skipping")
    ap.add_argument("--jobs", type=int, default=None, help="compile processes (0: none)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    args = ap.parse_args()
    budget = Budget(args.budget)
    if args.smoke:
        DEV, SHAPES = "cpu", SMOKE_SHAPES
        SCREEN_TILE, TILE_GRID, SPLITS = (32, 256, 4, 3), [(32, 128, 4, 3), (64, 256, 4, 3)], (1, 2)
        BF16_TILE_GRID = [(16, 128, 4, 3), (32, 256, 4, 3)]
    assert DEV == "cpu" or torch.cuda.is_available(), "the sweep needs CUDA (or --smoke)"
    formats = (args.formats or DEFAULT_FORMATS + (",bf16" if args.smoke else "")).split(",")
    # shapes per format: --shapes for all, else the 27B set for fp8, the decode GEMVs for bf16
    shapes_of = {f: (args.shapes.split(",") if args.shapes else list(SHAPES) if args.smoke else
                     list(BF16_SHAPES if FORMATS[f] == 0 else FP8_SHAPES)) for f in formats}
    shapes = list(dict.fromkeys(s for f in formats for s in shapes_of[f]))
    cases = [(s, f) for s in shapes for f in formats if s in shapes_of[f]]  # shape-major
    batches = [int(b) for b in args.batches.split(",")]
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    jobs = args.jobs if args.jobs is not None else (2 if args.smoke else min(16, os.cpu_count()))

    copy_gbps = copy_bandwidth_gbps() if DEV == "cuda" else None
    device = torch.cuda.get_device_name() if DEV == "cuda" else platform.processor() or "cpu"
    bw = f"{copy_gbps:.0f} GB/s" if copy_gbps else "not measured (CPU)"
    print(f"{device}; copy bandwidth {bw}; {jobs} compile processes")
    meta = dict(device=device, torch=torch.__version__, triton=triton.__version__,
                date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                command=" ".join(["python3", "bench/fp8_gemv_sweep.py", *sys.argv[1:]]),
                copy_gbps=copy_gbps, calls_per_graph=CALLS_PER_GRAPH,
                timing="µs per call: CUDA graph of back-to-back calls over rotating weight copies "
                       f"(>= {L2_DEFEAT_BYTES >> 20} MiB), mean of 5 replays (time_ms)",
                bytes="codes + scales + x + y; copy_frac = GB/s over copy_gbps")
    pool = mp.get_context("spawn").Pool(jobs) if jobs else None
    rows, cublas, default_us, compile_s = [], {}, {}, 0.0

    def tasks_for(plan):
        return [(*SHAPES[s], B, fmt, call_kwargs(fmt, v, t, **ex)) for s, fmt, B, v, t, ex in plan]

    def run_plan(plan, phase):
        """plan: [(shape, fmt, B, variant, tile, extra)], grouped by (shape, fmt)."""
        nonlocal compile_s
        compile_s += precompile(pool, jobs, tasks_for(plan), budget)
        for (s, fmt), items in itertools.groupby(plan, key=lambda p: (p[0], p[1])):
            if budget.over():
                budget.skipped += len(list(items))
                continue
            case = Case(s, fmt, batches, copy_gbps)
            for _, _, B, v, t, ex in items:
                r = case.run(B, v, t, budget, phase, **ex)
                if r is None:
                    continue
                rows.append(r)
                if phase == 1 and v == "base" and t is None:
                    default_us[(s, B, fmt)] = r.get("us")
                if "us" in r:
                    pct = r["copy_frac"] * 100 if r["copy_frac"] else 0
                    status = (f"{r['us']:9.1f} µs {pct:4.0f}% err {r['rel_err']:.1e}"
                              + ("  WRONG" if r["wrong"] else ""))
                else:
                    status = f" failed: {r['error'][:90]}"
                print(f"  {s:18}{B:3d} {fmt:9}{v:9}{_tile_text(r['kwargs']):40}{status}")
            del case
            if DEV == "cuda":
                torch.cuda.empty_cache()
        write(args.out, rows, dict(meta, compile_s=compile_s, skipped=budget.skipped,
                                   elapsed_s=budget.elapsed()), cublas, default_us)

    print(f"\ncuBLAS bf16 F.linear [{budget.elapsed():.0f} s]")
    for s in shapes:
        for B, us in cublas_us(*SHAPES[s], batches).items():
            cublas[(s, B)] = us
            print(f"  {s:18}{B:3d} {us:9.1f} µs")
        if DEV == "cuda":
            torch.cuda.empty_cache()

    print(f"\npass 1: every variant at {SCREEN_TILE} [{budget.elapsed():.0f} s]")
    plan = []
    for s, fmt in cases:
        for B in batches:
            plan.append((s, fmt, B, "base", None, {}))
            plan += [(s, fmt, B, v, SCREEN_TILE, {}) for v in variants if applies(v, fmt, B)]
    run_plan(plan, 1)

    print(f"\npass 2: tile grid for the top {args.top} variants [{budget.elapsed():.0f} s]")
    picks = {}
    for fmt, B in itertools.product(formats, batches):
        speed = {}
        for v in variants:
            ratios = []
            for r in rows:
                if r["phase"] == 1 and r["fmt"] == fmt and r["B"] == B and r["variant"] == v \
                        and r["tile"] is not None and good(r):
                    dflt = default_us.get((r["shape_name"], B, fmt))
                    if dflt:
                        ratios.append(r["us"] / dflt)
            if len(ratios) == len(shapes_of[fmt]):  # correct and running on every shape
                speed[v] = geomean(ratios)
        ranked = sorted(speed, key=speed.get)
        picks[(fmt, B)] = ranked[:args.top]
        print(f"  {fmt:9}B={B}: " + ", ".join(f"{v} {speed[v]:.2f}" for v in ranked[:6])
              + f"  (µs / default, geomean) -> {picks[(fmt, B)]}")
    plan = []
    for s, fmt in cases:  # shapes in order: the MLP ones first
        for B in batches:
            plan += [(s, fmt, B, v, t, {}) for v in picks[(fmt, B)] for t in tile_grid(fmt)
                     if t != SCREEN_TILE]
    run_plan(plan, 2)

    print(f"\npass 3: stages, K splits and atomic split-K for each best (and best fma) "
          f"[{budget.elapsed():.0f} s]")
    plan = []
    best, best_fma = best_rows(rows), best_rows(rows, "fma")
    for (s, fmt), B in itertools.product(cases, batches):
        tuned = [best.get((s, B, fmt)), best_fma.get((s, B, fmt))]
        for r in tuned[:1] if tuned[0] is tuned[1] else tuned:
            if r is None or r["tile"] is None:
                continue
            bn, bk, w, st = r["tile"]
            for stages in (2, 3, 4):
                if stages != st:
                    plan.append((s, fmt, B, r["variant"], (bn, bk, w, stages), {}))
            n, k = SHAPES[s]
            tiles = k // min(bk, k & -k)
            for split in SPLITS:
                if tiles % split == 0 and split <= tiles:
                    for atomic in ((False, True) if split > 1 else (False,)):
                        if not (split == r["split"] and atomic == r["atomic"]):
                            plan.append((s, fmt, B, r["variant"], tuple(r["tile"]),
                                         dict(split=split, atomic=atomic)))
    plan.sort(key=lambda p: shapes.index(p[0]) * 10 + formats.index(p[1]))
    run_plan(plan, 3)
    if pool is not None:
        pool.terminate()  # compiles still queued past the budget are dropped

    meta.update(compile_s=compile_s, skipped=budget.skipped, elapsed_s=budget.elapsed())
    summary = write(args.out, rows, meta, cublas, default_us)
    print_table(summary, shapes)
    print(f"\n{len(rows)} rows, {sum(not good(r) for r in rows)} failed or wrong, "
          f"{budget.skipped} skipped past the budget; {budget.elapsed():.0f} s "
          f"({compile_s:.0f} s compiling); wrote {args.out}")


if __name__ == "__main__":
    main()
