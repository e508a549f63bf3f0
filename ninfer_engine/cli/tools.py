"""The ``ninfer`` command: artifact conversion and inspection, and the GPU decode benchmark.

Every ArtifactError (and OS error) becomes one line ``ninfer: error: <msg>`` and exit 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..artifact.errors import ArtifactError
from .tools_bench import BENCH_ARCHS, BENCH_RECIPES, _bench, _contexts, _levels, _rates
from .tools_convert import _convert_gguf, _convert_hf, _sampling, _synth, _synth_archs
from .tools_inspect import _inspect


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
                    help="add a z-lab DFlash or DFlash2 drafter checkpoint as the dflash or "
                         "dflash2 component (for --spec dflash, dflash2)")
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
    synth.add_argument("--dflash2", choices=("small", "real"),
                       help="add a random DFlash2 drafter (the dflash2 component, for --spec "
                            "dflash2): small, sized from the target, or real, the published "
                            "27B drafter's shape")
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
    bench.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                       help="prefill chunk, as the engine's --prefill-chunk (default: its auto "
                            "value, 8192 on a device of >= 70 GiB, 4096 below)")
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
    bench.add_argument("--lm-head-draft", type=int, default=0, metavar="ROWS",
                       help="with --spec-drafter mtp: the drafts' argmax over a proposal of the "
                       "head's first ROWS rows, as the server's --lm-head-draft (default 0: "
                       "the whole head)")
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


if __name__ == "__main__":
    sys.exit(main())
