"""A prompt step's Gated DeltaNet launches, one layer, each timed with its launch variants.

    python3 bench/gdn_prompt_parts.py [--out DIR] [--reps N] [--engine-first]
    python3 bench/gdn_prompt_parts.py --smoke   # tiny shapes on the CPU interpreter (plumbing)

Per step shape (a burst of 8 × 955-token rows and one 8,192-token row, 35B-A3B's heads: nk 16,
nv 32; 27B's: nk 16, nv 48; dk = dv = 128) the four launches `GatedDeltaNet._prompt_rows`
makes between its two GEMMs, on the inputs the one before produces:

* `gdn_prompt_prep` (conv, SiLU, norms, gates) by `block_t`;
* `chunk_prep_triton` (the chunks' precompute: `gdn_solve`'s (I + A)⁻¹, then the rest) by
  the column block of its loops over dk / dv and its `num_warps`;
* the chunk walk (`gdn_chunk._walk`, state pool by slot) by `block_v`, `num_warps` and
  `num_stages`;
* `gdn_gated_norm` from the padded o (the gather inside) by `rows_per_program`;

and the split walk that would replace the precompute, the walk and the gated norm
(`kernels.gdn_split`): the precompute of w and u alone, the state walk, the chunks' output
with and without the gated norm, each by its variants, the output's error taken against the
engine's. The table ends with each path's sum at its first variants and at its best ones.

The first variant of each launch is what the engine runs; each variant's output is compared with
it (rel. error, ‖·‖). CUDA
events, mean of --reps calls after one warm-up. Writes gdn-prompt-parts.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if "--smoke" in sys.argv:  # before triton.jit runs: it picks the interpreter at decoration
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

from ninfer_engine.kernels import gdn_chunk  # noqa: E402
from ninfer_engine.kernels.gdn_fused import gdn_gated_norm_triton  # noqa: E402
from ninfer_engine.kernels.gdn_prep import chunk_prep_triton  # noqa: E402
from ninfer_engine.kernels.gdn_prompt import (gdn_prompt_prep_triton, prompt_layout,  # noqa: E402
                                              slot_indices)
from ninfer_engine.kernels.gdn_split import GatedNorm, chunk_output, state_walk  # noqa: E402

# (name, rows' lengths, nk, nv, dk, dv)
SHAPES = [("35B-A3B 8x955", (955,) * 8, 16, 32, 128, 128),
          ("35B-A3B 1x8192", (8192,), 16, 32, 128, 128),
          ("27B 1x8192", (8192,), 16, 48, 128, 128)]
SMOKE = [("tiny 2x40", (40, 33), 1, 2, 16, 16)]
PROMPT = dict(block_t=[16, 32])
# tiles: the precompute's storage (`chunk_prep_triton(tiles_dtype=)`), bf16 halving its writes
PREP = dict(block=[64, 32, 128], num_warps=[4, 8], tiles=["fp32", "bf16"])
TILES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# None: `gdn_chunk.walk_block_v`'s (32 or 64, both swept before: h200-gdn-prompt-parts.md);
# 128: each (row, head) reads its chunks' tiles (~112 KB of a chunk's 128 KB in fp32, shared by
# the value blocks) once; 2 stages: the next chunk's tiles loaded during this one's dots
WALK = dict(block_v=[None, 128], num_warps=[4, 8], num_stages=[1, 2], tiles=["fp32", "bf16"])
NORM_ROWS = [None, 8, 1, 4, 16]  # None: the default; 1: one row a program, as before
SPLIT_PREP = dict(block=[64, 32], num_warps=[4, 8])
# each split variant compiles in the call, twice (two head counts), so the sweeps leave out
# the output's 64-wide dk blocks (they spill at sm_90: bench/results/
# sm90-prompt-kernel-resources.md) and the walk's 16 value columns (4x the programs of 64)
STATE_WALK = dict(block_v=[None, 32, 64], num_warps=[4, 8], num_stages=[1, 2])
CHUNK_OUT = dict(block_v=[64, 128], block=[32], num_warps=[4, 8])
CHUNK_OUT_NORMED = dict(block=[32], num_warps=[8, 4])  # first: what the engine would run
# what each path launches between the prompt prep and the output GEMM
ENGINE_PATH = ("chunk_prep", "walk", "gated_norm")
SPLIT_PATH = ("split_prep", "state_walk", "chunk_output_normed")


def rel(got, ref):
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def timer(dev, reps):
    if dev == "cpu":  # smoke: one wall-clock call
        def wall(fn):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        return wall
    from ninfer_engine.benchmark.timing import time_ms
    return lambda fn: time_ms(fn, reps)


def sweep(name, grid, run, timed, base=None, first_only=False):
    """Time `run(**variant)` for each point of `grid` (`first_only`: its first); error against
    the first point."""
    rows = []
    points = list(itertools.product(*grid.values()))
    for values in points[:1] if first_only else points:
        kw = dict(zip(grid, values))
        try:
            out = run(**kw)
            base = out if base is None else base
            row = dict(kw, ms=timed(lambda: run(**kw)), rel_err=rel(out, base))
        except Exception as exc:  # e.g. out of shared memory
            row = dict(kw, error=repr(exc)[:300])
        print(f"  {name:10} {kw}  {row.get('ms', float('nan')):.3f} ms  "
              f"err {row.get('rel_err', float('nan')):.1e}", flush=True)
        rows.append(row)
    return rows


def shape_parts(name, lengths, nk, nv, dk, dv, dev, timed, engine_first=False):
    gen = torch.Generator().manual_seed(0)
    T, R, C = sum(lengths), len(lengths), 2 * nk * dk + nv * dv
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    qkv = rnd(T, C).bfloat16().to(dev)
    b, a = (rnd(T, nv).bfloat16().to(dev) for _ in range(2))
    conv = (rnd(R, 3, C) * 0.5).bfloat16().to(dev)
    conv_w = (rnd(4, C) * 0.5).bfloat16().to(dev)
    a_log = (torch.rand(nv, generator=gen) * 2 - 1).to(dev)
    dt_bias = rnd(nv).to(dev)
    z = rnd(T, nv * dv).bfloat16().to(dev)
    norm = (1 + 0.1 * rnd(dv)).bfloat16().to(dev)
    pool = (rnd(R, nv, dk, dv) * 0.1).to(dev)
    layout = prompt_layout(tuple(lengths), torch.device(dev))
    slots = slot_indices(tuple(range(R)), torch.device(dev))
    parts = {}

    def prompt(block_t):
        out = gdn_prompt_prep_triton(qkv, b, a, conv, conv_w, a_log, dt_bias, nk, dk, layout,
                                     slots, block_t=block_t)
        return torch.cat([x.reshape(-1) for x in out[:5]])

    parts["prompt_prep"] = sweep("prompt", PROMPT, prompt, timed, first_only=engine_first)
    q, k, v, g, beta, _ = gdn_prompt_prep_triton(qkv, b, a, conv, conv_w, a_log, dt_bias, nk,
                                                 dk, layout, slots)

    def prep(block, num_warps, tiles):
        out, _ = chunk_prep_triton(q, k, v, g, beta, 64, tf32=True, num_warps=num_warps,
                                   block=block, tiles_dtype=TILES[tiles])
        return torch.cat([x.reshape(-1).float() for x in out])

    parts["chunk_prep"] = sweep("chunk prep", PREP, prep, timed, first_only=engine_first)
    tiles, n = chunk_prep_triton(q, k, v, g, beta, 64, tf32=True)
    by_dtype = {"fp32": tiles, "bf16": chunk_prep_triton(q, k, v, g, beta, 64, tf32=True,
                                                         tiles_dtype=torch.bfloat16)[0]}
    states = pool.clone()

    def walk(block_v, num_warps, num_stages, tiles):
        states.copy_(pool)
        o, _ = gdn_chunk._walk(by_dtype[tiles], n, states, layout.first, 64, True, block_v,
                               num_warps, num_stages, slots)
        return torch.cat([o.reshape(-1), states.reshape(-1)])

    parts["walk"] = sweep("walk", WALK, walk, timed, first_only=engine_first)
    o, _ = gdn_chunk._walk(tiles, n, pool.clone(), layout.first, 64, True, None, 4, 1, slots)

    def gated_norm(rows):
        return gdn_gated_norm_triton(o, z, norm, 1e-6, layout.at, rows_per_program=rows)

    parts["gated_norm"] = sweep("gated norm", dict(rows=NORM_ROWS), gated_norm, timed,
                                first_only=engine_first)
    parts.update(split_parts(q, k, v, g, beta, pool, layout, slots, o, gated_norm(None),
                             GatedNorm(z, norm, 1e-6, layout.meta[: layout.padded]), timed))
    return dict(shape=name, lengths=list(lengths), nk=nk, nv=nv, dk=dk, dv=dv, tokens=T,
                parts=parts)


def split_parts(q, k, v, g, beta, pool, layout, slots, engine_o, engine_y, gate, timed):
    """The split walk's three launches, each by its variants, the output with and without the
    gated norm; errors against the engine's o and normed y (see the module docstring)."""
    parts = {}

    def prep(block, num_warps):
        tiles, _ = chunk_prep_triton(q, k, v, g, beta, 64, tf32=True, num_warps=num_warps,
                                     block=block, walk=False)
        return torch.cat([x.reshape(-1) for x in tiles])

    parts["split_prep"] = sweep("split prep", SPLIT_PREP, prep, timed)
    tiles, n = chunk_prep_triton(q, k, v, g, beta, 64, tf32=True, walk=False)
    states = pool.clone()

    def walk(block_v, num_warps, num_stages):
        states.copy_(pool)
        hs, vn, _ = state_walk(tiles, n, k, g, states, layout.first, 64, True, block_v,
                               num_warps, slots=slots, num_stages=num_stages)
        return torch.cat([hs.reshape(-1), vn.reshape(-1), states.reshape(-1)])

    parts["state_walk"] = sweep("state walk", STATE_WALK, walk, timed)
    hs, vn, _ = state_walk(tiles, n, k, g, pool.clone(), layout.first, 64, True, slots=slots)
    real = layout.at.long()  # the padding rows' outputs are never read

    def out(block_v, block, num_warps):
        o = chunk_output(q, k, g, hs, vn, True, block_v=block_v, block=block,
                         num_warps=num_warps)
        return o.index_select(0, real)

    parts["chunk_output"] = sweep("chunk out", CHUNK_OUT, out, timed,
                                  base=engine_o.index_select(0, real))

    def normed(block, num_warps):
        return chunk_output(q, k, g, hs, vn, True, block=block, num_warps=num_warps,
                            norm=gate).float()

    parts["chunk_output_normed"] = sweep("out+norm", CHUNK_OUT_NORMED, normed, timed,
                                         base=engine_y.float())
    return parts


