"""The model families the step serves, chosen in one place.

A family is its model class (built by `models.build_model` from the artifact's architecture),
its runner (how a step's rows become one forward: `family_runners.Runner` for the llama
family, `family_runners.HybridRunner` for the Qwen3.5 hybrids), its static decode step for
the CUDA-graph path (`models.llama_step.StaticDecoder`,
`models.qwen3_5_engine_step.EngineHybridDecoder`) and its short-prompt step beside it
(`models.llama_prompt_step.LlamaPrompt`, `models.qwen3_5_engine_step.EngineHybridPrompt`).
On the CPU the llama family's decode rows go through its compiled step instead
(`models.llama_cpu_step.CpuDecoder`, no capture). `make_runner` and `build_decode_graphs`
look the family up here instead of checking types.
"""
from __future__ import annotations

from collections.abc import Callable
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..kv import SequenceMemory
from ..models import LlamaModel, Qwen35Model
from ..models.fused import FusedParams
from ..models.llama_cpu_step import cpu_decoder
from ..models.llama_prompt_step import LlamaPrompt
from ..models.llama_step import StaticDecoder
from ..models.qwen3_5_engine_step import EngineHybridDecoder, EngineHybridPrompt
from ..models.qwen3_5_prompt_step import prompt_capturable
from .decode_graphs import GRAPH_CODECS, PROMPT_ROWS, DecodeGraphs
from .family_runners import HybridRunner, Runner
from .graph_capture import start_up_capture

# (model, memory, max_batch, max_context, max_q, keep_hidden) -> the family's static step, or
# None where the model's weights are in a form it does not serve (or hiddens are asked of a
# step that keeps none)
StaticStep = Callable[[Any, SequenceMemory, int, int, int, bool], Any]
# (model, memory, max_batch, max_context, max_q, weights, activations) -> the family's CPU
# decode step, or why none
CpuStep = Callable[[Any, SequenceMemory, int, int, int, Any, str], Any]
# (model, memory, its static step, max_context) -> the family's short-prompt step over the
# static step's weights (`DecodeGraphs.prefill`), or None where the eager forward keeps them
PromptStep = Callable[[Any, SequenceMemory, Any, int], Any]

log = logging.getLogger("ninfer.engine")


@dataclass(frozen=True)
class Family:
    name: str
    runner: type[Runner] | type[HybridRunner]
    static_step: StaticStep
    prompt_step: PromptStep
    cpu_step: CpuStep | None = None


def _llama_step(model, memory, max_batch, max_context, max_q, keep_hidden):
    if keep_hidden:
        return None
    return StaticDecoder(model, memory.storage, max_batch, max_context, max_q)


def _hybrid_step(model, memory, max_batch, max_context, max_q, keep_hidden):
    if not isinstance(model.params, FusedParams):
        return None  # the fused GEMV groups are built from `FusedParams`
    if "tp_local_experts" in model.config:
        return None  # its MoE kernels read experts by global id: a rank's share by id is eager
    return EngineHybridDecoder(model, memory.storage, memory.running_slots, max_batch,
                               max_context, max_q, keep_hidden)


def _llama_prompt(model, memory, decoder, max_context):
    if model.ranks.parallel:
        return None  # (as the hybrid family's: a rank's collectives stay in the eager forward)
    return LlamaPrompt(model, memory.storage, decoder.max_batch, max_context, PROMPT_ROWS[-1])


def _hybrid_prompt(model, memory, decoder, max_context):
    if not prompt_capturable(model):
        return None  # a layer syncs with the host (offloaded experts), or tensor parallelism
    return EngineHybridPrompt(decoder.core.w, memory.storage, memory.running_slots,
                              decoder.max_batch, max_context, PROMPT_ROWS[-1],
                              decoder.hidden is not None)


def _llama_cpu_step(model, memory, max_batch, max_context, max_q, weights, activations):
    return cpu_decoder(model, memory.storage, max_batch, max_context, weights, activations,
                       max_q)


FAMILIES = {LlamaModel: Family("llama", Runner, _llama_step, _llama_prompt, _llama_cpu_step),
            Qwen35Model: Family("qwen3.5", HybridRunner, _hybrid_step, _hybrid_prompt)}


