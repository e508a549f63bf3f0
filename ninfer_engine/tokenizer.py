"""Text <-> token ids for an artifact, and a UTF-8-safe incremental detokenizer.

`Tokenizer` wraps the Hugging Face `tokenizers` runtime over the artifact's `tokenizer.json`;
special-token strings and end-of-sequence ids come from `tokenizer_config.json` and
`generation_config.json`. `IncrementalDetokenizer` turns a growing id sequence into text deltas
that never split a UTF-8 character.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

REPLACEMENT = "\ufffd"


def _token_content(value: Any) -> str | None:
    """tokenizer_config stores special tokens either as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


class Tokenizer:
    """Encode/decode for one model. `encode` adds BOS only when the config asks for it."""

    def __init__(
        self,
        backend: HFTokenizer,
        eos_token_ids: Sequence[int],
        bos_token: str | None = None,
        eos_token: str | None = None,
        add_bos: bool = False,
    ) -> None:
        self.backend = backend
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_token_ids))
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = backend.token_to_id(bos_token) if bos_token else None
        self.add_bos = add_bos and self.bos_token_id is not None
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_json(
        cls,
        tokenizer_json: bytes | str,
        tokenizer_config: dict | None = None,
        generation_config: dict | None = None,
    ) -> Tokenizer:
        """Build from the raw `tokenizer.json` plus the two optional config dicts."""
        text = tokenizer_json.decode() if isinstance(tokenizer_json, bytes) else tokenizer_json
        backend = HFTokenizer.from_str(text)
        tok_cfg = tokenizer_config or {}
        gen_cfg = generation_config or {}
        # added_tokens_decoder may list specials that tokenizer.json lacks (Qwen token domain)
        known = backend.get_vocab(with_added_tokens=True)
        extra = [
            (int(i), entry["content"])
            for i, entry in (tok_cfg.get("added_tokens_decoder") or {}).items()
            if entry.get("content") not in known
        ]
        for token_id, content in sorted(extra):
            backend.add_special_tokens([AddedToken(content, special=True)])
            if backend.token_to_id(content) != token_id:
                raise ValueError(f"added token {content!r} cannot take id {token_id}")
        bos_token = _token_content(tok_cfg.get("bos_token"))
        eos_token = _token_content(tok_cfg.get("eos_token"))
        eos_ids = _as_ids(gen_cfg.get("eos_token_id"))
        if eos_token is not None and backend.token_to_id(eos_token) is not None:
            eos_ids.append(backend.token_to_id(eos_token))
        return cls(
            backend,
            eos_ids,
            bos_token=bos_token,
            eos_token=eos_token,
            add_bos=bool(tok_cfg.get("add_bos_token", False)),
        )

    @classmethod
    def from_artifact(cls, artifact: Any) -> Tokenizer:
        """Build from the artifact's tokenizer, tokenizer-config and generation-config resources."""
        return cls.from_json(
            artifact.resource("tokenizer.json"),
            _optional_json(artifact, "tokenizer_config.json"),
            _optional_json(artifact, "generation_config.json"),
        )

    def encode(self, text: str) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [self.bos_token_id, *ids] if self.add_bos else ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text in one call that releases the GIL (the runtime's threads)."""
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        lead = [self.bos_token_id] if self.add_bos else []
        return [lead + encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _optional_json(artifact: Any, role: str) -> dict | None:
    if not artifact.has_resource(role):
        return None
    data = artifact.resource(role)
    return json.loads(data) if data else None


class IncrementalDetokenizer:
    """Yields only complete text as ids arrive (the prefix/read-offset scheme of TGI and vLLM).

    Decoding a short window that starts a few tokens back keeps tokenizer-specific spacing right;
    text that ends in U+FFFD is an incomplete UTF-8 character and is held until more ids arrive
    or `finish()` releases it as U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer, context_ids: Sequence[int] = ()) -> None:
        self._tokenizer = tokenizer
        # a few prompt ids of context so the first output token decodes with its leading space
        self._ids: list[int] = list(context_ids[-4:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=True)

    def add(self, token_ids: Sequence[int]) -> str:
        """Append ids; return the newly complete text (possibly empty)."""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text):]

    def finish(self) -> str:
        """Release held-back text; impossible byte sequences come out as U+FFFD."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text):]
