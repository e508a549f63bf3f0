"""The ``ninfer`` command: artifact conversion and inspection, and the GPU decode benchmark.

Every ArtifactError (and OS error) becomes one line ``ninfer: error: <msg>`` and exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence

from ..artifact import verify
from ..artifact.container import Artifact, open_artifact
from ..artifact.directory import TensorObject
from ..artifact.errors import ArtifactError

BENCH_ARCHS = ("27b", "35b-a3b", "flash-next", "0.8b", "tiny-dense", "tiny-moe")
# the storage recipes of `convert` that a random model can be drawn in (fp32 is the CPU's)
BENCH_RECIPES = ("bf16", "fp8-row", "nvfp4", "q8", "qwen3_6_27b", "qwen3_8_27b",
                 "qwen3_6_35b_a3b")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ArtifactError, OSError) as error:
        print(f"ninfer: error: {error}", file=sys.stderr)
        return 1


class _Parser(argparse.ArgumentParser):
    """Wrong flags: one line and exit 1, as `ninfer-serve` (argparse printed its usage and
    exited 2). Its subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(1, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ninfer", description="Convert and inspect .ninfer artifacts.")
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser("convert", help="convert a model into a .ninfer artifact")
    sources = convert.add_subparsers(dest="source", required=True)
    gguf = sources.add_parser("gguf", help="from a llama-architecture GGUF file")
    gguf.add_argument("src", metavar="SRC.gguf")
    gguf.add_argument("-o", "--output", required=True, metavar="OUT.ninfer")
    gguf.add_argument("--name", help="metadata.name, the model id the server advertises")
    gguf.add_argument("--generation", "--sampling", dest="sampling", type=_sampling, default={},
                      metavar="KEY=V,…",
                      help="generation_config.json, the server's defaults for requests that "
                           "leave them out: sampler keys (temperature, top_p, top_k, min_p, "
                           "presence_penalty, frequency_penalty) and max_new_tokens (the "
                           "default output limit), e.g. temperature=0.2,top_p=0.9,"
                           "max_new_tokens=256")
    gguf.set_defaults(run=_convert_gguf)
    hf = sources.add_parser("hf", help="from a Hugging Face safetensors directory")
    hf.add_argument("src", metavar="SRC_DIR")
    hf.add_argument("-o", "--output", required=True, metavar="OUT.ninfer")
    hf.add_argument("--recipe", default="bf16", help="storage formats (default bf16)")
    hf.add_argument("--name", help="metadata.name (default: the directory name)")
    hf.add_argument("--skip-vision", action="store_true",
                    help="drop the vision tower (and its preprocessor configs)")
    hf.add_argument("--dflash", metavar="DRAFTER_DIR",
                    help="add a z-lab DFlash drafter checkpoint as the dflash component "
                         "(for --spec dflash)")
    hf.set_defaults(run=_convert_hf)

    inspect = commands.add_parser("inspect", help="summarize an artifact")
    inspect.add_argument("file", metavar="FILE")
    inspect.add_argument("--json", action="store_true", help="print the summary as JSON")
    inspect.add_argument("--verify", action="store_true",
                         help="also hash the payload and check it against the recorded "
                              "metadata.payload_sha256 (exit 1 on a mismatch); a file without "
                              "one is checked against the published SHA-256 of the official "
                              "upstream files, else reported as having no digest")
    inspect.set_defaults(run=_inspect)

    synth = commands.add_parser("synth", help="build a random-weight artifact at real shapes")
    synth.add_argument("--arch", required=True, help="one of: " + ", ".join(_synth_archs()))
    synth.add_argument("-o", "--output", required=True, metavar="OUT.ninfer")
    synth.add_argument("--layers", type=int, help="keep only the first N layers")
    synth.add_argument("--recipe", default="bf16", help="storage formats (default bf16)")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synth.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                       help="where weights are drawn and encoded: cpu (default) or cuda, much "
                            "faster; each device's generator gives its own weights")
    synth.add_argument("--name", help="metadata.name (default synth-ARCH)")
    synth.add_argument("--mtp", action="store_true",
                       help="add a random MTP head (the mtp component, for --spec mtp)")
    synth.add_argument("--dflash", choices=("small", "real"),
                       help="add a random DFlash drafter (the dflash component, for --spec "
                            "dflash): small, sized from the target, or real, the published "
                            "35B-A3B drafter's shape")
    synth.set_defaults(run=_synth)

    bench = commands.add_parser(
        "bench", help="the serving engine's decode, aggregate decode, speculative verify and "
                      "prefill tok/s on a random-weight model on the GPU, beside their "
                      "rooflines, with transformers as the peer")
    bench.add_argument("--arch", required=True, choices=BENCH_ARCHS)
    bench.add_argument("--layers", type=int, help="keep only the first N layers")
    bench.add_argument("--context", type=_contexts, default=[1024, 8192, 32768],
                       help="comma-separated batch-1 decode contexts (default 1024,8192,32768)")
    bench.add_argument("--weights", choices=BENCH_RECIPES, default="bf16", metavar="RECIPE",
                       help="storage recipe of the projections, as `convert --recipe` "
                            f"({', '.join(BENCH_RECIPES)}; default bf16); packed formats run "
                            "the fused dequant GEMVs; routed experts stored fp8-row are served "
                            "fp8, Q4/Q5 ones as fp8 groups under --cuda-weights packed or when "
                            "bf16 would not fit, others bf16")
    bench.add_argument("--cuda-weights", choices=("auto", "packed"), default="auto",
                       help="serve the packed projections as the engine's --cuda-weights does "
                            "(auto: Q4/Q5 repacked into fp8 groups, fp8-row as stored, others "
                            "bf16; packed: every packed format as stored)")
    bench.add_argument("--concurrency", type=_levels, default=[1, 2, 4, 8],
                       help="comma-separated batch sizes for aggregate decode (default 1,2,4,8; "
                            "'none' skips)")
    bench.add_argument("--concurrency-context", type=int, default=1024, metavar="N",
                       help="context of every sequence in the aggregate decode (default 1024)")
    bench.add_argument("--prefill", type=int, default=8192, metavar="TOKENS",
                       help="prompt length of the timed prefill (default 8192; 0 skips)")
    bench.add_argument("--prefill-chunk", type=int, default=4096, metavar="N",
                       help="prefill chunk, as the engine's --prefill-chunk (default 4096, its "
                            "auto value on CUDA)")
    bench.add_argument("--draft-tokens", type=int, default=3, metavar="K",
                       help="drafts a verify row carries in the speculative section (default 3)")
    bench.add_argument("--spec-rates", type=_rates, default=[3.67, 2.4], metavar="R,R",
                       help="tokens a round the oracle drafter is set to (default 3.67,2.4: the "
                       "reference's MTP3 operating point and story text); none skips the section")
    bench.add_argument("--spec-batch", type=_levels, default=[1, 8], metavar="B,B",
                       help="concurrency levels (of --concurrency) that also run speculatively")
    bench.add_argument("--spec-drafter", choices=("oracle", "mtp"), default="oracle",
                       help="the speculative section's drafts: random ids (oracle, no drafting "
                       "cost) or a random MTP head's, drafting as --spec mtp does; either way "
                       "the tokens a round are --spec-rates'")
    bench.add_argument("--peer", choices=("transformers", "none"), default="transformers",
                       help="time the same shapes through transformers too (default)")
    bench.add_argument("--no-peer", dest="peer", action="store_const", const="none",
                       help="same as --peer none")
    bench.add_argument("--peer-prompt", type=int, default=1024, metavar="N",
                       help="prompt tokens of the peer before its decode steps (default 1024)")
    bench.add_argument("--peer-steps", type=int, default=16, metavar="N",
                       help="timed greedy decode steps of the peer (default 16)")
    bench.add_argument("--no-pdl", action="store_true",
                       help="launch the decode kernels without programmatic dependent launch "
                            "(kernels/pdl.py), to measure what it saves")
    bench.add_argument("--sampling", choices=("greedy", "served"), default="greedy",
                       help="how the decode and concurrency requests sample: greedy (default), "
                            "or as a served request sending only temperature 0 (the model "
                            "preset's penalties: presence_penalty 1.5 on the Qwen3.5 shapes)")
    bench.add_argument("--out", metavar="FILE.json", help="also write the result as JSON")
    bench.add_argument("--markdown", metavar="FILE.md", help="also write the report as markdown")
    bench.set_defaults(run=_bench)
    return parser


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

    if min(args.prefill, args.concurrency_context) < 0 \
            or min(args.prefill_chunk, args.peer_steps, args.peer_prompt, args.draft_tokens) < 1:
        return _fail("negative lengths, or fewer than 1 chunk/step/prompt/draft token")
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
                  f" --spec-drafter {args.spec_drafter}" if args.spec_rates
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
        spec_drafter=args.spec_drafter)
    save(result)
    print(markdown(result), end="")
    return 0


