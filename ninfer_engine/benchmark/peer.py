"""The transformers peer of `ninfer bench`: the same text config as a HF Qwen3.5 model.

`hf_config(config)` maps our §3.1 text config to `Qwen3_5TextConfig` / `Qwen3_5MoeTextConfig`
(the inverse of `hf_names.text_config_from_hf`). `random_model` builds any HF causal LM with
random weights without a CPU initialisation (`random_hf_model`: the Qwen3.5 one): parameters are
created on the meta device, materialised with `to_empty` on the target device and drawn there
(matrices N(0, 1/fan_in), embedding N(0, 0.02²), norms 0 for `(1+w)` or 1 for plain ones, the
gated GDN norm 1, `A_log = log U(1, 16)`, `dt_bias` 1); a tied head is tied again and the
rotary buffers are recomputed. `run_peer` times a prompt prefill and greedy decode steps with
the model's own cache, by CUDA events (by the host clock on the CPU), and never raises: a
missing or failing transformers becomes a `skipped` / `error` entry of the result.
"""

from __future__ import annotations

import gc
import importlib.util
import inspect
import sys
import time

import torch


def hf_classes(config: dict):
    """(config class, causal-LM class) of the HF model with `config`'s architecture."""
    if "num_experts" in config:
        from transformers.models.qwen3_5_moe import (Qwen3_5MoeForCausalLM,
                                                     Qwen3_5MoeTextConfig)

        return Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    return Qwen3_5TextConfig, Qwen3_5ForCausalLM


_COPIED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_key_head_dim",
           "linear_num_value_heads", "linear_value_head_dim", "linear_conv_kernel_dim",
           "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings")
_MOE = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
        "shared_expert_intermediate_size")


def hf_config(config: dict):
    """The HF text config of our text `config` (Qwen3.5 dense or MoE)."""
    if config.get("mlp_only_layers") or not config.get("norm_topk_prob", True):
        raise ValueError("Qwen3.5-MoE has no dense-MLP layers and always renormalises top-k")
    cls, _ = hf_classes(config)
    rope = dict(rope_type="default", rope_theta=config["rope_parameters"]["rope_theta"],
                partial_rotary_factor=config["rope_parameters"].get("partial_rotary_factor", 1.0))
    if "mrope_section" in config["rope_parameters"]:
        rope.update(mrope_section=list(config["rope_parameters"]["mrope_section"]),
                    mrope_interleaved=True)
    kw = {k: config[k] for k in _COPIED}
    kw.update({k: config[k] for k in _MOE if "num_experts" in config})
    if "num_experts" not in config:
        kw["intermediate_size"] = config["intermediate_size"]
    return cls(**kw, layer_types=list(config["layer_types"]), rope_parameters=rope)


def random_hf_model(config: dict, device, dtype=torch.bfloat16, seed: int = 0):
    """The HF causal LM of our Qwen3.5 text `config` with random weights drawn on `device`."""
    _, cls = hf_classes(config)
    return random_model(cls, hf_config(config), device, dtype, seed, norm_value=0.0)


@torch.no_grad()
def random_model(cls, hf_cfg, device, dtype=torch.bfloat16, seed: int = 0,
                 norm_value: float = 1.0):
    """HF model class `cls` of `hf_cfg` with random weights drawn on `device` (no CPU init).

    `norm_value` fills the 1-D weights: 0 for Qwen3.5's `(1+w)` norms, 1 for plain RMSNorm."""
    with torch.device("meta"):
        model = cls._from_config(hf_cfg, dtype=dtype)
    model.to_empty(device=device)
    if hf_cfg.tie_word_embeddings:  # to_empty gave the head its own (unfilled) storage
        model.lm_head.weight = model.model.embed_tokens.weight
    gen = torch.Generator(device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty(p.shape, device=device).uniform_(1.0, 16.0, generator=gen).log())
        elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
            p.fill_(1.0)
        elif p.dim() == 1:
            p.fill_(norm_value)
        elif "embed_tokens" in name:
            p.normal_(0.0, 0.02, generator=gen)
        else:
            p.normal_(0.0, p.shape[-1] ** -0.5, generator=gen)
    # non-persistent buffers (the rotary tables) came out of to_empty uninitialised
    for module in model.modules():
        buffers = dict(module.named_buffers(recurse=False))
        if buffers:
            with torch.device("cpu"):
                fresh = type(module)(config=module.config)
            for n, b in fresh.named_buffers(recurse=False):
                buffers[n].copy_(b)
    return model.eval()


