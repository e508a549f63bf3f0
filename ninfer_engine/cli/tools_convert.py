"""`ninfer convert gguf|hf` and `ninfer synth`: the commands that write an artifact."""

from __future__ import annotations

import argparse
import sys
import time

from ..artifact.container import open_artifact
from ..artifact.errors import ArtifactError

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
                    dflash=args.dflash, device=args.device, dflash2=args.dflash2)
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