# generation_config.json keys `convert gguf --generation` takes: (type, low, high); the
# bounds of the matching `ninfer-serve` flags, but top_k as the sampler takes it (cards say 40)
_SAMPLING_KEYS = {
    "temperature": (float, 0.0, 2.0), "top_p": (float, 0.0, 1.0), "top_k": (int, 0, None),
    "min_p": (float, 0.0, 1.0), "presence_penalty": (float, -2.0, 2.0),
    "frequency_penalty": (float, -2.0, 2.0), "max_new_tokens": (int, 1, None),
}


def _sampling(text: str) -> dict[str, float | int]:
    """`temperature=0.2,top_p=0.9` -> {"temperature": 0.2, "top_p": 0.9}."""
    preset: dict[str, float | int] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in _SAMPLING_KEYS:
            raise argparse.ArgumentTypeError(f"unknown generation key {key!r}")
        kind, low, high = _SAMPLING_KEYS[key]
        try:
            number = kind(value)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{key}: not {what}: {value!r}") from None
        if not low <= number <= (high if high is not None else number):  # NaN fails too
            raise argparse.ArgumentTypeError(
                f"{key}: {value} is out of range {low}..{high if high is not None else 'inf'}")
        preset[key] = number
    return preset


def _convert_gguf(args: argparse.Namespace) -> int:
    from ..artifact.convert_gguf import convert_gguf  # needs the gguf package, only here

    started = time.monotonic()
    convert_gguf(args.src, args.output, name=args.name, progress=_Progress(),
                 sampling=args.sampling)
    with open_artifact(args.output) as artifact:
        size = artifact.path.stat().st_size
        print(
            f"wrote {artifact.path} ({size:,} bytes, name {artifact.name})"
            f" in {time.monotonic() - started:.1f} s",
            file=sys.stderr,
        )
    return 0


