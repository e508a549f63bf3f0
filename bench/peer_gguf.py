"""The peers' random-weight GGUF writer (`../shared/peers/llamacpp/make_gguf.py`) with one more
shape: `flash-next`, the Qwen3-Next-80B-A3B class that `ninfer synth --arch flash-next` builds
(H 2048, 48 layers of 3 GDN : 1 attention, 16 q / 2 kv heads, GDN 16 k / 32 v heads, 512
experts top-10 of width 512, a shared expert of width 512, vocabulary 151,936), written as
llama.cpp's `qwen35moe` architecture, whose layers are the same computation at these sizes.

    python3 bench/peer_gguf.py --arch qwen35moe --shape flash-next --type q8_0 --layers 16 \\
        -o /dev/shm/llama-flash-next-16-q8_0.gguf

Every other argument and shape is the writer's own (`--peers DIR`: where `make_gguf.py` is,
default `.peers/llamacpp`, the copy the device calls carry)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

FLASH_NEXT = dict(n_embd=2048, n_layer=48, n_head=16, n_head_kv=2, ssm_k_heads=16,
                  ssm_v_heads=32, n_expert=512, n_expert_used=10, n_ff_exp=512,
                  n_ff_shexp=512, n_vocab=151936)


def main() -> None:
    argv = sys.argv[1:]
    peers = Path(".peers/llamacpp")
    if "--peers" in argv:
        at = argv.index("--peers")
        peers = Path(argv[at + 1])
        del argv[at: at + 2]
    spec = importlib.util.spec_from_file_location("make_gguf", peers / "make_gguf.py")
    writer = importlib.util.module_from_spec(spec)
    sys.modules["make_gguf"] = writer  # its dataclasses look their module up
    spec.loader.exec_module(writer)
    writer.SHAPES[("qwen35moe", "flash-next")] = FLASH_NEXT
    shapes = sorted({shape for _, shape in writer.SHAPES})
    _widen_shape_choices(writer, shapes)
    sys.argv = [str(peers / "make_gguf.py"), *argv]
    writer.main()


def _widen_shape_choices(writer, shapes: list[str]) -> None:
    """`make_gguf.main` lists its shapes in `--shape`'s choices: let it parse ours too."""
    add = writer.argparse.ArgumentParser.add_argument

    def add_argument(self, *names, **kwargs):
        if "--shape" in names:
            kwargs["choices"] = shapes
        return add(self, *names, **kwargs)
    writer.argparse.ArgumentParser.add_argument = add_argument


if __name__ == "__main__":
    main()
