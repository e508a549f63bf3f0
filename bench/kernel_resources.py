"""Registers, spills and shared memory of a prompt step's kernels compiled for an H200, no GPU.

    python3 bench/kernel_resources.py [--out DIR] [--only TEXT]

Each launch variant of a prompt step's Gated DeltaNet kernels at the models' head shape
(dk = dv = 128, two value heads a q/k head, 64-token chunks, TF32 dots) and of its routed
experts' two grouped GEMMs (35B-A3B: H 2,048, I 512, 256 experts, e4m3 activations on an
fp8-row stack, as `--prefill-activations fp8` serves) is compiled by Triton
for sm_90 and its cubin read with the `cuobjdump` Triton ships (`--dump-resource-usage`): the
registers a thread uses (255 is the ceiling), the stack bytes a thread spills to local memory,
and the shared memory a program asks for. This is static: a spill costs what the cache makes
of it, and the H200 sweeps have seen a spilling variant beat a clean one
(bench/results/h200-gdn-prompt-parts.md: the precompute at 4 warps), so it says where to
look, not what is fast — `bench/gdn_prompt_parts.py` times them. Writes
sm90-prompt-kernel-resources.{json,md}; the Triton version compiling decides the numbers. The
device runs 3.6; to compile with it here:

    pip install --target /tmp/t36 --no-deps triton==3.6.0
    PYTHONPATH=/tmp/t36 python3 bench/kernel_resources.py
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["TRITON_INTERPRET"] = "0"  # compile, not interpret

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ninfer_engine.kernels.gdn_chunk import _gdn_chunk_kernel  # noqa: E402
from ninfer_engine.kernels.gdn_prep import _gdn_prep_kernel  # noqa: E402
from ninfer_engine.kernels.gdn_solve import _gdn_solve_kernel  # noqa: E402
from ninfer_engine.kernels.gdn_split import _chunk_out_kernel, _state_walk_kernel  # noqa: E402
from ninfer_engine.kernels.moe_grouped_kernels import _down_kernel, _swiglu_kernel  # noqa: E402

HEAD = dict(DK=128, DV=128, C=64)
P, I = "*fp32", "i32"
OUT_TYPES = [P] * 6 + ["*i32", "*bf16", "*bf16"] + [I] * 9 + ["fp32"] * 2  # _chunk_out_kernel
MOE = dict(E=256, EP=256, MODE=1, G=128, DOT=tl.float8e4nv, MANUAL_RNE=False, FP8_ACT=True)
# order, tile ends, starts, counts: int64 / int32 / int32 / int64 (moe_grouped.tile_plan's);
# an fp8-row stack's scales bf16
SWIGLU_TYPES = ["*fp8e4nv", P, "*i64", "*i32", "*i32", "*i64", "*fp8e4nv", "*bf16", "*bf16", I]
DOWN_TYPES = ["*fp8e4nv", P, "*i64", "*bf16", "*i32", "*i32", "*i64", "*fp8e4nv", "*bf16", "*bf16"]
# (launch, kernel, argument types, fixed constants, swept constants, warps, the engine's
# variants); "stages" is the launch's num_stages (1 where not swept)
LAUNCHES = [
    ("solve", _gdn_solve_kernel, [P] * 4 + [I] * 8, dict(GROUP=2, DK=128, C=64, BK=64, TF32=True),
     {}, [1, 2, 4], [dict(warps=1)]),
    ("precompute (old walk's tiles)", _gdn_prep_kernel, [P] * 12 + [I] * 12 + ["fp32"],
     dict(HEAD, GROUP=2, BK=128, BV=128, TF32=True, WALK=True), dict(BLOCK=[64, 32]), [4, 8],
     [dict(BLOCK=64, warps=4)]),
    # the engine's walk takes 64 value columns at 8 rows × 32 heads, 32 at one row
    # (`gdn_chunk.walk_block_v`)
    ("chunk walk (old)", _gdn_chunk_kernel, [P] * 9 + [I, "*i32", "*i64"] + [I] * 22,
     dict(HEAD, NV=32, BK=128, EVEN=True, TF32=True, ROWS=True, SLOTS=True), dict(BV=[32, 64]),
     [4, 8], [dict(BV=64, warps=4)]),
    ("precompute (w, u only)", _gdn_prep_kernel, [P] * 12 + [I] * 12 + ["fp32"],
     dict(HEAD, GROUP=2, BK=128, BV=128, TF32=True, WALK=False), dict(BLOCK=[64, 32]), [4, 8],
     None),
    ("split: state walk", _state_walk_kernel, [P] * 8 + [I, I, "*i32", "*i64"] + [I] * 5,
     dict(HEAD, NV=32, GROUP=2, KB=64, TWO=True, EVEN=True, TF32=True, ROWS=True, SLOTS=True),
     dict(BV=[16, 32, 64], stages=[1, 2]), [4, 8], None),
    ("split: chunk output", _chunk_out_kernel, OUT_TYPES,
     dict(HEAD, NV=32, GROUP=2, EVEN=True, TF32=True, GATED=False, ROUND_PROD=True,
          LIBDEVICE=True), dict(BV=[32, 64, 128], BLOCK=[32, 64]), [4, 8], None),
    ("split: chunk output + gated norm", _chunk_out_kernel, OUT_TYPES,
     dict(HEAD, NV=32, GROUP=2, BV=128, EVEN=True, TF32=True, GATED=True,
          ROUND_PROD=True, LIBDEVICE=True), dict(BLOCK=[32, 64]), [4, 8], None),
    # the engine's row tile: 64 rows an expert's tile from 16 rows an expert, 128 from 128
    # (`moe_grouped.ROW_TILES`); its sizes `LAUNCH_FP8`
    ("experts: SwiGLU GEMM", _swiglu_kernel, SWIGLU_TYPES, dict(MOE, I=512, H=2048),
     dict(BM=[64, 128], BN=[64, 128], BK=[128], stages=[3]), [4, 8],
     [dict(BM=64, BN=64, BK=128, stages=3, warps=4), dict(BM=128, BN=64, BK=128, stages=3,
                                                          warps=4)]),
    ("experts: down GEMM", _down_kernel, DOWN_TYPES, dict(MOE, H=2048, I=512),
     dict(BM=[64, 128], BN=[64, 128], BK=[64, 128], stages=[3]), [4, 8],
     [dict(BM=64, BN=64, BK=128, stages=3, warps=4), dict(BM=128, BN=64, BK=64, stages=3,
                                                          warps=4)]),
]


def _cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")


def resources(kernel, types, consts, warps, stages) -> dict:
    """The compiled variant's registers, spilled stack bytes (a thread) and shared bytes."""
    assert len(types) + len(consts) == len(kernel.arg_names), kernel.arg_names
    signature = {**dict(zip(kernel.arg_names, types)), **dict.fromkeys(consts, "constexpr")}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=consts),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], check=True,
                               capture_output=True, text=True).stdout
    fields = dict(x.split(":", 1) for x in next(line for line in usage.splitlines()
                                                  if "REG:" in line).split() if ":" in x)
    return dict(registers=int(fields["REG"]), spill_bytes=int(fields["STACK"]),
                shared_bytes=compiled.metadata.shared)