def _cache_kwarg(model) -> str:
    """transformers 5.x renamed `past_key_values` to `cache` (the old name is deprecated)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@torch.no_grad()
def hf_prefill(model, ids: torch.Tensor):
    """Prefill `ids` [1, T]; (the greedy next token [1, 1], the model's cache)."""
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1].argmax(-1, keepdim=True), _cache_of(out)


@torch.no_grad()
def hf_decode(model, token: torch.Tensor, cache, steps: int) -> torch.Tensor:
    """`steps` greedy steps from `token` [1, 1] continuing `cache`; the tokens fed [1, steps]."""
    fed, key = [], _cache_kwarg(model)
    for _ in range(steps):
        fed.append(token)
        out = model(input_ids=token, use_cache=True, logits_to_keep=1, **{key: cache})
        token = out.logits[:, -1].argmax(-1, keepdim=True)
    return torch.cat(fed, 1)


def _available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class _Marks:
    """Points in a timed region and the milliseconds between them: CUDA events on the GPU
    (the device's time), the host clock on the CPU."""

    def __init__(self, device: str) -> None:
        self.cuda, self.points = device == "cuda", []

    def mark(self) -> None:
        if self.cuda:
            self.points.append(torch.cuda.Event(enable_timing=True))
            self.points[-1].record()
        else:
            self.points.append(time.perf_counter())

    def spans_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.points, self.points[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.points, self.points[1:])]


def run_peer(config: dict, prompt: int, steps: int, seed: int = 0, device: str = "cuda",
             dtype: torch.dtype = torch.bfloat16) -> dict:
    """transformers' batch-1 prefill and greedy decode of random `config` weights on `device`
    (the GPU by default) in `dtype`."""
    out = dict(library="transformers", prompt_tokens=prompt, decode_steps=steps)
    try:
        import transformers

        out["version"] = transformers.__version__
        hf_classes(config)
    except Exception as error:  # missing, or too old for Qwen3.5
        out["skipped"] = f"transformers with Qwen3.5 classes not importable: {error!r}"
        return out
    out.update(fla=_available("fla"), causal_conv1d=_available("causal_conv1d"))
    model = None
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    try:
        t0 = time.perf_counter()
        model = random_hf_model(config, device, dtype, seed)
        sync()
        out["build_s"] = time.perf_counter() - t0
        out["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        if "num_experts" in config:
            out["experts_implementation"] = getattr(model.config, "_experts_implementation",
                                                    None)
        _log(f"peer: transformers {out['version']} built in {out['build_s']:.0f} s "
             f"(fla {out['fla']}, causal_conv1d {out['causal_conv1d']})")
        gen = torch.Generator().manual_seed(seed)
        V = config["vocab_size"]
        warm = torch.randint(0, V, (1, 64), generator=gen).to(device)
        hf_decode(model, *hf_prefill(model, warm), 2)  # kernels, cuBLAS heuristics, allocator
        ids = torch.randint(0, V, (1, prompt), generator=gen).to(device)
        marks = _Marks(device)
        sync()
        marks.mark()
        token, cache = hf_prefill(model, ids)
        marks.mark()
        hf_decode(model, token, cache, steps)
        marks.mark()
        prefill_ms, decode_ms = marks.spans_ms()
        step_ms = decode_ms / steps
        out.update(prefill_ms=prefill_ms, prefill_tok_s=prompt * 1e3 / prefill_ms,
                   decode_step_ms=step_ms, decode_tok_s=1e3 / step_ms)
        _log(f"peer: prefill {out['prefill_tok_s']:.0f} tok/s, decode "
             f"{out['decode_tok_s']:.2f} tok/s")
    except Exception as error:  # e.g. out of memory: keep the rest of the bench
        out["error"] = repr(error)[:500]
        _log(f"peer failed: {out['error']}")
    finally:
        del model
        gc.collect()
        torch.cuda.empty_cache()  # a no-op where CUDA never started
    return out


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
