"""The 27B-shape vision tower on CUDA (random weights): one 1024×1024 image, ours beside
transformers' own encoder, and the served engine's time to first token with that image.

    python bench/vision_encoder.py --out bench/results [--runs 10] [--no-ttft]
    python bench/vision_encoder.py --out /tmp/v --small --device cpu   # a CPU dry run

1. Encoder. The Qwen3.5-27B tower (model-math.md §6, ninfer-format.md §3.1: depth 27, width
   1152, 16 heads, MLP 4304, patch 16, temporal 2, merge 2, 2304 positions, output 5120) drawn
   by transformers (`Qwen3_5VisionModel`, bf16, SDPA) and mapped to our `vision/...` names
   (`artifact.hf_vision_names`): both encode the same patch rows (the image preprocessed once, timed on
   its own) of a 64×64 patch grid, 1024 merged tokens. Median of `--runs` after two warm-ups;
   the largest |ours − theirs| relative to max |theirs| says they computed the same thing.
2. TTFT. `ninfer bench`'s engine over the 27B-shape text model drawn on the device (synth
   `27b`, bf16, CUDA graphs) with our tower (media cache off, so every request encodes): a
   greedy one-token request with the image (1024 media tokens plus ~20 of text), submission to
   first token, and the encoder's share of it (`Timings.vision_s`); beside it a text-only prompt
   of the same length. Median of `--runs` after one warm-up each.

Writes OUT/h200-vision-encoder.{json,md} (`--small`: OUT/vision-encoder-small.*).
"""
from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import write_report  # noqa: E402
from ninfer_engine.artifact.hf_vision_names import (  # noqa: E402
    vision_block_from_hf, vision_globals_from_hf, vision_shapes,
)
from ninfer_engine.models.qwen3_5 import dict_params  # noqa: E402
from ninfer_engine.vision.decode import image_item  # noqa: E402
from ninfer_engine.vision.encoder import VisionEncoder  # noqa: E402
from ninfer_engine.vision.preprocess import Preprocessor  # noqa: E402

TOWER_27B = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                 patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                 num_position_embeddings=2304, out_hidden_size=5120)
TOWER_SMALL = dict(TOWER_27B, depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
                   out_hidden_size=64)


def _png(side: int) -> bytes:
    rgb = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, "PNG")
    return out.getvalue()