def path_ms(parts, names, pick):
    rows = [pick(parts[name]) for name in names]
    return None if any(r is None or "ms" not in r for r in rows) else sum(r["ms"] for r in rows)


def best(rows):
    ok = [r for r in rows if "ms" in r]
    return min(ok, key=lambda r: r["ms"]) if ok else None


def markdown(meta, shapes):
    lines = [f"# {meta['title']}", "", f"- machine: {meta['device']}, torch {meta['torch']}, "
             f"Triton {meta['triton']}; {meta['date']}", f"- command: `{meta['command']}`",
             f"- {meta['timing']}", "", "| shape | launch | first variant ms | best variant | "
             "best ms | best / first | rel. err of best |", "|---|---|---:|---|---:|---:|---:|"]
    for s in shapes:
        for part, rows in s["parts"].items():
            first, top = rows[0], best(rows)
            if top is None or "ms" not in first:
                continue
            keys = {k: v for k, v in top.items() if k not in ("ms", "rel_err")}
            lines.append(f"| {s['shape']} | {part} | {first['ms']:.3f} | {keys} | "
                         f"{top['ms']:.3f} | {top['ms'] / first['ms']:.2f} | "
                         f"{top['rel_err']:.1e} |")
    lines += ["", "| shape | engine's precompute + walk + gated norm, ms | split's three "
              "launches (the norm in the output's), first variants, ms | split, best variants, "
              "ms | split best / engine |",
              "|---|---:|---:|---:|---:|"]
    for s in shapes:
        engine = path_ms(s["parts"], ENGINE_PATH, lambda rows: rows[0])
        first = path_ms(s["parts"], SPLIT_PATH, lambda rows: rows[0])
        top = path_ms(s["parts"], SPLIT_PATH, best)
        if None not in (engine, first, top):
            lines.append(f"| {s['shape']} | {engine:.3f} | {first:.3f} | {top:.3f} | "
                         f"{top / engine:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    ap.add_argument("--engine-first", action="store_true",
                    help="the engine's own launches at their first (the engine's) variant only")
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    assert dev == "cpu" or torch.cuda.is_available(), "CUDA only (or --smoke)"
    timed = timer(dev, args.reps)
    shapes = []
    for shape in SMOKE if args.smoke else SHAPES:
        print(f"{shape[0]}:", flush=True)
        shapes.append(shape_parts(*shape, dev, timed, args.engine_first))
        if dev == "cuda":
            torch.cuda.empty_cache()
        write(args, dev, shapes)  # after each shape: a call cut short keeps what it measured


def write(args, dev, shapes):
    meta = dict(title="A prompt step's GDN launches by launch variant (one layer)",
                device=torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)",
                torch=torch.__version__, triton=triton.__version__,
                date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                command=" ".join(["python3", "bench/gdn_prompt_parts.py", *sys.argv[1:]]),
                timing=f"CUDA events, mean of {args.reps} calls after one warm-up; error "
                       "against the launch's first variant")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gdn-prompt-parts.json").write_text(json.dumps(dict(meta=meta, shapes=shapes),
                                                          indent=1))
    (out / "gdn-prompt-parts.md").write_text(markdown(meta, shapes))
    if len(shapes) == len(SMOKE if args.smoke else SHAPES):
        print(markdown(meta, shapes))


if __name__ == "__main__":
    main()