def sweep(only: str = ""):
    """Every variant of the launches whose name holds `only`."""
    rows = []
    for launch, kernel, types, fixed, swept, warps, engine in LAUNCHES:
        if only not in launch:
            continue
        for values in itertools.product(*swept.values(), warps):
            variant = dict(zip([*swept, "warps"], values))
            consts = dict(fixed, **{k: v for k, v in variant.items()
                                    if k not in ("warps", "stages")})
            row = dict(launch=launch, variant=variant, engine=variant in (engine or []),
                       **resources(kernel, types, consts, variant["warps"],
                                   variant.get("stages", 1)))
            print(row, flush=True)
            rows.append(row)
    return rows


def markdown(meta, rows):
    lines = [f"# {meta['title']}", "", f"- {meta['what']}", f"- Triton {meta['triton']}, "
             f"target sm_90 (H200), compiled on {meta['host']}; {meta['date']}",
             f"- command: `{meta['command']}`", "",
             "| launch | variant | registers | spilled bytes / thread | shared KiB |",
             "|---|---|---:|---:|---:|"]
    for r in rows:
        variant = ", ".join(f"{k} {v}" for k, v in r["variant"].items())
        mark = " (engine)" if r["engine"] else ""
        lines.append(f"| {r['launch']} | {variant}{mark} | {r['registers']} | "
                     f"{r['spill_bytes']} | {r['shared_bytes'] / 1024:.0f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    ap.add_argument("--only", default="", help="the launches whose name holds this text")
    args = ap.parse_args()
    rows = sweep(args.only)
    meta = dict(title="A prompt step's kernels compiled for sm_90: registers and spills (static)",
                what="GDN: dk = dv = 128, nv 32 (two value heads a q/k head), 64-token chunks, "
                     "TF32 dots; experts: 35B-A3B's H 2,048, I 512, 256 experts, e4m3 "
                     "activations on an fp8-row stack; one pipeline stage unless `stages` says; "
                     "static resource usage of each cubin "
                     "(`cuobjdump --dump-resource-usage`), not a timing",
                triton=triton.__version__, host=os.uname().nodename,
                date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                command=" ".join([*(["PYTHONPATH=" + os.environ["PYTHONPATH"]]
                                    if os.environ.get("PYTHONPATH") else []),
                                  "python3", "bench/kernel_resources.py", *sys.argv[1:]]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sm90-prompt-kernel-resources.json").write_text(
        json.dumps(dict(meta=meta, rows=rows), indent=1))
    (out / "sm90-prompt-kernel-resources.md").write_text(markdown(meta, rows))
    print(markdown(meta, rows))


if __name__ == "__main__":
    main()
