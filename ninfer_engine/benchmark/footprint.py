"""How a bench model's weights are served (`packed_source`), and what they will occupy on the
GPU, known before anything is drawn (`refusal`).

`ninfer bench` draws the model straight into device memory; a model that cannot fit (Flash-Next
in bf16: ~160 GB against the H200's ~140 free) would only fail after minutes of drawing, so
`refusal` compares the planned bytes with the free memory first and words the alternatives.

Planned bytes are those of the forms `packed_source` serves (a pure function of the config,
the recipe and `--cuda-weights`): bf16 2 bytes a weight (a_log / dt_bias fp32), packed
projections as stored (`packed`) or as `packed.serving_form` keeps them (`auto`: fp8-row as
stored, Q4/Q5 as fp8 groups, the rest bf16), routed experts per `experts.expert_form`.
"""

from __future__ import annotations

from ..codecs.encodings import encoded_size
from ..artifact.recipes import recipe
from ..artifact.synth import parameter_shapes, synth_config
from ..models.experts import BF16_SHARE, expert_form, is_routed_expert, serve_expert
from ..models.packed import (DENSE, FP8_GROUPS, FP8_ROW, PACKED_FORMATS, REPACK_FP8,
                             is_projection, quantize_packed, serving_form)

# beside the weights: KV pools and decoder state, prefill activations, an fp8 layer's bf16
# expert scratch (Flash-Next: 1.6 GB of gate|up), CUDA graphs
RESERVE = 8 << 30


def packed_source(source, recipe_name: str, mode: str = "auto", experts_bf16: bool = True):
    """`source` with every projection that recipe `recipe_name` stores packed encoded so and
    served as the engine's `--cuda-weights mode` serves it ("auto" or "packed"); routed experts
    as `experts.expert_form` says (`experts_bf16`: whether the bf16-expert model fits)."""
    if recipe_name == "bf16":
        return source
    choose = recipe(recipe_name)

    def params(name, shape):
        w = source(name, shape)
        fmt = choose(name, shape)
        if fmt not in PACKED_FORMATS:
            return w
        if is_routed_expert(name):
            if expert_form(fmt, shape[1], mode, experts_bf16) == DENSE:
                return w  # served bf16: the draw itself (the same bytes and speed)
            return serve_expert(quantize_packed(w, fmt), mode, experts_bf16)
        if is_projection(name):
            packed = quantize_packed(w, fmt)  # the bf16 draw is freed on return
            return packed if mode == "packed" else serving_form(packed, w.dtype)
        return w

    return params


def _served(name: str, shape: tuple[int, ...], fmt: str, mode: str, experts_bf16: bool) -> int:
    n = 1
    for d in shape:
        n *= d
    if len(shape) != 2 or fmt not in PACKED_FORMATS:
        return n * (4 if name.endswith(("a_log", "dt_bias")) else 2)
    if is_routed_expert(name):
        form = expert_form(fmt, shape[1], mode, experts_bf16)
    elif not is_projection(name):
        form = DENSE
    elif mode == "packed":
        form = fmt
    elif fmt in REPACK_FP8 and shape[1] % 128 == 0:
        form = FP8_GROUPS
    else:
        form = fmt if fmt == FP8_ROW else DENSE
    if form == DENSE:
        return 2 * n
    if form == FP8_GROUPS:
        return n + 2 * (n // 64)  # e4m3 codes + fp16 scales of 64-column groups
    return encoded_size(form, shape)


def layer_bytes(config: dict, recipe_name: str, mode: str) -> dict[str, list[int]]:
    """Bytes of the non-layer parameters (index 0) then of each layer, three ways: `bf16`, and
    as served with routed experts bf16 (`fits`) or not (`tight`)."""
    choose = recipe(recipe_name)
    out = {k: [0] * (config["num_hidden_layers"] + 1) for k in ("bf16", "fits", "tight")}
    for name, shape in parameter_shapes(config).items():
        times = 1
        if is_routed_expert(name):  # recipes choose by layer and member, never by expert
            if "/experts/0/" not in name:
                continue
            times = config["num_experts"]
        at = int(name.split("/")[2]) + 1 if name.startswith("text/layers/") else 0
        fmt = choose(name, shape)
        out["bf16"][at] += times * _served(name, shape, "bf16", mode, True)
        out["fits"][at] += times * _served(name, shape, fmt, mode, True)
        out["tight"][at] += times * _served(name, shape, fmt, mode, False)
    return out


def planned_bytes(per_layer: dict[str, list[int]], layers: int, free: int) -> int:
    """Bytes of the first `layers` layers' model, experts in the form `auto` picks at `free`."""
    bf16 = sum(per_layer["bf16"][: layers + 1])
    return sum(per_layer["fits" if bf16 <= BF16_SHARE * free else "tight"][: layers + 1])


def refusal(arch: str, layers: int | None, recipe_name: str, mode: str, free: int) -> str | None:
    """None when the model fits `free` bytes (with `RESERVE` to spare), else one line saying
    what it needs and what would fit."""
    full = synth_config(arch)["num_hidden_layers"]
    layers = layers or full
    per_layer = layer_bytes(synth_config(arch), recipe_name, mode)
    need = planned_bytes(per_layer, layers, free)
    if need + RESERVE <= free:
        return None
    fit = max((n for n in range(1, layers) if planned_bytes(per_layer, n, free) + RESERVE
               <= free), default=0)
    options = []
    if recipe_name != "fp8-row":
        fp8 = planned_bytes(layer_bytes(synth_config(arch), "fp8-row", mode), layers, free)
        if fp8 + RESERVE <= free:
            options.append(f"--weights fp8-row (~{fp8 / 1e9:.0f} GB)")
    if fit:
        options.append(f"--layers {fit} or fewer")
    weights = f"--weights {recipe_name}" + (f" --cuda-weights {mode}" if recipe_name != "bf16"
                                            else "")
    return (f"{arch} ({layers} layers) with {weights} needs ~{need / 1e9:.0f} GB of weights on "
            f"the GPU, {free / 1e9:.0f} GB free ({RESERVE >> 30} GiB kept for KV, activations "
            "and graphs)" + (": try " + " or ".join(options) if options else ""))
