"""Tokenizer resources from GGUF metadata: an HF ``tokenizer.json`` and its companions.

GGUF stores a gpt2-style byte-level BPE as token strings, merges and token types; the
pre-tokenizer is named by ``tokenizer.ggml.pre`` and has to be rebuilt from that name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from .errors import ArtifactError

CONTROL, USER_DEFINED = 3, 4


def _byte_level() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)


# tokenizer.ggml.pre → the HF pre-tokenizer it stands for.
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), _byte_level()]
    ),
    "gpt-2": _byte_level,
}


@dataclass(frozen=True)
class GgufVocab:
    """The tokenizer part of a GGUF file's metadata."""

    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    eot_id: int | None
    add_bos: bool
    chat_template: str | None
    max_length: int


def build_tokenizer(vocab: GgufVocab) -> Tokenizer:
    """A byte-level BPE ``Tokenizer`` whose CONTROL / USER_DEFINED tokens are added specials."""
    if vocab.model != "gpt2":
        raise ArtifactError(
            f'unsupported GGUF tokenizer model "{vocab.model}" (only gpt2 byte-level BPE)'
        )
    if vocab.pre not in PRE_TOKENIZERS:
        raise ArtifactError(f'unsupported GGUF pre-tokenizer "{vocab.pre}"')
    ids = {token: index for index, token in enumerate(vocab.tokens)}
    if len(ids) != len(vocab.tokens):
        raise ArtifactError("GGUF vocabulary has duplicate tokens")
    merges = [tuple(merge.split(" ", 1)) for merge in vocab.merges]
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[vocab.pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(
        [AddedToken(vocab.tokens[i], special=True, normalized=False) for i in special_ids(vocab)]
    )
    return tokenizer


def special_ids(vocab: GgufVocab) -> list[int]:
    return [i for i, kind in enumerate(vocab.token_types) if kind in (CONTROL, USER_DEFINED)]


def resources(vocab: GgufVocab) -> dict[str, bytes]:
    """The text component's resources: role → bytes."""
    tokenizer = build_tokenizer(vocab)
    token = lambda index: None if index is None else vocab.tokens[index]
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": token(vocab.bos_id),
        "eos_token": token(vocab.eos_id),
        "pad_token": token(vocab.pad_id),
        "add_bos_token": vocab.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": vocab.max_length,
        "added_tokens_decoder": {
            str(i): {
                "content": vocab.tokens[i],
                "special": True,
                "normalized": False,
                "lstrip": False,
                "rstrip": False,
                "single_word": False,
            }
            for i in special_ids(vocab)
        },
    }
    eos_ids = [i for i in dict.fromkeys((vocab.eos_id, vocab.eot_id)) if i is not None]
    generation = {"bos_token_id": vocab.bos_id, "eos_token_id": eos_ids}
    if vocab.pad_id is not None:
        generation["pad_token_id"] = vocab.pad_id
    out = {
        "tokenizer.json": tokenizer.to_str().encode(),
        "tokenizer_config.json": _json(config),
        "generation_config.json": _json(generation),
    }
    if vocab.chat_template:
        out["chat_template.jinja"] = vocab.chat_template.encode()
    return out


def _json(value: dict) -> bytes:
    return json.dumps(value, indent=2, ensure_ascii=False).encode() + b"\n"