def _timed(fn, runs: int, device: torch.device) -> float:
    """Median seconds of fn() over `runs` after two warm-ups, synchronized on `device`."""
    times = []
    for i in range(runs + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def encoders(fields: dict, device: torch.device, dtype: torch.dtype):
    """(transformers' tower or why it is missing, ours over the same weights)."""
    config = {"model_type": "qwen3_5_vision", **fields}
    torch.manual_seed(0)
    try:
        from transformers.models.qwen3_5 import Qwen3_5VisionConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel
    except ImportError as exc:  # ours alone, on weights of transformers' init scale
        tensors = {name: torch.randn(shape, device=device, dtype=dtype) * 0.02
                   for name, shape in vision_shapes(config).items()}
        return f"transformers is not importable: {exc}", VisionEncoder(
            config, dict_params(tensors))
    theirs = Qwen3_5VisionModel._from_config(Qwen3_5VisionConfig(**fields),
                                             attn_implementation="sdpa", dtype=dtype)
    theirs = theirs.to(device).eval()
    state = dict(theirs.state_dict())
    tensors = vision_globals_from_hf(state)
    for b in range(fields["depth"]):
        tensors.update(vision_block_from_hf(state, b))
    return theirs, VisionEncoder(config, dict_params(tensors))


def encoder_section(fields, side, runs, device, dtype) -> dict:
    pre = Preprocessor()
    data = _png(side)
    preprocess_s = _timed(lambda: image_item(data, pre), max(runs // 2, 1), torch.device("cpu"))
    pixels = image_item(data, pre).pixels
    theirs, ours = encoders(fields, device, dtype)
    patches = torch.from_numpy(pre.normalize(pixels.patches)).to(device, dtype)
    grid = torch.tensor([pixels.grid], device=device)
    with torch.inference_mode():
        out = ours.encode(patches, [pixels.grid])
        ours_s = _timed(lambda: ours.encode(patches, [pixels.grid]), runs, device)
        row = {"image": f"{side}x{side}", "grid": list(pixels.grid), "tokens": out.shape[0],
               "preprocess_ms": preprocess_s * 1e3, "ours_ms": ours_s * 1e3}
        if isinstance(theirs, str):
            return {**row, "transformers": theirs}, ours
        ref = theirs(patches, grid_thw=grid).pooler_output
        hf_s = _timed(lambda: theirs(patches, grid_thw=grid), runs, device)
    return {**row, "transformers_ms": hf_s * 1e3, "speedup": hf_s / ours_s,
            "max_rel_diff": ((out.float() - ref.float()).abs().max()
                             / ref.float().abs().max()).item()}, ours


async def _first_token(engine, request) -> tuple[float, float]:
    """(seconds from submission to the first token, the request's vision seconds)."""
    start = time.perf_counter()
    first, vision = None, 0.0
    async for event in engine.submit(request):
        if event.token_ids and first is None:
            first = time.perf_counter() - start
        if event.finish is not None:
            vision = event.timings.vision_s if event.timings else 0.0
    return first, vision


def ttft_section(arch: str, encoder: VisionEncoder, side: int, runs: int,
                 device: torch.device) -> dict:
    from ninfer_engine.artifact import qwen_resources
    from ninfer_engine.artifact.synth import ARCHS, build_synthetic
    from ninfer_engine.benchmark.engine_step import bench_engine
    from ninfer_engine.models.fused import FusedParams
    from ninfer_engine.models.qwen3_5 import Qwen35Model
    from ninfer_engine.tokenizer import Tokenizer
    from ninfer_engine.types import GenerationRequest, SamplingParams
    from ninfer_engine.vision.prompt import VisionTokens
    from ninfer_engine.vision.tower import VisionTower

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config, source = build_synthetic(arch, device, dtype)
    model = Qwen35Model(config, FusedParams(config, source) if device.type == "cuda" else source)
    tokenizer = Tokenizer.from_json(qwen_resources.resources(ARCHS[arch][1])["tokenizer.json"])
    tower = VisionTower(encoder, Preprocessor(), VisionTokens.from_tokenizer(
        tokenizer.backend.token_to_id), max_tokens=16384, cache_bytes=0)
    text = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
            "Describe this image in one sentence.<|im_end|>\n<|im_start|>assistant\n")
    image = image_item(_png(side), tower.preprocessor)
    ids, media = tower.planner.prepare(tokenizer.encode(text), [image], tokenizer.encode)
    engine = bench_engine(model, arch, config, 1, len(ids) + 256, vision=tower)
    engine.start()
    rows = {}
    try:
        plain = tuple(np.random.default_rng(1).integers(0, 150_000, len(ids)).tolist())
        for name, prompt, m in (("image", ids, media), ("text_only", plain, None)):
            firsts, visions = [], []
            for i in range(runs + 1):
                request = GenerationRequest(f"{name}-{i}", tuple(prompt),
                                            SamplingParams(temperature=0.0), max_tokens=1,
                                            ignore_eos=True, media=m)
                first, vision = asyncio.run(_first_token(engine, request))
                if i:
                    firsts.append(first)
                    visions.append(vision)
            rows[name] = {"prompt_tokens": len(prompt),
                          "ttft_ms": statistics.median(firsts) * 1e3,
                          "vision_ms": statistics.median(visions) * 1e3}
    finally:
        engine.stop()
    return {"arch": arch, "graphs": engine.runner.graphs is not None, **rows}


def markdown(r: dict) -> str:
    e = r["encoder"]
    lines = [f"# Vision tower, {r['shape']} shape, one {e['image']} image ({r['device']})", "",
             f"{r['machine']}", "",
             "| | ms |", "|---|---:|",
             f"| preprocess (Pillow resize, normalize, patches; CPU) | {e['preprocess_ms']:.1f} |",
             f"| encoder, ours ({e['tokens']} tokens, grid {e['grid']}) | {e['ours_ms']:.2f} |"]
    if "transformers_ms" in e:
        lines += [f"| encoder, transformers `Qwen3_5VisionModel` (sdpa) | "
                  f"{e['transformers_ms']:.2f} |", "",
                  f"ours / transformers speed: {e['speedup']:.2f}×; max |Δ| / max |theirs| = "
                  f"{e['max_rel_diff']:.2e} ({r['dtype']})."]
    else:
        lines += ["", f"transformers not measured: {e['transformers']}."]
    if "ttft" in r:
        t = r["ttft"]
        lines += ["", f"TTFT on the served engine ({t['arch']} text model, random weights, "
                  f"CUDA graphs: {t['graphs']}), median of {r['runs']}:", "",
                  "| prompt | tokens | TTFT ms | of which vision ms |", "|---|---:|---:|---:|"]
        for name in ("image", "text_only"):
            row = t[name]
            lines.append(f"| {name} | {row['prompt_tokens']} | {row['ttft_ms']:.1f} | "
                         f"{row['vision_ms']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-ttft", action="store_true")
    parser.add_argument("--small", action="store_true", help="tiny tower and text model")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    fields, side = (TOWER_SMALL, 128) if args.small else (TOWER_27B, 1024)
    encoder, ours = encoder_section(fields, side, args.runs, device, dtype)
    machine = (torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU")
    result = {"shape": "tiny" if args.small else "Qwen3.5-27B", "device": str(device),
              "dtype": str(dtype).replace("torch.", ""), "runs": args.runs,
              "machine": f"{machine}, torch {torch.__version__}", "encoder": encoder}
    if not args.no_ttft:
        arch = "tiny-dense" if args.small else "27b"  # the tower's output width is theirs
        result["ttft"] = ttft_section(arch, ours, side, max(args.runs // 2, 3), device)
    name = "vision-encoder-small" if args.small else "h200-vision-encoder"
    write_report(args.out / name, result, markdown)


if __name__ == "__main__":
    main()