def family_of(model) -> Family:
    return FAMILIES[type(model)]


def make_runner(model, graphs: DecodeGraphs | None = None,
                hidden_sink=None, vision=None) -> Runner | HybridRunner:
    """The family's runner; `hidden_sink` (hybrid family) receives each row's hiddens;
    `vision` (hybrid family): the `VisionTower` that fills media rows and their positions."""
    return family_of(model).runner(model, graphs, hidden_sink, vision)


def build_decode_graphs(model, memory: SequenceMemory, kv_dtype: str, max_batch: int,
                        max_context: int, use_graphs: bool,
                        max_q: int = 1, keep_hidden: bool = False,
                        weights: Any = None,
                        cpu_activations: str = "fp32") -> DecodeGraphs | None:
    """The static decode path over `memory`'s KV pool and running-state slots when the model,
    device and KV layout allow it, else None; `max_q`: the most tokens a row carries (1 + the
    speculative drafts: each family's step verifies rows; the CPU step takes a verify row as
    consecutive rows);
    `keep_hidden`: the step also keeps each token row's final-normed hidden (`--spec mtp`
    drafts from them); `weights`: the artifact, where the CPU step reads its stored weights
    (None: no CPU step, `--cpu-step eager`);
    `cpu_activations`: the CPU step's GEMV inputs, fp32|int16|int8 (`--cpu-activations`)."""
    storage = memory.storage
    if model.device.type == "cpu":
        return cpu_decode_steps(model, memory, max_batch, max_context, keep_hidden, weights,
                                cpu_activations, max_q)
    if kv_dtype not in GRAPH_CODECS or not storage.kernel_layout:
        return None
    if model.device.type != "cuda" or model.dtype != torch.bfloat16:
        return None  # the kernels compute in bf16
    _, _, D = model.kv_layout()
    if D & (D - 1) or D < 16:
        return None  # the attention kernel tiles whole power-of-two heads
    decoder = family_of(model).static_step(model, memory, max_batch, max_context, max_q,
                                           keep_hidden)
    if decoder is None:
        return None
    # offloaded experts read in place need no host sync (`experts.in_place`); copied or
    # CPU-computed misses sync at each MoE layer (`experts.tier`): that step runs uncaptured
    tiers = getattr(model, "expert_tiers", None)
    use_graphs = use_graphs and (tiers is None or tiers.capturable)
    prompt = prompt_step(model, memory, decoder, max_context) if use_graphs else None
    graphs = DecodeGraphs(decoder, capture=use_graphs, prompt=prompt)
    if use_graphs:  # the prompt step's dequantized matrices count too
        with start_up_capture("decode" + (" and prompt steps" if prompt is not None else ""),
                              model.device):
            graphs.capture_at_start()
    return graphs


def prompt_step(model, memory: SequenceMemory, decoder, max_context: int):
    """The family's short-prompt step over the decoder's weights (`DecodeGraphs.prefill`), or
    None: a model whose layers sync with the host (offloaded experts, a rank's share of them)
    or run under tensor parallelism keeps the eager forward."""
    return family_of(model).prompt_step(model, memory, decoder, max_context)


def cpu_decode_steps(model, memory: SequenceMemory, max_batch: int, max_context: int,
                     keep_hidden: bool, weights: Any,
                     activations: str = "fp32", max_q: int = 1) -> DecodeGraphs | None:
    """The family's compiled CPU decode step, driven like the graphs without capture; None
    (the eager step, with the reason logged) where it cannot serve this model here."""
    cpu_step = family_of(model).cpu_step
    if weights is None or keep_hidden or cpu_step is None:
        return None
    started = time.monotonic()
    decoder = cpu_step(model, memory, max_batch, max_context, max_q, weights, activations)
    if isinstance(decoder, str):
        log.info("CPU decode: the eager step (%s)", decoder)
        return None
    log.info("CPU decode: the compiled step (stored Q8 weights, %s activations, one call a "
             "step), ready in %.2f s", activations,
             time.monotonic() - started)
    return DecodeGraphs(decoder, capture=False)
