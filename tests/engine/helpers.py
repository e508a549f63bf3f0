"""Test fixtures: tiny random HF models as weight sources, a byte tokenizer, a fake artifact."""
from __future__ import annotations

import functools
import inspect
import json
import os
import subprocess
import sys
import warnings
from contextlib import contextmanager

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from ninfer_engine.codecs.kv import as_bits

# our binding suffix -> HF module path (per layer)
_LAYER_NAMES = {
    "input_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "attention/query": "self_attn.q_proj",
    "attention/key": "self_attn.k_proj",
    "attention/value": "self_attn.v_proj",
    "attention/output": "self_attn.o_proj",
    "attention/query_norm": "self_attn.q_norm",
    "attention/key_norm": "self_attn.k_norm",
    "mlp/gate": "mlp.gate_proj",
    "mlp/up": "mlp.up_proj",
    "mlp/down": "mlp.down_proj",
}


def seeded_prompt(n: int, seed: int) -> tuple[int, ...]:
    """`n` token ids below 128 (a tiny model's vocabulary), the same for the same `seed`."""
    return tuple(torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(seed))
                 .tolist())


def hf_name(name: str) -> str:
    """Our `text/...` parameter name -> the HF `LlamaForCausalLM` state-dict key."""
    rest = name.removeprefix("text/")
    if rest == "token_embedding":
        return "model.embed_tokens.weight"
    if rest == "output_head":
        return "lm_head.weight"
    if rest == "final_norm":
        return "model.norm.weight"
    _, index, suffix = rest.split("/", 2)
    return f"model.layers.{index}.{_LAYER_NAMES[suffix]}.weight"


def our_names(num_layers: int, qk_norm: bool = False) -> list[str]:
    names = ["text/token_embedding", "text/output_head", "text/final_norm"]
    for i in range(num_layers):
        for suffix in _LAYER_NAMES:
            if qk_norm or suffix not in ("attention/query_norm", "attention/key_norm"):
                names.append(f"text/layers/{i}/{suffix}")
    return names


class DictWeights:
    """A weight source over a dict of our parameter names -> tensors."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    @classmethod
    def from_hf(cls, model: torch.nn.Module) -> DictWeights:
        state = model.state_dict()
        cfg = model.config
        qk_norm = "model.layers.0.self_attn.q_norm.weight" in state
        tensors = {}
        for name in our_names(cfg.num_hidden_layers, qk_norm):
            key = hf_name(name)
            if key == "lm_head.weight" and key not in state:
                key = "model.embed_tokens.weight"
            tensors[name] = state[key].detach().clone()
        return cls(tensors)

    def has_parameter(self, name: str) -> bool:
        return name in self.tensors

    def parameter(self, name, shape, dtype=torch.float32) -> torch.Tensor:
        tensor = self.tensors[name]
        assert tuple(tensor.shape) == tuple(shape), (name, tensor.shape, shape)
        return tensor.to(dtype)


def hf_state_dict(artifact, num_layers: int, qk_norm: bool = False) -> dict[str, torch.Tensor]:
    """HF state dict built from an artifact's (dequantized) parameters."""
    state = {}
    for name in our_names(num_layers, qk_norm):
        if artifact.has_parameter(name):
            state[hf_name(name)] = artifact.parameter(name, artifact_shape(artifact, name))
    return state


def artifact_shape(artifact, name: str) -> tuple[int, ...]:
    cfg = artifact.config("text")
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or H // nq
    suffix = name.rsplit("/", 2)
    shapes = {
        "token_embedding": (cfg["vocab_size"], H), "output_head": (cfg["vocab_size"], H),
        "final_norm": (H,), "input_norm": (H,), "post_attention_norm": (H,),
        "query": (nq * D, H), "key": (nkv * D, H), "value": (nkv * D, H), "output": (H, nq * D),
        "query_norm": (D,), "key_norm": (D,), "gate": (I, H), "up": (I, H), "down": (H, I),
    }
    return shapes[suffix[-1]]