def _convert_hf(args: argparse.Namespace) -> int:
    from ..artifact.convert_hf import convert_hf  # needs safetensors, only here

    started = time.monotonic()
    convert_hf(args.src, args.output, recipe=args.recipe, name=args.name,
               skip_vision=args.skip_vision, progress=_Progress(), dflash=args.dflash)
    _report_written(args.output, started)
    return 0


def _synth_archs() -> list[str]:
    from ..artifact.synth import ARCHS

    return sorted(ARCHS)


def _synth(args: argparse.Namespace) -> int:
    from ..artifact.synth import write_synthetic

    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ArtifactError("synth --device cuda: no CUDA device is available")
    started = time.monotonic()
    write_synthetic(args.arch, args.output, layers=args.layers, recipe=args.recipe,
                    seed=args.seed, name=args.name, progress=_Progress(), mtp=args.mtp,
                    dflash=args.dflash, device=args.device)
    _report_written(args.output, started)
    return 0


def _report_written(path: str, started: float) -> None:
    with open_artifact(path) as artifact:
        size = sum(f.payload_bytes for f in artifact.files)
        print(f"wrote {artifact.path} ({size:,} payload bytes, name {artifact.name})"
              f" in {time.monotonic() - started:.1f} s", file=sys.stderr)


class _Progress:
    """Progress on stderr: a live line on a terminal, one line per 10% otherwise."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._shown = -1

    def __call__(self, done: int, total: int, what: str) -> None:
        percent = 100 * done // total
        if self._tty:
            end = "\n" if done == total else ""
            print(
                f"\r[{percent:3d}%] {done}/{total} {what:<40}", end=end, file=sys.stderr, flush=True
            )
        elif percent // 10 > self._shown:
            self._shown = percent // 10
            print(f"[{percent:3d}%] {done}/{total} {what}", file=sys.stderr, flush=True)


def summary(artifact: Artifact) -> dict:
    """What ``ninfer inspect`` reports, as plain JSON-able data."""
    tensors = [o for o in artifact.objects.values() if isinstance(o, TensorObject)]
    resources = [o for o in artifact.objects.values() if not isinstance(o, TensorObject)]
    formats: dict[str, dict[str, int]] = {}
    for obj in tensors:
        entry = formats.setdefault(obj.format, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += obj.bytes
    whole = [
        parts[0].object
        for parts in artifact.bindings.values()
        if len(parts) == 1
        and parts[0].begin == 0
        and parts[0].end == artifact.objects[parts[0].object].numel
    ]
    return {
        "path": str(artifact.path),
        "version": artifact.version,
        "artifact_id": artifact.artifact_id,
        "name": artifact.name,
        "files": [{"path": f.path, "payload_bytes": f.payload_bytes} for f in artifact.files],
        "components": {
            name: {
                "config": c["config"],
                "resources": sorted(c.get("resources", {})),
                **({"target": c["target"]} if "target" in c else {}),
            }
            for name, c in artifact.components.items()
        },
        "objects": {
            "tensors": len(tensors),
            "resources": {"count": len(resources), "bytes": sum(o.bytes for o in resources)},
            "formats": dict(sorted(formats.items())),
        },
        "bindings": {
            "count": len(artifact.bindings),
            "whole_object": len(whole),
            "parts": len(artifact.bindings) - len(whole),
            "sharing_an_object": sum(n for n in Counter(whole).values() if n > 1),
            "by_component": dict(Counter(name.split("/", 1)[0] for name in artifact.bindings)),
        },
        "uses": len(artifact.uses),
    }


def verification(artifact: Artifact) -> dict:
    """What ``ninfer inspect --verify`` checked: ``{"status", "sha256", "line"}``, status one of
    ``payload_sha256`` (the recorded digest matches), ``published_sha256`` (no digest, but the
    whole file matches an official upstream file) or ``none``; a mismatch raises ArtifactError."""
    digest = verify.check_payload(artifact)
    if digest is not None:
        return {"status": "payload_sha256", "sha256": digest,
                "line": f"payload digest verified: SHA-256 {digest} "
                        f"(metadata.{verify.DIGEST_KEY})"}
    official = verify.published_entry(artifact)
    if official is None:
        return {"status": "none", "sha256": None,
                "line": f"no digest recorded (no metadata.{verify.DIGEST_KEY}); "
                        "only the structure was checked"}
    whole = verify.file_sha256(artifact.path)
    if whole != official.sha256:
        raise ArtifactError(
            f"no digest recorded, and the whole-file SHA-256 {whole[:16]}… does not match the "
            f"published {official.sha256[:16]}… of {official.name} ({official.size:,} bytes): "
            "the file is corrupt or modified", artifact.path)
    return {"status": "published_sha256", "sha256": whole,
            "line": f"no digest recorded; whole-file SHA-256 {whole} matches the published "
                    f"{official.name}"}


def _inspect(args: argparse.Namespace) -> int:
    with open_artifact(args.file) as artifact:
        checked = verification(artifact) if args.verify else None
        info = summary(artifact)
    if args.json:
        if checked is not None:
            info["verification"] = {k: checked[k] for k in ("status", "sha256")}
        print(json.dumps(info, indent=2))
        return 0
    payload = sum(f["payload_bytes"] for f in info["files"])
    print(f"{info['path']}: .ninfer v{info['version']}, artifact_id {info['artifact_id']}")
    print(f"name: {info['name']}")
    print(f"files: {len(info['files'])}, payload {payload:,} bytes")
    for name, component in info["components"].items():
        config = component["config"]
        target = f" -> {component['target']}" if "target" in component else ""
        print(
            f"component {name}{target}: {', '.join(config.get('architectures', []))}"
            f" ({config.get('model_type', '?')})"
        )
        print(f"  resources: {', '.join(component['resources']) or '-'}")
        print(f"  config: {json.dumps(config, sort_keys=True)}")
    objects = info["objects"]
    print(
        f"objects: {objects['tensors']} tensors, {objects['resources']['count']} resources "
        f"({objects['resources']['bytes']:,} bytes)"
    )
    for fmt, entry in objects["formats"].items():
        print(f"  {fmt:<22} {entry['count']:6d} tensors {entry['bytes']:>16,} bytes")
    b = info["bindings"]
    print(
        f"bindings: {b['count']} ({b['whole_object']} whole objects, {b['parts']} part ranges, "
        f"{b['sharing_an_object']} sharing an object); by component: "
        + ", ".join(f"{k} {v}" for k, v in b["by_component"].items())
    )
    print(f"uses: {info['uses']}")
    if checked is not None:
        print(checked["line"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