def randomize_norms(model: torch.nn.Module, seed: int = 1) -> None:
    """Norm weights initialise to 1; randomise them so a wrong norm formula shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=gen))


def tiny_llama(seed: int = 0, vocab_size: int = 128, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    fields = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  tie_word_embeddings=True, max_position_embeddings=512, rms_norm_eps=1e-5)
    cfg = LlamaConfig(**{**fields, **overrides})
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    randomize_norms(model, seed + 1)
    return model.eval()


def tiny_qwen3(seed: int = 0, vocab_size: int = 128):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=32, tie_word_embeddings=False, max_position_embeddings=512,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    randomize_norms(model, seed + 1)
    return model.eval()


def text_config(model: torch.nn.Module) -> dict:
    """The artifact-style text config of an HF model."""
    return {**model.config.to_dict(), "architectures": [type(model).__name__]}


def error_chains(model, context: int) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """The arithmetic behind the tolerances (`tests.tolerance`): for each layer's K/V write,
    then for the logits, (summed reduction lengths, bf16-stored intermediates) of the longest
    chain. A layer reduces over RMSNorm (H), QKV (H), the q/k norm (D), RoPE (2), the scores
    (D), the softmax sum and P·V (2 × context), the output projection (nq·D), the residual (1),
    RMSNorm (H), gate/up (H), SiLU·up (2), down (I) and the residual (1); in bf16 it stores the
    norm, QKV, the q/k norm and its weight, RoPE (up to the K/V write), then the decoded K/V
    and P as dot operands (CUDA), the attention output, the output projection, the residual,
    the norm, gate/up, SiLU, the product, down and the residual."""
    c = model.cfg
    H, I, D, nq = c.hidden_size, c.intermediate_size, c.head_dim, c.num_heads
    qk_norm = model.layers[0].qk_norm is not None
    to_kv = (2 * H + (D if qk_norm else 0) + 2, 3 + (2 if qk_norm else 0))
    rest = (D + 2 * context + nq * D + 1 + 2 * H + 2 + I + 1, 11)
    done, writes = (0, 0), []
    for _ in model.layers:
        writes.append((done[0] + to_kv[0], done[1] + to_kv[1]))
        done = (writes[-1][0] + rest[0], writes[-1][1] + rest[1])
    return writes, (done[0] + 2 * H, done[1] + 2)  # the final RMSNorm and the head


def forward_rows(model, seqs, drafts):
    """The reference of a verify step: the model's own forward over each sequence's last
    token and its drafts at their positions, logits [Σ (1 + k_i), V] in row order."""
    from ninfer_engine.models import Segment

    rows = [[s.output[-1], *d] for s, d in zip(seqs, drafts)]
    on = model.device
    return model.forward(
        torch.tensor([t for r in rows for t in r], device=on),
        torch.tensor([p for s, r in zip(seqs, rows) for p in range(s.cached, s.cached + len(r))],
                     device=on),
        [Segment(s.cache, s.cached, len(r)) for s, r in zip(seqs, rows)],
        torch.arange(sum(map(len, rows)), device=on))


def copy_pool(src, dst):
    """Every stored K/V component of `src` into `dst`, as stored."""
    for src_layer, dst_layer in zip((*src.k, *src.v), (*dst.k, *dst.v)):
        for a, b in zip(src_layer, dst_layer):
            as_bits(b).copy_(as_bits(a))


@contextmanager
def recorded_writes(storage):
    """The storage's K/V writes recorded as (layer index, is K, slots, rows), not stored."""
    writes = []
    for codec, layers in ((storage.k_codec, storage.k), (storage.v_codec, storage.v)):
        def write(stored, slots, x, layers=layers, is_k=codec is storage.k_codec):
            index = [id(layer) for layer in layers].index(id(stored))
            writes.append((index, is_k, slots.clone(), x.clone()))
        codec.write = write  # instance attribute: shadows the class's method
    try:
        yield writes
    finally:
        del storage.k_codec.write, storage.v_codec.write


def stored_rows(storage, index, is_k, slots):
    """The rows at `slots` of one layer's K or V, decoded to fp64."""
    codec, layers = (storage.k_codec, storage.k) if is_k else (storage.v_codec, storage.v)
    parts = tuple(as_bits(t).index_select(0, slots).view(t.dtype) for t in layers[index])
    return codec.decode(parts, torch.float64)


SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def byte_tokenizer_json() -> str:
    """A byte-level BPE with one token per byte (ids 0-255) and three specials (256-258)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    return tok.to_str()


def _byte_of(ch: str) -> int:
    """Inverse of GPT-2's byte -> printable-character table."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table[ch]


CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def default_resources() -> dict[str, bytes]:
    """Byte tokenizer, ChatML template, a sampling preset with EOS 257."""
    return {
        "tokenizer.json": byte_tokenizer_json().encode(),
        "tokenizer_config.json": json.dumps(
            {"eos_token": "<|im_end|>", "bos_token": "<|endoftext|>"}).encode(),
        "generation_config.json": json.dumps(
            {"eos_token_id": 257, "temperature": 0.7, "top_p": 0.9}).encode(),
        "chat_template.jinja": CHAT_TEMPLATE.encode(),
    }


class FakeArtifact:
    """In-memory stand-in for `Artifact`: config, weights and resources."""

    def __init__(self, model: torch.nn.Module, name: str | None = "tiny-test",
                 resources: dict[str, bytes] | None = None) -> None:
        self.name = name
        self._config = text_config(model)
        self._weights = DictWeights.from_hf(model)
        self._resources = resources if resources is not None else default_resources()

    def config(self, component: str = "text") -> dict:
        return dict(self._config)

    def has_parameter(self, name: str) -> bool:
        return self._weights.has_parameter(name)

    def parameter(self, name, shape, dtype=torch.float32):
        return self._weights.parameter(name, shape, dtype)

    def has_resource(self, role: str) -> bool:
        return role in self._resources

    def resource(self, role: str) -> bytes:
        return self._resources[role]


@contextmanager
def cuda_syncs():
    """Within: torch's CUDA sync debug mode; the list it yields gets, on exit, the message of
    every call that made the host wait for the device (a `.tolist()`, a blocking copy...), after
    the Python line that made it."""
    found: list[str] = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode("default")
    found += [f"{w.filename}:{w.lineno}: {w.message}" for w in seen
              if "called a synchronizing" in str(w.message)]


FRESH_PROCESS = "NINFER_TEST_FRESH_PROCESS"


def fresh_process(test):
    """Run `test` (no fixtures) in a pytest process of its own and take its result: Triton
    compiles a variant once a process, so in an xdist worker where an earlier test compiled it
    a check that nothing compiles would pass by luck (the H200's warm-up checks did)."""
    @functools.wraps(test)
    def run():
        if os.environ.get(FRESH_PROCESS):
            return test()
        # (unwrapped: a decorator's wrapper, torch.inference_mode's, has torch's file)
        node = f"{inspect.getfile(inspect.unwrap(test))}::{test.__name__}"
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-o", "addopts=", node], env={**os.environ, FRESH_PROCESS: "1"},
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-4000:]
    return run
